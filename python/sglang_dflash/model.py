"""Reference DFlash / DFlash 2 drafter in plain torch (batch-first).

The drafter is a stack of Qwen3-style pre-norm layers with no embedding and no
LM head of its own: block tokens are embedded and decoded with the target's
tables. It is conditioned on the target through "KV injection":

    ctx        = hidden_norm(fc(concat_j h_{target_layer_ids[j]}))   # [N, H]
    K_ctx, V_ctx (per layer) = RoPE(k_norm(k_proj(ctx))), v_proj(ctx)

and each block query attends to the valid context keys and to the keys of its
own block. By default (every published DFlash v1 drafter) the attention is
non-causal: a query sees every valid context key and every key of its block.
A layer may instead be causal (`cfg.layer_causal[i]`: keys with k_pos <= q_pos)
and windowed (`cfg.layer_window[i]` = w: keys with k_pos >= q_pos - w, and,
in a non-causal layer such as the published DFlash 2 drafters', also
k_pos <= q_pos + w), as sglang resolves `layer_types` / `sliding_window` /
`is_causal` (config.py). Context key column j is at position j (callers gather
context in position order); block keys are at `block_positions`. Context
features never run through the layers as tokens; the caller caches
`context_kv` and passes it to `forward_block`.

RoPE is rotate-halves at `cfg.rope_theta`, optionally with one of the
frequency rules of sglang's `get_rope` (`cfg.rope_scaling`: linear, dynamic,
yarn, llama3); q/k/v/o carry biases when `cfg.attention_bias`.

DFlash 2 adds a grouped two-tap dynamic convolution around each attention and
MLP sublayer (`GroupedConv`) and owns the candidate-selector parameters
(`CandidateSelector`; the scoring lives in select.py).

sglang's Laguna drafter (`cfg.laguna_context`, `cfg.attention_gate`) is the v1
layout plus a softplus gate on each attention output (`g_proj` of the
attention's input, per head or per element), one RMSNorm per target layer's
features before `fc` (`aux_hidden_norms`), and each layer's `input_layernorm`
on the context features before its K/V.

Parameter names equal the published checkpoint names (docs/design.md §9), so
`DFlashDrafter(cfg).state_dict()` can be saved and loaded as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .config import DrafterConfig, RopeScaling
from .ops.context_attention_ref import PagedLayer, visibility


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in float32, scale in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = _upcast(x)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 for half / bf16 / fp32 math; float64 stays float64 (exact tests)."""
    return x if x.dtype == torch.float64 else x.float()


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype = torch.float32, scaling: RopeScaling | None = None):
    """Neox-style (rotate-halves) RoPE tables, as HF Qwen3 / sglang build them.

    Args:
        positions: [...] int64 absolute positions.
        dtype: float32 (the served math); float64 only for exact tests.
        scaling: a non-default frequency rule (None = plain RoPE at `theta`).
    Returns:
        cos, sin: [..., head_dim] in `dtype` (yarn scales both by its magnitude factor).
    """
    inv_freq = rope_inv_freq(head_dim, theta, scaling, dtype, positions.device)
    pos = positions.to(dtype)
    if scaling is not None and scaling.rope_type == "linear":
        pos = pos / scaling.factor  # sglang divides positions, not frequencies
    freqs = pos.unsqueeze(-1) * inv_freq  # [..., head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., head_dim]
    factor = rope_magnitude(scaling)
    if factor == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * factor, emb.sin() * factor


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None,
                  dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """[head_dim / 2] rotation frequencies; sglang 0.5.23's formulas per rope type
    (`layers/rotary_embedding`: base, rope_variant, yarn)."""
    kind = None if scaling is None else scaling.rope_type
    if kind == "dynamic":
        theta = _dynamic_ntk_theta(theta, head_dim, scaling)
    exponents = torch.arange(0, head_dim, 2, dtype=dtype, device=device)
    inv_freq = 1.0 / (theta ** (exponents / head_dim))
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    return inv_freq


def rope_magnitude(scaling: RopeScaling | None) -> float:
    """The factor yarn multiplies cos and sin by (1.0 for every other rule)."""
    if scaling is None or scaling.rope_type != "yarn":
        return 1.0
    if scaling.mscale is not None and scaling.mscale_all_dim is not None:
        scale = (_yarn_mscale(scaling.factor, scaling.mscale)
                 / _yarn_mscale(scaling.factor, scaling.mscale_all_dim))
    else:
        scale = _yarn_mscale(scaling.factor, 1.0)
    return float(scale * scaling.attn_factor)


def _dynamic_ntk_theta(theta: float, head_dim: int, scaling: RopeScaling) -> float:
    """sglang's static NTK base: alpha form, else factor f -> f^2 - f + 1 (not HF's
    position-dependent "dynamic": sglang builds one table for every position)."""
    exponent = head_dim / (head_dim - 2)
    if scaling.alpha is not None:
        return theta * scaling.alpha ** exponent
    f = scaling.factor
    return theta * (f * f - (f - 1)) ** exponent


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Keep short wavelengths, divide long ones by `factor`, blend in between."""
    orig = s.original_max_position_embeddings
    wave_len = 2 * math.pi / inv_freq
    if s.low_freq_factor != s.high_freq_factor:
        smooth = (orig / wave_len - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    else:
        smooth = torch.zeros_like(inv_freq)
    blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    long = torch.where(wave_len > orig / s.low_freq_factor, inv_freq / s.factor, blended)
    return torch.where(wave_len < orig / s.high_freq_factor, inv_freq, long)


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float,
                   s: RopeScaling) -> torch.Tensor:
    """Interpolate low frequencies by `factor`, keep high ones, ramp between the
    dims that turn beta_fast and beta_slow times over the original context."""
    low = _yarn_correction_dim(s.beta_fast, head_dim, theta, s.original_max_position_embeddings)
    high = _yarn_correction_dim(s.beta_slow, head_dim, theta, s.original_max_position_embeddings)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    dims = torch.arange(head_dim // 2, dtype=inv_freq.dtype, device=inv_freq.device)
    ramp = ((dims - low) / (high - low)).clamp(0, 1)
    keep = (1 - ramp) * s.extrapolation_factor  # 1 = extrapolate (keep the frequency)
    return inv_freq / s.factor * (1 - keep) + inv_freq * keep


def _yarn_correction_dim(rotations: float, head_dim: int, theta: float, max_pos: int) -> float:
    return head_dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., S, heads, head_dim] by tables [..., S, head_dim] (float32 math)."""
    x32 = _upcast(x)
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    return (x32 * cos + rotated * sin).to(x.dtype)


class GroupedConv(nn.Module):
    """DFlash 2 grouped dynamic depthwise convolution over one block.

    For side s (0 = sublayer input, 1 = sublayer output), row i and channel c:

        out[i, c] = sum_{t < taps} (base[s, t, c] + coef[i, s, t, c // group]) * x[i - t, c]

    with x[i - t] = 0 when i - t < 0: the conv is causal inside a block and
    never reaches across blocks or into the context. Both sides' coefficients
    come from one projection of the (normalised) sublayer input. The init
    (base = 1 at tap 0, projection = 0) makes an untrained conv the identity.
    """

    def __init__(self, hidden_size: int, taps: int, group_size: int):
        super().__init__()
        assert hidden_size % group_size == 0, "validated by DrafterConfig"
        self.taps = taps
        self.group_size = group_size
        self.num_groups = hidden_size // group_size
        base = torch.zeros(2, taps, hidden_size)  # [side, tap, channel]
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.num_groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def prepare(self, x: torch.Tensor):
        """Convolve the sublayer input x [bs, B, H] (side 0).

        Returns:
            x_conv [bs, B, H] and the side-1 coefficients [bs, B, taps, G].
        """
        coef = self.kernel_projection(x).unflatten(-1, (2, self.taps, self.num_groups))
        return self._convolve(x, coef[..., 0, :, :], side=0), coef[..., 1, :, :]

    def finish(self, y: torch.Tensor, coef_side1: torch.Tensor) -> torch.Tensor:
        """Convolve the sublayer output y [bs, B, H] with side 1."""
        return self._convolve(y, coef_side1, side=1)

    def _convolve(self, x: torch.Tensor, coef: torch.Tensor, side: int) -> torch.Tensor:
        # x [bs, B, H]; coef [bs, B, taps, G]
        groups = x.unflatten(-1, (self.num_groups, self.group_size))  # [bs, B, G, gs]
        base = self.base_kernel[side].view(self.taps, self.num_groups, self.group_size)
        kernel = base + coef.unsqueeze(-1)  # [bs, B, taps, G, gs]
        out = kernel[:, :, 0] * groups
        for t in range(1, min(self.taps, x.shape[1])):
            shifted = F.pad(groups[:, :-t], (0, 0, 0, 0, t, 0))  # row i holds x[i - t]
            out = out + kernel[:, :, t] * shifted
        return out.flatten(-2)


class Attention(nn.Module):
    """GQA attention of block queries over [context, block] keys.

    `causal`: keys with k_pos <= q_pos only; `window` w: keys with
    k_pos >= q_pos - w only, and k_pos <= q_pos + w too when not causal
    (None = unbounded). Both off = non-causal.
    """

    def __init__(self, cfg: DrafterConfig, causal: bool = False, window: int | None = None):
        super().__init__()
        self.causal, self.window = causal, window
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, d)
        self.rope_theta, self.rope_scaling = cfg.rope_theta, cfg.rope_scaling
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate = cfg.attention_gate
        if self.gate is not None:  # Laguna: one gate per head, or per output element
            self.g_proj = nn.Linear(h, self.num_heads * (1 if self.gate == "per-head" else d), bias=False)

    def _gated(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """out [bs, B, nh, d] * softplus(g_proj(x)) (x: the attention's input),
        the gate computed in float32 and applied in out's dtype, as sglang's
        Laguna drafter does; identity without a gate."""
        if self.gate is None:
            return out
        gate = F.softplus(_upcast(self.g_proj(x))).to(out.dtype)
        if self.gate == "per-head":
            return out * gate.unsqueeze(-1)
        return out * gate.unflatten(-1, (self.num_heads, self.head_dim))

    def key_value(self, x: torch.Tensor, positions: torch.Tensor):
        """x [..., S, H], positions [..., S] -> k, v [..., S, kv_heads, head_dim]."""
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        cos, sin = self._rope(positions, _upcast(k).dtype)
        return apply_rope(self.k_norm(k), cos, sin), v

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.head_dim, self.rope_theta, dtype, self.rope_scaling)

    def forward(self, x, positions, ctx_k, ctx_v, ctx_valid) -> torch.Tensor:
        """x [bs, B, H], positions [bs, B]; ctx_k/v [bs, L, kvh, d]; ctx_valid [bs, L]."""
        bs, block, _ = x.shape
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        cos, sin = self._rope(positions, _upcast(q).dtype)
        q = apply_rope(self.q_norm(q), cos, sin)  # [bs, B, nh, d]
        k, v = self.key_value(x, positions)  # [bs, B, kvh, d]
        if isinstance(ctx_k, PagedLayer):  # context read in place (ctx_v, ctx_valid unused)
            out = ops.block_context_attention(q, k, v, ctx_k, positions, causal=self.causal,
                                              window=self.window)
            return self.o_proj(self._gated(out.to(x.dtype), x).flatten(-2))
        k = torch.cat((ctx_k.to(k.dtype), k), dim=1)  # [bs, L + B, kvh, d]
        v = torch.cat((ctx_v.to(v.dtype), v), dim=1)
        block_valid = ctx_valid.new_ones(bs, block)
        valid = torch.cat((ctx_valid, block_valid), dim=1)  # [bs, L + B]
        key_positions = None
        if self.causal or self.window is not None:
            ctx_positions = torch.arange(ctx_valid.shape[1], device=positions.device)
            key_positions = torch.cat(
                (ctx_positions.expand(bs, -1), positions), dim=1)  # [bs, L + B]
        out = _masked_attention(q, k, v, valid, positions, key_positions,
                                causal=self.causal, window=self.window)
        return self.o_proj(self._gated(out, x).flatten(-2))


def _masked_attention(q, k, v, valid, query_positions=None, key_positions=None, *,
                      causal: bool = False, window: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over visible keys, GQA (query head h reads kv head h // group).

    Args:
        q: [bs, B, nh, d]; k, v: [bs, S, kvh, d]; valid: [bs, S] bool.
        query_positions [bs, B] / key_positions [bs, S]: needed when causal or
            windowed (see `visibility`); the last B keys are the block's own,
            at the query positions.
    Returns:
        [bs, B, nh, d]. Every query sees at least its own block key (valid,
        k_pos = q_pos), so no row is all-masked.
    """
    if causal or window is not None:
        mask = visibility(valid, query_positions, key_positions, causal=causal,
                              window=window)[:, None]  # [bs, 1, B, S]
    else:
        mask = valid[:, None, None, :]  # broadcast key mask (non-causal, unwindowed)
    # NOTE: SDPA keeps the [bs, nh, B, S] scores out of Python-visible memory and
    # is CUDA-graph capturable.
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, scale=1.0 / math.sqrt(q.shape[-1]), enable_gqa=True)
    return out.transpose(1, 2)


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm layer: norm -> [conv.prepare] -> sublayer -> [conv.finish] -> residual add."""

    def __init__(self, cfg: DrafterConfig, layer_id: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, causal=cfg.layer_causal[layer_id],
                                   window=cfg.layer_window[layer_id])
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.attention_conv = _make_conv(cfg)
        self.mlp_conv = _make_conv(cfg)

    def forward(self, h, positions, ctx_k, ctx_v, ctx_valid) -> torch.Tensor:
        attn = partial(self.self_attn, positions=positions, ctx_k=ctx_k, ctx_v=ctx_v,
                       ctx_valid=ctx_valid)
        h = h + _wrapped(self.attention_conv, attn, self.input_layernorm(h))
        x = self.post_attention_layernorm(h)
        return h + _wrapped(self.mlp_conv, self.mlp, x)


def _make_conv(cfg: DrafterConfig) -> GroupedConv | None:
    if not cfg.has_conv:
        return None
    return GroupedConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)


def _wrapped(conv: GroupedConv | None, sublayer, x: torch.Tensor) -> torch.Tensor:
    if conv is None:
        return sublayer(x)
    x, coef_side1 = conv.prepare(x)
    return conv.finish(sublayer(x), coef_side1)


class CandidateSelector(nn.Module):
    """DFlash 2 selector parameters: Wp, Ws [V, r] and Wh = hidden_projection [r, H]."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab_size, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(vocab_size, rank) * 0.02)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)


@dataclass
class PagedContext:
    """The drafter's context K/V in its cache, addressed by the target's slots."""

    k: torch.Tensor  # [num_layers, slots, kv_heads, head_dim]
    v: torch.Tensor  # [num_layers, slots, kv_heads, head_dim]
    req_to_token: torch.Tensor  # [R, T] slot of each request row's position
    req_pool_indices: torch.Tensor  # [bs]
    prefix_lens: torch.Tensor  # [bs] committed context length

    def layer(self, i: int) -> PagedLayer:
        return PagedLayer(self.k[i], self.v[i], self.req_to_token, self.req_pool_indices,
                          self.prefix_lens)


class DFlashDrafter(nn.Module):
    """DFlash (v1) or DFlash 2 drafter; see the module docstring."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(cfg.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.laguna_context:  # one norm per target layer's features, before fc
            self.aux_hidden_norms = nn.ModuleList(
                RMSNorm(h, cfg.rms_norm_eps) for _ in range(cfg.num_context_features))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.candidate_selector = (
            CandidateSelector(h, cfg.vocab_size, cfg.selector_rank) if cfg.has_selector else None)
        # A trained [H] embedding for the mask token, from `mask_embedding.pt`
        # beside the checkpoint (checkpoint.load_drafter sets it): the caller writes
        # it over the target embedding's row `mask_embedding_token_id`. A buffer so
        # that .to() moves it, non-persistent so that it is not a weight.
        self.register_buffer("mask_embedding", None, persistent=False)
        self.mask_embedding_token_id: int | None = None

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[N, n*H] concatenated target layer outputs -> [N, H] context features."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise ValueError(
                f"target_hidden has shape {tuple(target_hidden.shape)}; expected [..., {expected}] "
                f"({self.cfg.num_context_features} target layers x hidden {self.cfg.hidden_size})")
        if self.cfg.laguna_context:
            slices = target_hidden.unflatten(-1, (self.cfg.num_context_features, self.cfg.hidden_size))
            target_hidden = torch.cat([norm(slices[..., j, :]) for j, norm in enumerate(self.aux_hidden_norms)],
                                      dim=-1)
        return self.hidden_norm(self.fc(target_hidden))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor):
        """Per-layer K/V of context features, to be cached by the caller.

        Args:
            ctx: [N, H] context features; positions: [N] int64 absolute positions.
        Returns:
            k, v: each [num_layers, N, kv_heads, head_dim].
        """
        pairs = [layer.self_attn.key_value(layer.input_layernorm(ctx) if self.cfg.laguna_context else ctx,
                                           positions) for layer in self.layers]
        return torch.stack([k for k, _ in pairs]), torch.stack([v for _, v in pairs])

    def forward_block(self, block_embeds, block_positions, ctx_k, ctx_v, ctx_valid):
        """One draft pass over a batch of blocks.

        Args:
            block_embeds: [bs, B, H] target embedding of [anchor, mask x (B-1)].
            block_positions: [bs, B] int64 absolute positions.
            ctx_k, ctx_v: [num_layers, bs, L, kv_heads, head_dim] gathered context
                K/V (padded); ctx_valid: [bs, L] bool, False on padding. Column j
                holds the context key at position j (causal / windowed layers
                compare it with `block_positions`).
        Returns:
            hidden: [bs, B, H] after the final norm.
        """
        _check_block_inputs(self.cfg, block_embeds, block_positions, ctx_k, ctx_v, ctx_valid)
        h = block_embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, block_positions, ctx_k[i], ctx_v[i], ctx_valid)
        return self.norm(h)

    def forward_block_paged(self, block_embeds, block_positions, ctx: PagedContext):
        """`forward_block` with the context read in place from the drafter's
        cache (no [bs, L] gather padded to the longest context): on CUDA a
        Triton kernel streams each request's own rows, with no host read.

        Args:
            block_embeds: [bs, B, H]; block_positions: [bs, B] int64 (row 0 at
                each request's prefix length); ctx: the cache and slot table.
        Returns:
            hidden: [bs, B, H] after the final norm.
        """
        h = block_embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, block_positions, ctx.layer(i), None, None)
        return self.norm(h)

    def reference_draft_logits(self, hidden, lm_head_weight) -> torch.Tensor:
        return reference_draft_logits(hidden, lm_head_weight)


def reference_draft_logits(hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """Draft logits through the target head: [..., H] x [V, H] -> [..., V] (float32)."""
    return hidden.float() @ lm_head_weight.float().t()


def _check_block_inputs(cfg, block_embeds, block_positions, ctx_k, ctx_v, ctx_valid) -> None:
    bs, block, hidden = block_embeds.shape
    kv_shape = (cfg.num_hidden_layers, bs, ctx_valid.shape[-1], cfg.num_key_value_heads,
                cfg.head_dim)
    problems = []
    if hidden != cfg.hidden_size:
        problems.append(f"block_embeds {tuple(block_embeds.shape)} != [bs, B, {cfg.hidden_size}]")
    if tuple(block_positions.shape) != (bs, block):
        problems.append(f"block_positions {tuple(block_positions.shape)} != {(bs, block)}")
    for name, t in (("ctx_k", ctx_k), ("ctx_v", ctx_v)):
        if tuple(t.shape) != kv_shape:
            problems.append(f"{name} {tuple(t.shape)} != {kv_shape}")
    if ctx_valid.dim() != 2 or ctx_valid.shape[0] != bs or ctx_valid.dtype != torch.bool:
        problems.append(f"ctx_valid {tuple(ctx_valid.shape)} {ctx_valid.dtype} != [{bs}, L] bool")
    if problems:
        raise ValueError("forward_block: " + "; ".join(problems))


# ---------------------------------------------------------------------------
# Reference helpers around an HF target (duck-typed: no transformers import)
# ---------------------------------------------------------------------------


def target_features(target, input_ids, layer_ids: Sequence[int], attention_mask=None):
    """Concatenated target layer outputs for every position.

    Layer id k is the output of target layer k, i.e. HF `hidden_states[k + 1]`
    (entry 0 is the embedding output).

    Args:
        target: an HF causal LM; input_ids: [bs, T]; attention_mask: [bs, T] or None.
    Returns:
        features [bs, T, n*H] and the target logits [bs, T, V].
    """
    out = target(input_ids=input_ids, attention_mask=attention_mask,
                 output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[k + 1] for k in layer_ids], dim=-1)
    return feats, out.logits


@torch.no_grad()
def reference_draft_step(drafter: DFlashDrafter, target, token_ids: torch.Tensor,
                         mask_token_id: int) -> torch.Tensor:
    """Greedy draft for one sequence whose last token is the anchor.

    The context is every token before the anchor (the positions whose target
    features exist at decode time); the block is [anchor, MASK x (B-1)].

    Args:
        token_ids: [T] committed tokens (T >= 2); token_ids[-1] is the anchor.
    Returns:
        draft tokens [B-1] int64 (argmax of the draft logits at block slots 1..B-1).
    """
    cfg = drafter.cfg
    anchor = token_ids.shape[0] - 1
    feats, _ = target_features(target, token_ids[None, :anchor], cfg.target_layer_ids)
    positions = torch.arange(anchor + cfg.block_size, device=token_ids.device)
    ctx_k, ctx_v = drafter.context_kv(drafter.context_features(feats[0]), positions[:anchor])
    block_ids = torch.full((1, cfg.block_size), mask_token_id, device=token_ids.device)
    block_ids[0, 0] = token_ids[-1]
    embeds = target.get_input_embeddings()(block_ids)  # [1, B, H]
    valid = torch.ones(1, anchor, dtype=torch.bool, device=token_ids.device)
    hidden = drafter.forward_block(embeds, positions[None, anchor:], ctx_k[:, None],
                                   ctx_v[:, None], valid)
    logits = reference_draft_logits(hidden[0, 1:], target.get_output_embeddings().weight)
    return logits.argmax(dim=-1)
