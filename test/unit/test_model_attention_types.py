"""Per-layer draft attention types: `layer_types` / `sliding_window` / `is_causal`.

Semantics follow sglang 0.5.23 (`srt/models/dflash.py`
`_get_dflash_layer_attention_params`, `srt/speculative/dflash_utils.py`
`get_dflash_attention_sliding_window_size`): a causal sliding layer shows keys
with q_pos - w <= k_pos <= q_pos, w = sliding_window - 1 (the torch_native
backend's `_make_sliding_window_mask`); a non-causal one (ENCODER_ONLY) keys with
|k_pos - q_pos| <= w (FlashAttention's `window_size = (w, w)`). transformers'
Qwen3Config keeps `sliding_window` only with `use_sliding_window: true` and fills
absent `layer_types` from `max_window_layers`.
"""

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.config import DrafterConfig, parse_drafter_config  # noqa: E402
from sglang_dflash.model import DFlashDrafter  # noqa: E402
from sglang_dflash.train.objective import draft_hidden_for_anchors  # noqa: E402

torch.set_num_threads(1)

H, V = 32, 96
TARGET = dict(target_hidden_size=64, target_vocab_size=1024, target_num_layers=4)


# ---------------------------------------------------------------------------
# Config parsing
# ---------------------------------------------------------------------------


def raw_config(**top):
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 1024, "num_target_layers": 4,
        "dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token_id": 3},
    }
    cfg.update(top)
    return cfg


def test_no_layer_types_is_non_causal_full():
    cfg = parse_drafter_config(raw_config(), **TARGET)
    assert cfg.layer_causal == (False, False) and cfg.layer_window == (None, None)
    assert not cfg.has_masked_layers
    # is_causal: false changes nothing; sliding_window without sliding layers is ignored.
    cfg2 = parse_drafter_config(raw_config(is_causal=False, sliding_window=4), **TARGET)
    assert (cfg2.layer_causal, cfg2.layer_window) == ((False, False), (None, None))


@pytest.mark.parametrize("is_causal,expected", [(None, False), (False, False), (True, True)])
def test_full_attention_causal_only_with_is_causal(is_causal, expected):
    raw = raw_config(layer_types=["full_attention"] * 2)
    if is_causal is not None:
        raw["is_causal"] = is_causal
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.layer_causal == (expected, expected)
    assert cfg.layer_window == (None, None)


@pytest.mark.parametrize("is_causal,expected", [(None, True), (True, True), (False, False)])
def test_sliding_attention_window_minus_one(is_causal, expected):
    raw = raw_config(layer_types=["sliding_attention"] * 2, sliding_window=2048,
                     use_sliding_window=True)
    if is_causal is not None:
        raw["is_causal"] = is_causal
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.layer_causal == (expected, expected)
    assert cfg.layer_window == (2047, 2047)
    assert cfg.has_masked_layers


def test_qwen_config_drops_window_without_use_sliding_window():
    for swa in (None, False):
        raw = raw_config(layer_types=["sliding_attention"] * 2, sliding_window=2048)
        if swa is not None:
            raw["use_sliding_window"] = swa
        with pytest.raises(ValueError, match="sliding_window is required.*use_sliding_window"):
            parse_drafter_config(raw, **TARGET)
    # Another config class keeps the window as written.
    raw = raw_config(layer_types=["sliding_attention"] * 2, sliding_window=4, model_type="llama")
    assert parse_drafter_config(raw, **TARGET).layer_window == (3, 3)
    # use_sliding_window with the key absent: the Qwen3Config default window, 4096.
    raw = raw_config(layer_types=["sliding_attention"] * 2, use_sliding_window=True)
    assert parse_drafter_config(raw, **TARGET).layer_window == (4095, 4095)


@pytest.mark.parametrize("top,causal,window", [
    (dict(use_sliding_window=True, sliding_window=8), (False, False), (None, None)),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
     (False, True), (None, 7)),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, is_causal=False),
     (False, False), (7, 7)),
    (dict(is_causal=True), (True, True), (None, None)),
    (dict(sliding_window=8, max_window_layers=0), (False, False), (None, None)),
])
def test_qwen_layer_types_derived_like_transformers(top, causal, window):
    """No layer_types: Qwen3Config fills them, sliding from max_window_layers on."""
    cfg = parse_drafter_config(raw_config(**top), **TARGET)
    assert (cfg.layer_causal, cfg.layer_window) == (causal, window)


def test_mixed_layers_and_text_config_fallbacks():
    raw = raw_config(layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                     use_sliding_window=True)
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.layer_causal == (True, False) and cfg.layer_window == (4, None)
    # Backbone keys under text_config; layer_types there, sliding_window at the top
    # level (sglang reads text_config first, then the top level, for both).
    raw = raw_config()
    text = {k: raw.pop(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "head_dim",
                                    "vocab_size")}
    text["layer_types"] = ["full_attention", "sliding_attention"]
    raw["text_config"] = text
    raw["sliding_window"] = 1
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.layer_causal == (False, True) and cfg.layer_window == (None, 0)


REJECTED = [
    (dict(layer_types=["full_attention", "chunked_attention"]),
     ["layer_types[1] = 'chunked_attention'", "not a supported layer type"]),
    (dict(layer_types=["sliding_attention", "full_attention"]),
     ["sliding_window is required", "layer_types"]),
    (dict(layer_types=["full_attention"] * 3), ["layer_types", "one entry per draft layer"]),
    (dict(layer_types="full_attention"), ["layer_types"]),
    (dict(layer_types=["sliding_attention"] * 2, sliding_window=0, use_sliding_window=True),
     ["sliding_window = 0", ">= 1"]),
    (dict(layer_types=["sliding_attention"] * 2, sliding_window=8.0, use_sliding_window=True),
     ["sliding_window = 8.0", "int"]),
    (dict(use_sliding_window="yes"), ["use_sliding_window = 'yes'", "bool"]),
    # Without a config class that fills layer_types, sglang ignores these keys.
    (dict(is_causal=True, model_type="llama"), ["is_causal = True", "layer_types"]),
    (dict(use_sliding_window=True, sliding_window=8, model_type="llama"),
     ["use_sliding_window", "layer_types"]),
    (dict(is_causal="yes", layer_types=["full_attention"] * 2), ["is_causal = 'yes'", "bool"]),
]


@pytest.mark.parametrize("top,words", REJECTED, ids=[w[0][:40] for _, w in REJECTED])
def test_rejections_name_the_key(top, words):
    with pytest.raises(ValueError) as info:
        parse_drafter_config(raw_config(**copy.deepcopy(top)), **TARGET)
    message = str(info.value)
    assert message.startswith("drafter config: ")
    for word in words:
        assert word in message, (word, message)


def test_dataclass_validates_layer_attention():
    base = dict(parse_drafter_config(raw_config(), **TARGET).__dict__)
    with pytest.raises(ValueError, match="layer_causal"):
        DrafterConfig(**{**base, "layer_causal": (True,)})
    with pytest.raises(ValueError, match=r"layer_window\[0\] = 2.5"):
        DrafterConfig(**{**base, "layer_window": (2.5, None)})
    non_causal = DrafterConfig(**{**base, "layer_window": (3, None)})  # a non-causal window
    assert non_causal.layer_causal == (False, False) and non_causal.has_masked_layers
    with pytest.raises(ValueError, match=r"layer_window\[1\] = -1"):
        DrafterConfig(**{**base, "layer_causal": (True, True), "layer_window": (3, -1)})
    cfg = DrafterConfig(**{**base, "layer_causal": [True, False], "layer_window": [2, None]})
    assert cfg.layer_causal == (True, False) and cfg.layer_window == (2, None)


def test_checkpoint_round_trip_keeps_layer_attention(tmp_path):
    from sglang_dflash.checkpoint import load_drafter, save_drafter

    raw = raw_config(layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                     use_sliding_window=True, intermediate_size=32, hidden_size=32,
                     vocab_size=64)
    cfg = parse_drafter_config(raw)
    save_drafter(DFlashDrafter(cfg), raw, tmp_path)
    loaded = load_drafter(tmp_path, target_hidden_size=32, target_vocab_size=64,
                          target_num_layers=4)
    assert loaded.cfg.layer_causal == (True, False) and loaded.cfg.layer_window == (15, None)
    assert loaded.layers[0].self_attn.window == 15 and loaded.layers[1].self_attn.window is None


# ---------------------------------------------------------------------------
# Model behaviour
# ---------------------------------------------------------------------------


def make_cfg(layers=1, causal=None, window=None, block=4) -> DrafterConfig:
    return DrafterConfig(
        version=1, hidden_size=H, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=512, vocab_size=V, block_size=block,
        target_layer_ids=(0, 2), num_target_layers=4, mask_token_id=V - 1,
        layer_causal=causal, layer_window=window)


def make_model(cfg: DrafterConfig, seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.double().eval()


def inputs(cfg, ctx_lens, seed=0):
    """Context K/V from random target features; block at positions L_b .. L_b + B - 1."""
    gen = torch.Generator().manual_seed(seed)
    bs, width, block = len(ctx_lens), max(ctx_lens), cfg.block_size
    feats = torch.randn(bs, width, cfg.num_context_features * H, generator=gen).double()
    embeds = torch.randn(bs, block, H, generator=gen).double()
    valid = torch.arange(width)[None, :] < torch.tensor(ctx_lens)[:, None]
    positions = torch.tensor(ctx_lens)[:, None] + torch.arange(block)[None, :]
    return feats, embeds, positions, valid


def run(model, feats, embeds, positions, valid):
    bs, width = valid.shape
    ctx = model.context_features(feats.flatten(0, 1))
    k, v = model.context_kv(ctx, torch.arange(width).repeat(bs))
    k, v = k.unflatten(1, (bs, width)), v.unflatten(1, (bs, width))
    return model.forward_block(embeds, positions, k, v, valid), (k, v)


def test_causal_layer_hides_later_block_tokens():
    later = 3  # perturb block slot 3; slots 0..2 must not move in a causal layer
    for causal, moves in ((True, False), (False, True)):
        cfg = make_cfg(layers=2, causal=(causal, causal), window=(None, None))
        model = make_model(cfg)
        feats, embeds, positions, valid = inputs(cfg, [6])
        bumped = embeds.clone()
        bumped[0, later] += 1.0
        with torch.no_grad():
            a, _ = run(model, feats, embeds, positions, valid)
            b, _ = run(model, feats, bumped, positions, valid)
        early_moved = not torch.allclose(a[0, :later], b[0, :later], rtol=0, atol=1e-12)
        assert early_moved == moves, (causal, (a - b).abs().amax(-1))
        assert not torch.allclose(a[0, later], b[0, later])


def test_sliding_window_limits_context_keys():
    # sliding_window = 3 -> w = 2: the query at position 8 sees positions 6, 7, 8.
    cfg = make_cfg(layers=1, causal=(True,), window=(2,))
    model = make_model(cfg)
    feats, embeds, positions, valid = inputs(cfg, [8])
    with torch.no_grad():
        base, (k, v) = run(model, feats, embeds, positions, valid)

        def bumped_at(column):
            k2, v2 = k.clone(), v.clone()
            k2[:, :, column] += 1.0
            v2[:, :, column] += 1.0
            return model.forward_block(embeds, positions, k2, v2, valid)

        outside = bumped_at(5)  # 5 < 8 + i - 2 for every block query i
        torch.testing.assert_close(outside, base, rtol=0, atol=0)
        inside = bumped_at(7)  # seen by queries 0 (pos 8) and 1 (pos 9) only
        assert not torch.allclose(inside[0, 0], base[0, 0])
        assert not torch.allclose(inside[0, 1], base[0, 1])
        torch.testing.assert_close(inside[0, 2:], base[0, 2:], rtol=0, atol=0)
        # A full non-causal layer sees column 5.
        full = make_model(make_cfg(layers=1))
        a, (fk, fv) = run(full, feats, embeds, positions, valid)
        fk[:, :, 5] += 1.0
        assert not torch.allclose(full.forward_block(embeds, positions, fk, fv, valid), a)


def test_non_causal_window_is_two_sided():
    """is_causal false + sliding_window 3 (w = 2): the query at position p sees
    positions p - 2 .. p + 2, block keys after it included."""
    cfg = make_cfg(layers=1, causal=(False,), window=(2,), block=6)
    model = make_model(cfg)
    feats, embeds, positions, valid = inputs(cfg, [8])  # block at positions 8..13
    with torch.no_grad():
        base, (k, v) = run(model, feats, embeds, positions, valid)
        for slot in range(cfg.block_size):
            bumped = embeds.clone()
            bumped[0, slot] += 1.0  # changes the block key / value at position 8 + slot
            moved = run(model, feats, bumped, positions, valid)[0] - base
            for query in range(cfg.block_size):
                sees = abs(slot - query) <= 2
                assert bool(moved[0, query].abs().amax() > 0) == sees, (slot, query)
        k[:, :, 6] += 1.0  # context position 6: only query position 8 (slot 0) reaches it
        v[:, :, 6] += 1.0
        ctx_moved = model.forward_block(embeds, positions, k, v, valid) - base
        assert [bool(ctx_moved[0, q].abs().amax() > 0) for q in range(6)] == [True] + [False] * 5


def test_window_zero_sees_only_itself():
    """w = 0 (sliding_window 1): each query reads only its own value row; no NaN rows
    even with no valid context."""
    cfg = make_cfg(layers=1, causal=(True,), window=(0,))
    attn = make_model(cfg).layers[0].self_attn
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, H, generator=gen).double()
    positions = torch.tensor([[5, 6, 7, 8], [0, 1, 2, 3]])
    ctx_k = torch.randn(2, 5, 2, 8, generator=gen).double()
    ctx_v = torch.randn(2, 5, 2, 8, generator=gen).double()
    valid = torch.tensor([[True] * 5, [False] * 5])
    with torch.no_grad():
        out = attn(x, positions, ctx_k, ctx_v, valid)
        _, v = attn.key_value(x, positions)  # [2, 4, kvh, d]
        group = attn.num_heads // attn.num_kv_heads
        expected = attn.o_proj(v.repeat_interleave(group, dim=2).flatten(-2))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# forward_block against a naive per-request, per-query loop (float64)
# ---------------------------------------------------------------------------


def naive_rms(x, w, eps=1e-6):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def naive_rope(x, pos, theta=10000.0):
    """x [S, heads, d], pos [S]: rotate channel pairs (j, j + d/2)."""
    d = x.shape[-1]
    out = x.clone()
    for j in range(d // 2):
        angle = pos.double() * theta ** (-2.0 * j / d)
        c, s = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        a, b = x[..., j], x[..., j + d // 2]
        out[..., j], out[..., j + d // 2] = a * c - b * s, b * c + a * s
    return out


def naive_layer_attention(p, cfg, causal, window, ctx, ctx_pos, x, x_pos):
    nh, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = naive_rope(naive_rms((x @ p["self_attn.q_proj.weight"].t()).view(-1, nh, d),
                             p["self_attn.q_norm.weight"]), x_pos)
    kv_in, kv_pos = torch.cat((ctx, x)), torch.cat((ctx_pos, x_pos))
    k = naive_rope(naive_rms((kv_in @ p["self_attn.k_proj.weight"].t()).view(-1, kvh, d),
                             p["self_attn.k_norm.weight"]), kv_pos)
    v = (kv_in @ p["self_attn.v_proj.weight"].t()).view(-1, kvh, d)
    out = torch.zeros(x.shape[0], nh, d, dtype=x.dtype)
    for i in range(x.shape[0]):
        qp = int(x_pos[i])
        keys = [j for j in range(kv_in.shape[0])
                if (not causal or int(kv_pos[j]) <= qp)
                and (window is None or int(kv_pos[j]) >= qp - window)
                and (causal or window is None or int(kv_pos[j]) <= qp + window)]
        assert keys, "a query with no visible key"
        for head in range(nh):
            g = head // (nh // kvh)
            scores = torch.stack([q[i, head] @ k[j, g] for j in keys]) / math.sqrt(d)
            weights = torch.softmax(scores, dim=0)
            out[i, head] = sum(w * v[j, g] for w, j in zip(weights, keys))
    return out.flatten(1) @ p["self_attn.o_proj.weight"].t()


def naive_forward(model, feats, embeds, x_pos):
    """One request: feats [n, n*H] at positions 0..n-1, block embeds [B, H] at x_pos."""
    cfg = model.cfg
    sd = {k: t.double() for k, t in model.state_dict().items()}
    ctx = naive_rms(feats @ sd["fc.weight"].t(), sd["hidden_norm.weight"])
    ctx_pos = torch.arange(feats.shape[0])
    h = embeds
    for i in range(cfg.num_hidden_layers):
        p = {k[len(f"layers.{i}."):]: t for k, t in sd.items() if k.startswith(f"layers.{i}.")}
        x = naive_rms(h, p["input_layernorm.weight"])
        h = h + naive_layer_attention(p, cfg, cfg.layer_causal[i], cfg.layer_window[i],
                                      ctx, ctx_pos, x, x_pos)
        x = naive_rms(h, p["post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(x @ p["mlp.gate_proj.weight"].t())
        h = h + (gate * (x @ p["mlp.up_proj.weight"].t())) @ p["mlp.down_proj.weight"].t()
    return naive_rms(h, sd["norm.weight"])


@pytest.mark.parametrize("causal,window", [
    # Layer 0: sliding_attention with sliding_window 4 (w = 3, causal); layer 1: full,
    # non-causal.
    ((True, False), (3, None)),
    # The published DFlash 2 shape (is_causal false, sliding layers), with a window
    # narrower than the block so that its right side matters: w = 1, then w = 2.
    ((False, False), (1, 2)),
])
def test_forward_block_matches_naive_mixed_layers(causal, window):
    # Two requests with different context lengths (the second padded).
    cfg = make_cfg(layers=2, causal=causal, window=window)
    model = make_model(cfg, seed=4)
    ctx_lens = [7, 3]
    feats, embeds, positions, valid = inputs(cfg, ctx_lens, seed=5)
    with torch.no_grad():
        fast, _ = run(model, feats, embeds, positions, valid)
        for b, n in enumerate(ctx_lens):
            slow = naive_forward(model, feats[b, :n], embeds[b], positions[b])
            torch.testing.assert_close(fast[b], slow, rtol=1e-9, atol=1e-9)


def test_training_path_honours_window_and_causality():
    """draft_hidden_for_anchors (all T context columns, p < a valid) equals a
    forward_block over exactly the anchor's context: column p is position p."""
    cfg = make_cfg(layers=2, causal=(True, False), window=(2, None))
    model = make_model(cfg, seed=6)
    embed = torch.nn.Embedding(V, H).double()
    gen = torch.Generator().manual_seed(7)
    seq_len = 12
    feats = torch.randn(1, seq_len, cfg.num_context_features * H, generator=gen).double()
    tokens = torch.randint(0, V - 1, (1, seq_len), generator=gen)
    anchors = torch.tensor([[3, 8]])
    with torch.no_grad():
        hidden = draft_hidden_for_anchors(model, feats, tokens, anchors, embed, V - 1)
        for i, a in enumerate(anchors[0].tolist()):
            block_ids = torch.full((1, cfg.block_size), V - 1)
            block_ids[0, 0] = tokens[0, a]
            block_pos = a + torch.arange(cfg.block_size)[None]
            want, _ = run(model, feats[:, :a], embed(block_ids), block_pos,
                          torch.ones(1, a, dtype=torch.bool))
            torch.testing.assert_close(hidden[i], want[0], rtol=1e-10, atol=1e-10)
