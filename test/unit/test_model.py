"""The plain-torch drafter: weight names, conv, attention semantics, KV injection."""

import math
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.config import DrafterConfig, RopeScaling  # noqa: E402
from sglang_dflash.model import (  # noqa: E402
    DFlashDrafter,
    GroupedConv,
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    rope_magnitude,
)

torch.set_num_threads(1)

H, V = 32, 96


# sglang's Laguna drafter (DFlashLagunaForCausalLM): v1 plus attention gates and context norms.
LAGUNA = {"laguna-per-head": dict(attention_gate="per-head", laguna_context=True),
          "laguna-per-element": dict(attention_gate="per-element", laguna_context=True)}


def make_cfg(version=1, layers=2, conv=False, **kw) -> DrafterConfig:
    if version in LAGUNA:
        return make_cfg(1, layers, conv, **LAGUNA[version], **kw)
    extra = {}
    if conv or version == 2:
        extra.update(conv_kernel_size=2, conv_group_size=8)
    if version == 2:
        extra.update(selector_rank=4, selector_top_k=5)
    extra.update(kw)
    return DrafterConfig(
        version=version, hidden_size=H, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=512, vocab_size=V, block_size=4,
        target_layer_ids=(0, 2), num_target_layers=4, mask_token_id=V - 1, **extra)


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter (norms, convs included) so nothing is an identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.eval()


def published_names(cfg: DrafterConfig) -> set:
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(cfg.num_hidden_layers):
        names |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        names |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        names |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        names |= {f"layers.{i}.{p}_layernorm.weight" for p in ("input", "post_attention")}
        if cfg.has_conv:
            for side in ("attention", "mlp"):
                names |= {f"layers.{i}.{side}_conv.base_kernel",
                          f"layers.{i}.{side}_conv.kernel_projection.weight"}
        if cfg.attention_gate is not None:
            names.add(f"layers.{i}.self_attn.g_proj.weight")
    if cfg.laguna_context:
        names |= {f"aux_hidden_norms.{j}.weight" for j in range(cfg.num_context_features)}
    if cfg.has_selector:
        names |= {"candidate_selector.predecessor_codebook",
                  "candidate_selector.successor_codebook",
                  "candidate_selector.hidden_projection.weight"}
    return names


@pytest.mark.parametrize("version", [1, 2, *LAGUNA])
def test_state_dict_names_and_shapes_are_published(version):
    cfg = make_cfg(version)
    sd = DFlashDrafter(cfg).state_dict()
    assert set(sd) == published_names(cfg)
    assert sd["fc.weight"].shape == (H, 2 * H)
    assert sd["layers.0.self_attn.k_proj.weight"].shape == (2 * 8, H)
    if version in LAGUNA:  # sglang: g_proj out = heads (per head) or heads x head_dim
        gates = 4 if cfg.attention_gate == "per-head" else 4 * 8
        assert sd["layers.1.self_attn.g_proj.weight"].shape == (gates, H)
        assert sd["aux_hidden_norms.1.weight"].shape == (H,)
    if version == 2:
        groups = H // 8
        assert sd["layers.1.mlp_conv.base_kernel"].shape == (2, 2, H)
        assert sd["layers.1.attention_conv.kernel_projection.weight"].shape == (2 * 2 * groups, H)
        assert sd["candidate_selector.predecessor_codebook"].shape == (V, 4)
        assert sd["candidate_selector.hidden_projection.weight"].shape == (4, H)


# ---------------------------------------------------------------------------
# Grouped convolution
# ---------------------------------------------------------------------------


def conv_double_loop(x, base, coef, group):
    """out[b, i, c] = sum_t (base[t, c] + coef[b, i, t, c // group]) * x[b, i - t, c]."""
    bs, block, hidden = x.shape
    out = torch.zeros_like(x)
    for b in range(bs):
        for i in range(block):
            for c in range(hidden):
                for t in range(base.shape[0]):
                    if i - t >= 0:
                        out[b, i, c] += (base[t, c] + coef[b, i, t, c // group]) * x[b, i - t, c]
    return out


@pytest.mark.parametrize("taps", [2, 3])
def test_conv_matches_double_loop(taps):
    conv = randomise(GroupedConv(16, taps, group_size=4), seed=taps)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y = torch.randn(2, 5, 16, dtype=torch.float64)
    conv = conv.double()
    x_conv, coef1 = conv.prepare(x)
    coef = conv.kernel_projection(x).view(2, 5, 2, taps, 4)
    base = conv.base_kernel.detach()
    torch.testing.assert_close(x_conv, conv_double_loop(x, base[0], coef[:, :, 0], 4))
    torch.testing.assert_close(conv.finish(y, coef1),
                               conv_double_loop(y, base[1], coef[:, :, 1], 4))


def test_conv_is_identity_at_init():
    conv = GroupedConv(16, 2, group_size=4)
    x, y = torch.randn(3, 6, 16), torch.randn(3, 6, 16)
    x_conv, coef1 = conv.prepare(x)
    assert torch.equal(x_conv, x) and torch.equal(conv.finish(y, coef1), y)


def test_conv_never_crosses_blocks():
    conv = randomise(GroupedConv(16, 2, group_size=4))
    x = torch.randn(2, 4, 16)
    x2 = x.clone()
    x2[0] = torch.randn(4, 16)  # another block of the batch: independent
    out, _ = conv.prepare(x)
    out2, _ = conv.prepare(x2)
    torch.testing.assert_close(out[1], out2[1])


# ---------------------------------------------------------------------------
# Attention semantics
# ---------------------------------------------------------------------------


def random_inputs(cfg, bs=2, ctx_len=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B = cfg.block_size
    embeds = torch.randn(bs, B, H, generator=gen)
    ctx_len_per = torch.tensor([ctx_len, ctx_len - 3][:bs])
    positions = ctx_len_per[:, None] + torch.arange(B)  # block follows its context
    target_hidden = torch.randn(bs, ctx_len, cfg.num_context_features * H, generator=gen)
    valid = torch.arange(ctx_len)[None, :] < ctx_len_per[:, None]
    return embeds, positions, target_hidden, valid


def run_block(model, embeds, positions, target_hidden, valid):
    bs, L, _ = target_hidden.shape
    ctx = model.context_features(target_hidden.flatten(0, 1))
    k, v = model.context_kv(ctx, torch.arange(L).repeat(bs))
    k, v = k.unflatten(1, (bs, L)), v.unflatten(1, (bs, L))
    return model.forward_block(embeds, positions, k, v, valid)


@pytest.mark.parametrize("version", [1, 2])
def test_later_block_token_changes_earlier_outputs(version):
    cfg = make_cfg(version)
    model = randomise(DFlashDrafter(cfg))
    embeds, positions, target_hidden, valid = random_inputs(cfg)
    base = run_block(model, embeds, positions, target_hidden, valid)
    changed = embeds.clone()
    changed[:, -1] += 1.0  # only the last block slot
    out = run_block(model, changed, positions, target_hidden, valid)
    assert (out[:, 0] - base[:, 0]).abs().max() > 1e-4  # non-causal: slot 0 sees slot B-1


@pytest.mark.parametrize("version", [1, 2])
def test_invalid_context_entries_change_nothing(version):
    cfg = make_cfg(version)
    model = randomise(DFlashDrafter(cfg))
    embeds, positions, target_hidden, valid = random_inputs(cfg)
    base = run_block(model, embeds, positions, target_hidden, valid)
    junk = target_hidden.clone()
    junk[~valid] = torch.randn(int((~valid).sum()), junk.shape[-1]) * 100
    torch.testing.assert_close(run_block(model, embeds, positions, junk, valid), base,
                               rtol=0, atol=0)
    touched = target_hidden.clone()
    touched[0, 0] += 1.0  # a valid entry: must matter
    assert (run_block(model, embeds, positions, touched, valid) - base).abs().max() > 1e-4


# ---------------------------------------------------------------------------
# KV injection against a naive per-request implementation
# ---------------------------------------------------------------------------


def naive_rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def naive_rope(x, pos, theta=10000.0):
    """x [S, heads, d]: rotate channel pairs (j, j + d/2) by pos * theta^(-2j/d)."""
    d = x.shape[-1]
    out = x.clone()
    for j in range(d // 2):
        angle = pos.double() * theta ** (-2.0 * j / d)  # [S]
        c, s = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        a, b = x[..., j], x[..., j + d // 2]
        out[..., j], out[..., j + d // 2] = a * c - b * s, b * c + a * s
    return out


def naive_conv(conv, x, sublayer):
    if conv is None:
        return sublayer(x)
    taps, group = conv.taps, conv.group_size
    coef = (x @ conv.kernel_projection.weight.t()).view(x.shape[0], 2, taps, -1)[None]
    base = conv.base_kernel
    x_in = conv_double_loop(x[None], base[0], coef[:, :, 0], group)[0]
    return conv_double_loop(sublayer(x_in)[None], base[1], coef[:, :, 1], group)[0]


def naive_attention(p, cfg, ctx, kv_positions, positions, x):
    """Block queries x over keys of [context features, x]; p = one layer's weights.
    A Laguna drafter's context goes through the layer's input norm first, and its
    output is gated by softplus(x g_proj^T) per head or per element (sglang's
    DFlashLagunaForCausalLM)."""
    if cfg.laguna_context:
        ctx = naive_rms(ctx, p["input_layernorm.weight"])
    nh, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = naive_rms((x @ p["self_attn.q_proj.weight"].t()).view(-1, nh, d),
                  p["self_attn.q_norm.weight"])
    kv_in = torch.cat((ctx, x))
    k = naive_rms((kv_in @ p["self_attn.k_proj.weight"].t()).view(-1, kvh, d),
                  p["self_attn.k_norm.weight"])
    v = (kv_in @ p["self_attn.v_proj.weight"].t()).view(-1, kvh, d)
    q, k = naive_rope(q, positions), naive_rope(k, kv_positions)
    out = torch.zeros(x.shape[0], nh, d, dtype=x.dtype)
    for head in range(nh):
        g = head // (nh // kvh)
        w = torch.softmax(q[:, head] @ k[:, g].t() / math.sqrt(d), dim=-1)
        out[:, head] = w @ v[:, g]
    if cfg.attention_gate is not None:
        gate = torch.nn.functional.softplus(x @ p["self_attn.g_proj.weight"].t())
        out = out * (gate[:, :, None] if cfg.attention_gate == "per-head" else gate.view(-1, nh, d))
    return out.flatten(1) @ p["self_attn.o_proj.weight"].t()


def naive_mlp(p, x):
    gate = torch.nn.functional.silu(x @ p["mlp.gate_proj.weight"].t())
    return (gate * (x @ p["mlp.up_proj.weight"].t())) @ p["mlp.down_proj.weight"].t()


def naive_drafter(model, embeds, positions, target_hidden, ctx_positions):
    """One request: concatenate context and block K/V per layer, plain softmax."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    cfg = model.cfg
    if cfg.laguna_context:  # each target layer's features normalized by its own norm
        target_hidden = torch.cat([naive_rms(part, sd[f"aux_hidden_norms.{j}.weight"]) for j, part in
                                   enumerate(target_hidden.split(cfg.hidden_size, dim=-1))], dim=-1)
    ctx = naive_rms(target_hidden @ sd["fc.weight"].t(), sd["hidden_norm.weight"])
    h = embeds
    for i, layer in enumerate(model.layers):
        p = {k[len(f"layers.{i}."):]: v for k, v in sd.items() if k.startswith(f"layers.{i}.")}
        attention = partial(naive_attention, p, cfg, ctx, torch.cat((ctx_positions, positions)),
                            positions)
        h = h + naive_conv(layer.attention_conv, naive_rms(h, p["input_layernorm.weight"]),
                           attention)
        h = h + naive_conv(layer.mlp_conv, naive_rms(h, p["post_attention_layernorm.weight"]),
                           partial(naive_mlp, p))
    return naive_rms(h, sd["norm.weight"])


@pytest.mark.parametrize("version", [1, 2, *LAGUNA])
def test_context_kv_then_forward_block_matches_naive(version):
    cfg = make_cfg(version)
    model = randomise(DFlashDrafter(cfg)).double()
    embeds, positions, target_hidden, valid = random_inputs(cfg, bs=2, ctx_len=7)
    embeds, target_hidden = embeds.double(), target_hidden.double()
    with torch.no_grad():
        fast = run_block(model, embeds, positions, target_hidden, valid)
        for b in range(2):
            n = int(valid[b].sum())
            slow = naive_drafter(model, embeds[b], positions[b], target_hidden[b, :n],
                                 torch.arange(n))
            torch.testing.assert_close(fast[b], slow, rtol=1e-9, atol=1e-9)


def test_rope_matches_transformers_qwen3():
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    x = torch.randn(1, 5, 3, 8)  # [bs, S, heads, d]
    pos = torch.tensor([[0, 3, 17, 250, 1023]])
    cos, sin = rope_cos_sin(pos, 8, 10000.0)
    ours = apply_rope(x, cos, sin)
    hf, _ = qwen3.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin)
    torch.testing.assert_close(ours, hf.transpose(1, 2))


def test_context_features_rejects_wrong_width():
    model = DFlashDrafter(make_cfg())
    with pytest.raises(ValueError, match="expected"):
        model.context_features(torch.randn(3, H))


def test_forward_block_rejects_bad_shapes():
    cfg = make_cfg()
    model = DFlashDrafter(cfg)
    embeds, positions, _, valid = random_inputs(cfg)
    k = torch.zeros(cfg.num_hidden_layers, 2, 7, 2, 8)
    with pytest.raises(ValueError, match="ctx_k"):
        model.forward_block(embeds, positions, k[:, :, :, :1], k, valid)
    with pytest.raises(ValueError, match="ctx_valid"):
        model.forward_block(embeds, positions, k, k, valid.long())


def test_v1_has_no_selector_and_v2_does():
    assert DFlashDrafter(make_cfg(1)).candidate_selector is None
    assert DFlashDrafter(make_cfg(2)).candidate_selector is not None
    assert DFlashDrafter(make_cfg(1, conv=True)).layers[0].attention_conv is not None


# ---------------------------------------------------------------------------
# RoPE scaling (sglang 0.5.23's get_rope rules, checked against transformers'
# ROPE_INIT_FUNCTIONS where both define the same thing, else by hand)
# ---------------------------------------------------------------------------

HF_ROPE_CASES = [
    ("linear", 1e4, {"factor": 4.0}, RopeScaling("linear", factor=4.0)),
    ("yarn", 1e6, {"factor": 4.0, "original_max_position_embeddings": 2048},
     RopeScaling("yarn", factor=4.0, original_max_position_embeddings=2048)),
    ("yarn", 1e4, {"factor": 8.0, "original_max_position_embeddings": 1024, "beta_fast": 16.0,
                   "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
     RopeScaling("yarn", factor=8.0, original_max_position_embeddings=1024, beta_fast=16.0,
                 beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5, truncate=False)),
    ("llama3", 5e5, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
     RopeScaling("llama3", factor=8.0, original_max_position_embeddings=8192)),
]


@pytest.mark.parametrize("kind,theta,params,scaling", HF_ROPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HF_ROPE_CASES)])
def test_rope_scaling_matches_transformers(kind, theta, params, scaling):
    transformers = pytest.importorskip("transformers")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    head_dim = 64
    hf_cfg = transformers.Qwen3Config(
        hidden_size=256, num_attention_heads=4, head_dim=head_dim,
        max_position_embeddings=8192 if kind != "yarn" else 8192,
        rope_parameters={"rope_type": kind, "rope_theta": theta, **params})
    hf_inv, hf_factor = rope_utils.ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    ours = rope_inv_freq(head_dim, theta, scaling, torch.float64)
    if kind == "linear":
        ours = ours / scaling.factor  # sglang divides the positions instead (checked below)
    torch.testing.assert_close(ours, hf_inv.double(), rtol=1e-6, atol=0)
    assert rope_magnitude(scaling) == pytest.approx(hf_factor, rel=1e-12)
    pos = torch.tensor([0, 1, 5, 40, 300])
    cos, sin = rope_cos_sin(pos, head_dim, theta, torch.float64, scaling)
    angles = pos.double()[:, None] * hf_inv.double()
    torch.testing.assert_close(cos[:, : head_dim // 2], angles.cos() * hf_factor, rtol=0, atol=1e-4)
    torch.testing.assert_close(sin[:, head_dim // 2:], angles.sin() * hf_factor, rtol=0, atol=1e-4)


def test_dynamic_ntk_is_sglangs_static_base():
    """sglang's DynamicNTKScalingRotaryEmbedding builds one table with base
    theta * (f^2 - f + 1)^(d / (d - 2)); the alpha variant theta * alpha^(d / (d - 2))."""
    d, theta = 16, 1e4
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d
    for scaling, base in ((RopeScaling("dynamic", factor=2.0), theta * 3.0 ** (16 / 14)),
                          (RopeScaling("dynamic", alpha=4.0), theta * 4.0 ** (16 / 14))):
        torch.testing.assert_close(rope_inv_freq(d, theta, scaling, torch.float64),
                                   1.0 / base ** exponents, rtol=1e-12, atol=0)
        assert rope_magnitude(scaling) == 1.0


def test_linear_rope_divides_positions():
    pos = torch.tensor([0, 3, 12, 999])
    cos, sin = rope_cos_sin(pos, 8, 1e4, torch.float64, RopeScaling("linear", factor=4.0))
    want_cos, want_sin = rope_cos_sin(pos.double() / 4.0, 8, 1e4, torch.float64)
    torch.testing.assert_close(cos, want_cos, rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, want_sin, rtol=0, atol=1e-12)


def test_plain_rope_unchanged_without_scaling():
    pos = torch.tensor([0, 7, 4096])
    a = rope_cos_sin(pos, 16, 1e6)
    exponents = torch.arange(0, 16, 2, dtype=torch.float32)
    freqs = pos.float()[:, None] * (1.0 / (1e6 ** (exponents / 16)))  # the plain formula
    emb = torch.cat((freqs, freqs), dim=-1)
    assert torch.equal(a[0], emb.cos()) and torch.equal(a[1], emb.sin())


def test_attention_uses_rope_scaling_and_bias():
    plain = randomise(DFlashDrafter(make_cfg()), seed=3)
    scaled_cfg = make_cfg(rope_scaling=RopeScaling("yarn", factor=4.0,
                                                   original_max_position_embeddings=128))
    scaled = DFlashDrafter(scaled_cfg)
    scaled.load_state_dict(plain.state_dict())
    ctx = torch.randn(3, H)
    pos = torch.tensor([100, 101, 102])
    k_plain, _ = plain.layers[0].self_attn.key_value(ctx, pos)
    k_scaled, _ = scaled.eval().layers[0].self_attn.key_value(ctx, pos)
    assert not torch.allclose(k_plain, k_scaled)
    biased = DFlashDrafter(make_cfg(attention_bias=True))
    names = set(biased.state_dict())
    assert {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"} <= names
