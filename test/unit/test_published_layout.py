"""Golden test: published drafter layouts load and run as sglang 0.5.23 runs them.

Each case writes a small checkpoint in a published layout (the keys and
structure of z-lab's DFlash 2 fixture `dflash2-config.json`, of z-lab's DFlash
v1 drafters and of SpecForge's v1 configs; bf16 safetensors under the published
tensor names, shapes taken from the published header, not from our model),
loads it with `load_drafter` and compares our block hidden states, block
logits, DFlash 2 candidate scores and greedy selector path with `Upstream`
below: a separate plain-torch transcription of sglang 0.5.23's drafter
(`srt/models/dflash.py`: DFlashDecoderLayer.forward with its fused-residual
RMSNorms, DFlashAttention with q/k norm, neox RoPE and RadixAttention over the
draft KV pool, DFlashGroupedConv's `_grouped_conv` over the flattened block
tokens, project_target_hidden, kv_proj_only + apply_k_norm + apply_k_rope for
context K/V, `_transform_unary_logits`, `_score_edges` and the greedy
`sample_path`). It works on flattened tokens and per-request loops, the way
upstream lays a batch out, and calls none of our model code.

Window rule of the reference: a sliding layer's key is visible to a query at
q iff k >= q - w (w = sliding_window - 1) and, when causal, k <= q, else
k <= q + w (FlashAttention's two-sided window for ENCODER_ONLY layers; it is
FlashInfer's one-sided window too whenever w >= block_size - 1).
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.vocab_head import VocabHead  # noqa: E402
from sglang_dflash.checkpoint import load_drafter  # noqa: E402
from sglang_dflash.config import resolve_mask_token_id  # noqa: E402
from sglang_dflash.select import lattice_scores, walk  # noqa: E402

torch.set_num_threads(1)

H, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 32, 4, 2, 16, 48, 128
TARGET_LAYERS = 8


# ---------------------------------------------------------------------------
# Published configs (the fixture's keys; small sizes)
# ---------------------------------------------------------------------------


def dflash2_config(sliding_window=64, rope=None, layers=3, block=8):
    """z-lab/dflash tests/fixtures/dflash2-config.json, shrunk."""
    return {
        "architectures": ["DFlash2DraftModel"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 100, "is_causal": False,
        "dflash_config": {
            "block_size": block, "conv_group_size": 8, "conv_kernel_size": 2,
            "final_logit_softcapping": 20.0, "mask_token_id": 120,
            "output_multiplier": 0.19611613513818404, "selector_rank": 8, "selector_top_k": 6,
            "target_layer_ids": [1, 3, 6],
        },
        "dtype": "bfloat16", "eos_token_id": 101, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN,
        "layer_types": ["sliding_attention"] * layers, "max_position_embeddings": 131072,
        "max_window_layers": layers, "model_type": "qwen3", "num_attention_heads": HEADS,
        "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS,
        "num_target_layers": TARGET_LAYERS, "pad_token_id": 102, "rms_norm_eps": 1e-05,
        "rope_parameters": rope or {"rope_theta": 500000.0, "rope_type": "default"},
        "sliding_window": sliding_window, "tie_word_embeddings": False,
        "transformers_version": "5.15.0", "use_cache": False, "use_sliding_window": True,
        "vocab_size": VOCAB,
    }


def zlab_v1_config(layers=2):
    """z-lab's DFlash v1 drafters (e.g. Qwen3-8B-DFlash-b16), shrunk."""
    return {
        "architectures": ["DFlashDraftModel"], "attention_bias": False,
        "attention_dropout": 0.0, "block_size": 8, "bos_token_id": 100,
        "dflash_config": {"mask_token_id": 121, "target_layer_ids": [1, 5]},
        "dtype": "bfloat16", "eos_token_id": 101, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN,
        "layer_types": ["full_attention"] * layers, "max_position_embeddings": 40960,
        "max_window_layers": layers, "model_type": "qwen3", "num_attention_heads": HEADS,
        "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS,
        "num_target_layers": TARGET_LAYERS, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "transformers_version": "4.57.1", "use_cache": True, "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def specforge_v1_config(layers=3):
    """SpecForge configs/qwen3-8b-dflash.json, shrunk: no dflash_config at all
    (target_layer_ids derived from num_target_layers, mask id from the tokenizer)."""
    cfg = zlab_v1_config(layers)
    del cfg["dflash_config"], cfg["transformers_version"]
    cfg["auto_map"] = {"AutoModel": "modeling_dflash.DFlashDraftModel"}
    return cfg


# ---------------------------------------------------------------------------
# Published tensors (names and shapes from the published safetensors header)
# ---------------------------------------------------------------------------


def published_shapes(cfg: dict, n_features: int) -> dict:
    dc = cfg.get("dflash_config", {})
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {"fc.weight": (H, n_features * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
            p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (FFN, H), p + "mlp.up_proj.weight": (FFN, H),
            p + "mlp.down_proj.weight": (H, FFN), p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
        })
        if dc.get("conv_kernel_size"):
            taps, groups = dc["conv_kernel_size"], H // dc["conv_group_size"]
            for side in ("attention_conv", "mlp_conv"):
                shapes[p + side + ".base_kernel"] = (2, taps, H)
                shapes[p + side + ".kernel_projection.weight"] = (2 * taps * groups, H)
    if dc.get("selector_rank"):
        r = dc["selector_rank"]
        shapes.update({"candidate_selector.hidden_projection.weight": (r, H),
                       "candidate_selector.predecessor_codebook": (VOCAB, r),
                       "candidate_selector.successor_codebook": (VOCAB, r)})
    return shapes


def random_tensor(name: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """bf16 values with O(1) activations: norms near 1, base kernels near the
    identity, linears scaled by fan-in, codebooks O(1)."""
    noise = torch.randn(shape, generator=gen)
    if name.endswith("norm.weight"):
        t = 1.0 + 0.2 * noise
    elif name.endswith("base_kernel"):
        t = 0.3 * noise
        t[:, 0] += 1.0
    elif name.endswith("codebook"):
        t = 0.7 * noise
    else:
        t = noise * (1.5 / math.sqrt(shape[-1]))
    return t.to(torch.bfloat16)


def write_checkpoint(root: Path, cfg: dict, n_features: int, seed: int) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {n: random_tensor(n, s, gen) for n, s in published_shapes(cfg, n_features).items()}
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    return load_file(str(root / "model.safetensors"))


# ---------------------------------------------------------------------------
# Upstream: sglang 0.5.23's drafter forward, transcribed (float64, no our code)
# ---------------------------------------------------------------------------


class Upstream:
    def __init__(self, w: dict, cfg: dict, target_layer_ids: list):
        self.w = {k: v.double() for k, v in w.items()}
        self.cfg = cfg
        self.dc = cfg.get("dflash_config", {})
        self.eps = cfg["rms_norm_eps"]
        self.n_layers = cfg["num_hidden_layers"]
        self.block = self.dc.get("block_size", cfg.get("block_size", 16))
        self.target_layer_ids = target_layer_ids
        rope = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000)}
        self.theta = float(rope["rope_theta"])
        self.pos_scale = 1.0 / rope["factor"] if rope.get("rope_type") == "linear" else 1.0
        types = cfg.get("layer_types")
        is_causal = cfg.get("is_causal")
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        self.layer_attn = []
        for i in range(self.n_layers):  # _get_dflash_layer_attention_params
            t = types[i] if types else "full_attention"
            causal = (t == "sliding_attention") if is_causal is None else is_causal
            self.layer_attn.append((causal, window - 1 if t == "sliding_attention" else -1))

    # -- primitives ------------------------------------------------------------
    def rms(self, x, name, residual=None):
        """sglang RMSNorm.forward_native, with the fused residual add when given."""
        if residual is not None:
            x = x + residual
            residual = x
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]
        return y if residual is None else (y, residual)

    def linear(self, x, name):
        return x @ self.w[name].t()

    def rope(self, x, positions):
        """Neox rotary embedding: pairs (j, j + d/2), cos_sin_cache[pos]."""
        d = x.shape[-1]
        inv_freq = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        freqs = (positions.double() * self.pos_scale)[:, None] * inv_freq
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def qk_norm(self, x, name):
        return self.rms(x, name)  # per head, over head_dim

    # -- context ----------------------------------------------------------------
    def project_target_hidden(self, target_hidden):
        return self.rms(self.linear(target_hidden, "fc.weight"), "hidden_norm.weight")

    def context_kv(self, layer, ctx, positions):
        """kv_proj_only -> apply_k_norm -> apply_k_rope (what the draft pool holds)."""
        p = f"layers.{layer}.self_attn."
        k = self.linear(ctx, p + "k_proj.weight").view(-1, KV_HEADS, HEAD_DIM)
        v = self.linear(ctx, p + "v_proj.weight").view(-1, KV_HEADS, HEAD_DIM)
        return self.rope(self.qk_norm(k, p + "k_norm.weight"), positions), v

    # -- layers -----------------------------------------------------------------
    def grouped_conv(self, x, delta, base):
        """_grouped_conv over flattened tokens; taps never reach the previous block."""
        groups, gs = delta.shape[-1], H // delta.shape[-1]
        taps = base.shape[0]
        blocks = x.unflatten(-1, (groups, gs))
        coef = base.view(1, taps, groups, gs) + delta.unsqueeze(-1)
        out = coef[:, 0] * blocks
        position = torch.arange(x.shape[0]) % self.block
        for tap in range(1, taps):
            shifted = F.pad(blocks[:-tap], (0, 0, 0, 0, tap, 0))
            shifted = torch.where((position >= tap).view(-1, 1, 1), shifted, 0)
            out = out + coef[:, tap] * shifted
        return out.flatten(-2)

    def conv_prepare(self, x, name):
        if name + ".base_kernel" not in self.w:
            return x, None
        taps = self.w[name + ".base_kernel"].shape[1]
        coef = self.linear(x, name + ".kernel_projection.weight").reshape(x.shape[0], 2, taps, -1)
        return self.grouped_conv(x, coef[:, 0], self.w[name + ".base_kernel"][0]), coef[:, 1]

    def conv_finish(self, y, name, coef):
        if coef is None:
            return y
        return self.grouped_conv(y, coef, self.w[name + ".base_kernel"][1])

    def attention(self, layer, x, positions, req_slices, ctx_kv):
        p = f"layers.{layer}.self_attn."
        causal, w = self.layer_attn[layer]
        q = self.linear(x, p + "q_proj.weight").view(-1, HEADS, HEAD_DIM)
        k = self.linear(x, p + "k_proj.weight").view(-1, KV_HEADS, HEAD_DIM)
        v = self.linear(x, p + "v_proj.weight").view(-1, KV_HEADS, HEAD_DIM)
        q = self.rope(self.qk_norm(q, p + "q_norm.weight"), positions)
        k = self.rope(self.qk_norm(k, p + "k_norm.weight"), positions)
        out = torch.zeros_like(q)
        for r, rows in enumerate(req_slices):  # one request: its pool rows + its block
            ck, cv, cpos = ctx_kv[r][layer]
            keys, values = torch.cat((ck, k[rows])), torch.cat((cv, v[rows]))
            kpos = torch.cat((cpos, positions[rows]))
            for i, qi in enumerate(range(rows.start, rows.stop)):
                qp = int(positions[qi])
                visible = torch.ones_like(kpos, dtype=torch.bool)
                if w >= 0:
                    visible &= kpos >= qp - w
                    visible &= (kpos <= qp) if causal else (kpos <= qp + w)
                elif causal:
                    visible &= kpos <= qp
                for h in range(HEADS):
                    g = h // (HEADS // KV_HEADS)
                    scores = (keys[visible, g] @ q[qi, h]) * HEAD_DIM ** -0.5
                    out[qi, h] = torch.softmax(scores, 0) @ values[visible, g]
        return self.linear(out.flatten(1), p + "o_proj.weight")

    def mlp(self, layer, x):
        p = f"layers.{layer}.mlp."
        gate, up = self.linear(x, p + "gate_proj.weight"), self.linear(x, p + "up_proj.weight")
        return self.linear(F.silu(gate) * up, p + "down_proj.weight")

    def decoder_layer(self, i, positions, hidden, residual, req_slices, ctx_kv):
        p = f"layers.{i}."
        if residual is None:
            residual, hidden = hidden, self.rms(hidden, p + "input_layernorm.weight")
        else:
            hidden, residual = self.rms(hidden, p + "input_layernorm.weight", residual)
        hidden, kernel = self.conv_prepare(hidden, p + "attention_conv")
        attn = self.attention(i, hidden, positions, req_slices, ctx_kv)
        attn = self.conv_finish(attn, p + "attention_conv", kernel)
        hidden, residual = self.rms(attn, p + "post_attention_layernorm.weight", residual)
        hidden, kernel = self.conv_prepare(hidden, p + "mlp_conv")
        hidden = self.conv_finish(self.mlp(i, hidden), p + "mlp_conv", kernel)
        return hidden, residual

    def forward(self, target_hidden_per_req, block_embeds_per_req):
        """Requests with contexts at 0..L_r-1 and blocks at L_r..L_r+B-1 -> [sum B, H]."""
        ctx_kv, positions, slices, start = [], [], [], 0
        for feats in target_hidden_per_req:
            ctx = self.project_target_hidden(feats)
            cpos = torch.arange(feats.shape[0])
            ctx_kv.append([(*self.context_kv(i, ctx, cpos), cpos) for i in range(self.n_layers)])
            positions.append(feats.shape[0] + torch.arange(self.block))
            slices.append(slice(start, start + self.block))
            start += self.block
        hidden, residual = torch.cat(block_embeds_per_req), None
        positions = torch.cat(positions)
        for i in range(self.n_layers):
            hidden, residual = self.decoder_layer(i, positions, hidden, residual, slices, ctx_kv)
        hidden, _ = self.rms(hidden, "norm.weight", residual)
        return hidden

    # -- DFlash 2 selector -------------------------------------------------------
    def candidates(self, hidden, lm_head):
        """compute_candidates: top-K of the target head, then _transform_unary_logits."""
        vals, ids = torch.topk(hidden @ lm_head.t(), self.dc["selector_top_k"], dim=-1)
        unary = vals * self.dc.get("output_multiplier", 1.0)
        cap = float(self.dc.get("final_logit_softcapping") or 0.0)
        if cap > 0:
            unary = torch.tanh(unary / cap) * cap
        return ids, unary

    def lattice(self, ids, unary, hidden, anchors):
        """build_lattice / _score_edges: [b, slots, K(pred), K(cand)]."""
        k = ids.shape[-1]
        proj = self.linear(hidden, "candidate_selector.hidden_projection.weight")
        keys = self.w["candidate_selector.successor_codebook"][ids]
        pred_ids = torch.cat([anchors[:, None, None].expand(-1, 1, k), ids[:, :-1]], dim=1)
        preds = self.w["candidate_selector.predecessor_codebook"][pred_ids]
        return unary[:, :, None] + torch.einsum("blpr,blcr->blpc", preds * proj[:, :, None], keys)

    @staticmethod
    def greedy_path(ids, scores):
        """sample_path for greedy rows: argmax of slot 0, then follow the argmax maps."""
        index = scores[:, 0, 0].argmax(-1)
        path = [index]
        maps = scores[:, 1:].argmax(-1)
        for edge in range(scores.shape[1] - 1):
            index = maps[:, edge].gather(-1, index[:, None])[:, 0]
            path.append(index)
        return ids.gather(-1, torch.stack(path, 1)[..., None])[..., 0]


# ---------------------------------------------------------------------------
# Running ours the way the worker does
# ---------------------------------------------------------------------------


def inputs(n_features, ctx_lens, block, seed):
    gen = torch.Generator().manual_seed(seed)
    feats = [torch.randn(n, n_features * H, generator=gen, dtype=torch.float64) for n in ctx_lens]
    embeds = [torch.randn(block, H, generator=gen, dtype=torch.float64) for _ in ctx_lens]
    lm_head = torch.randn(VOCAB, H, generator=gen, dtype=torch.float64) * 2.0
    return feats, embeds, lm_head


def ours_forward(drafter, feats, embeds):
    """Pad contexts to one width; context column j holds position j."""
    width, bs, block = max(f.shape[0] for f in feats), len(feats), embeds[0].shape[0]
    n_layers, kvh, d = drafter.cfg.num_hidden_layers, drafter.cfg.num_key_value_heads, HEAD_DIM
    ctx_k = torch.zeros(n_layers, bs, width, kvh, d, dtype=torch.float64)
    ctx_v = torch.zeros_like(ctx_k)
    valid = torch.zeros(bs, width, dtype=torch.bool)
    for b, f in enumerate(feats):
        k, v = drafter.context_kv(drafter.context_features(f), torch.arange(f.shape[0]))
        ctx_k[:, b, : f.shape[0]], ctx_v[:, b, : f.shape[0]] = k, v
        valid[b, : f.shape[0]] = True
    positions = torch.stack([f.shape[0] + torch.arange(block) for f in feats])
    return drafter.forward_block(torch.stack(embeds), positions, ctx_k, ctx_v, valid)


def check_backbone(tmp_path, cfg, target_layer_ids, seed, ctx_lens=(11, 5)):
    n = len(target_layer_ids)
    weights = write_checkpoint(tmp_path, cfg, n, seed)
    drafter = load_drafter(tmp_path, target_hidden_size=H, target_vocab_size=VOCAB,
                           target_num_layers=TARGET_LAYERS, dtype=torch.float64)
    assert list(drafter.cfg.target_layer_ids) == target_layer_ids
    upstream = Upstream(weights, cfg, target_layer_ids)
    feats, embeds, lm_head = inputs(n, list(ctx_lens), drafter.cfg.block_size, seed + 1)
    with torch.no_grad():
        ours = ours_forward(drafter, feats, embeds)
    want = upstream.forward(feats, embeds).view_as(ours)
    torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-9)
    # Block logits through the target head (draft positions 1..B-1).
    torch.testing.assert_close(ours[:, 1:] @ lm_head.t(), want[:, 1:] @ lm_head.t(),
                               rtol=1e-9, atol=1e-9)
    return drafter, upstream, ours, lm_head


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sliding_window,rope", [
    (64, None),  # the published shape: window wider than the block
    (3, None),  # w = 2 < B - 1: the window's right side matters
    (64, {"rope_theta": 500000.0, "rope_type": "linear", "factor": 2.0}),
], ids=["published", "narrow-window", "linear-rope"])
def test_dflash2_published_layout_matches_upstream(tmp_path, sliding_window, rope):
    cfg = dflash2_config(sliding_window=sliding_window, rope=rope)
    drafter, upstream, ours, lm_head = check_backbone(tmp_path, cfg, [1, 3, 6], seed=7)
    c = drafter.cfg
    assert c.version == 2 and c.layer_causal == (False,) * 3
    assert c.layer_window == (sliding_window - 1,) * 3 and c.dtype == "bfloat16"
    assert c.rope_theta == 500000.0 and c.final_logit_softcapping == 20.0
    assert c.output_multiplier == 0.19611613513818404 and c.mask_token_id == 120

    # Candidate scores and the greedy selector path, for drafted positions 1..B-1.
    hidden, anchors = ours[:, 1:], torch.tensor([17, 42])
    ids, unary = upstream.candidates(hidden, lm_head)
    sel = drafter.candidate_selector
    cands = VocabHead.whole(lm_head, c.vocab_size).topk(
        hidden, c.selector_top_k, output_multiplier=c.output_multiplier,
        softcap=c.final_logit_softcapping)
    assert torch.equal(cands.ids, ids)
    torch.testing.assert_close(cands.unary.double(), unary, rtol=1e-5, atol=1e-5)
    assert unary.abs().max() > 2.0  # the softcap is exercised, not idle
    scores = lattice_scores(cands, hidden, anchors, sel.predecessor_codebook,
                            sel.successor_codebook, sel.hidden_projection.weight)
    want_scores = upstream.lattice(ids, unary, hidden, anchors)
    torch.testing.assert_close(scores.double(), want_scores, rtol=1e-5, atol=1e-4)
    path = walk(scores, cands.ids, torch.ones(2), torch.ones(2, dtype=torch.bool),
                torch.zeros(2, c.block_size - 1))
    assert torch.equal(path.tokens, Upstream.greedy_path(ids, want_scores))


def test_zlab_v1_layout_matches_upstream(tmp_path):
    drafter, *_ = check_backbone(tmp_path, zlab_v1_config(), [1, 5], seed=11)
    c = drafter.cfg
    assert c.version == 1 and c.block_size == 8 and c.mask_token_id == 121
    assert c.layer_causal == (False, False) and c.layer_window == (None, None)
    assert c.rope_theta == 1e6 and c.rope_scaling is None


def test_specforge_v1_layout_matches_upstream(tmp_path):
    # No target_layer_ids: build_target_layer_ids(8, 3) = evenly from 1 to L - 3.
    layers = 3
    derived = [round(1 + i * (TARGET_LAYERS - 4) / (layers - 1)) for i in range(layers)]
    drafter, *_ = check_backbone(tmp_path, specforge_v1_config(layers), derived, seed=13)
    assert drafter.cfg.mask_token_id is None  # resolved from the target tokenizer
    assert resolve_mask_token_id(drafter.cfg, {"<|MASK|>": 126, "a": 0}, VOCAB) == 126


def test_published_tensor_names_are_exactly_ours(tmp_path):
    cfg = dflash2_config()
    write_checkpoint(tmp_path, cfg, 3, seed=1)
    drafter = load_drafter(tmp_path, target_hidden_size=H, target_vocab_size=VOCAB,
                           target_num_layers=TARGET_LAYERS)
    want = published_shapes(cfg, 3)
    assert {n: tuple(t.shape) for n, t in drafter.state_dict().items()} == want
