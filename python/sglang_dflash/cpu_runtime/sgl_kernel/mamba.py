"""Gated DeltaNet (GDN) linear-attention ops of SGLang's CPU path, in plain torch.

SGLang 0.5.23 runs the linear-attention layers of hybrid targets (Qwen3.5,
Qwen3-Next) on a CPU through `sgl_kernel.mamba` and a few
`torch.ops.sgl_kernel.*_cpu` ops of the CPU wheel. This module implements them
with the wheel's call signatures, as SGLang's call sites use them:

* the causal depthwise convolution over a request's conv window: over a
  prefill (`causal_conv1d_fn_cpu`), one token per request (decode), or a verify
  block per request (`causal_conv1d_update_cpu` with an intermediate window
  buffer), each writing the window back to the pool;
* the gated delta rule recurrence over a prefill (`chunk_gated_delta_rule_cpu`),
  per decode token or per verify position (`fused_sigmoid_gating_delta_rule_
  update_cpu`, which also keeps the state after each position for the commit);
* the gates and the small fused helpers (see `GDN_TORCH_OPS`).

Decode and verify run the same per-token step (`conv_step`, `delta_rule_step`)
on the same batch rows, so a verified position's output and state are those a
decode step would have produced: what greedy identity with plain decoding
needs. Layouts (SGLang's pools): the recurrent state is [slots, HV, V, K]
float32, the conv window [slots, conv_dim, K_conv - 1] in the pool's dtype
(rounded to it after every token, as between two decode steps).

Formulas: the gated delta rule of Yang et al. (arXiv 2412.06464) as the
Qwen3.5 reference implementation computes it (l2-normalized q and k, q scaled
by K^-1/2, decay exp(g), beta-weighted delta update).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu"]


# --- the per-token steps shared by prefill, decode and verify ---------------

def conv_step(window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias, silu: bool):
    """One token through a causal depthwise conv.
    window [N, D, Kc-1] (pool dtype), x [N, D] -> (out [N, D] in weight's dtype,
    next window [N, D, Kc-1] in window's dtype)."""
    # x contiguous: a verify position computes on the layout a decode step has.
    full = torch.cat([window.to(weight.dtype), x.contiguous().to(weight.dtype).unsqueeze(-1)], dim=-1)
    out = (full * weight).sum(-1)
    if bias is not None:
        out = out + bias
    if silu:
        out = F.silu(out)
    return out, full[..., 1:].to(window.dtype)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, l2norm: bool):
    """q, k [..., H, K] -> float32 [..., HV, K]: l2-normalized (eps 1e-6) if asked,
    q scaled by K^-1/2, each head shared by HV / H value heads (repeat_interleave)."""
    q, k = q.float(), k.float()
    if l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    groups = num_v_heads // q.shape[-2]
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=-2), k.repeat_interleave(groups, dim=-2)
    return q, k


def delta_rule_step(state, q, k, v, g, beta):
    """One token of the gated delta rule, float32.
    state [N, HV, V, K], q, k [N, HV, K] (prepared), v [N, HV, V], g, beta [N, HV]
    -> (state', out [N, HV, V])."""
    state = state * g.exp()[..., None, None]
    remembered = (state * k.unsqueeze(-2)).sum(-1)  # [N, HV, V]
    delta = (v - remembered) * beta.unsqueeze(-1)
    state = state + delta.unsqueeze(-1) * k.unsqueeze(-2)
    return state, (state * q.unsqueeze(-2)).sum(-1)


def gdn_gates(A_log, a, b, dt_bias, softplus_beta: float = 1.0, softplus_threshold: float = 20.0):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) (rounded to b's
    dtype, as SGLang's kernel stores it), both float32 and shaped like a."""
    x = a.float() + dt_bias.float()
    g = -A_log.float().exp() * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return g, torch.sigmoid(b.float()).to(b.dtype).float()


# --- sgl_kernel.mamba --------------------------------------------------------

def causal_conv1d_fn_cpu(x, weight, bias, activation, conv_states, has_initial_state, cache_indices,
                         query_start_loc, seq_lens_cpu=None, **_):
    """Prefill. x [D, T] (the packed sequences' tokens), weight [D, Kc] -> [D, T].
    Each sequence starts from its pool window (zeros without a prefix) and
    leaves its last Kc - 1 inputs there."""
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    silu = activation in ("silu", "swish")
    for i, slot in enumerate(cache_indices.tolist()):
        s, e = starts[i], starts[i + 1]
        window = conv_states[slot]
        if not bool(has_initial_state[i]):
            window = torch.zeros_like(window)
        full = torch.cat([window.to(weight.dtype), x[:, s:e].to(weight.dtype)], dim=-1)  # [D, Kc-1+L]
        y = (full.unfold(-1, weight.shape[-1], 1) * weight.unsqueeze(1)).sum(-1)  # [D, L]
        if bias is not None:
            y = y + bias.unsqueeze(-1)
        out[:, s:e] = (F.silu(y) if silu else y).to(x.dtype)
        conv_states[slot] = full[:, full.shape[-1] - window.shape[-1]:].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_states, weight, bias, activation, conv_state_indices,
                             intermediate_conv_window=None, intermediate_state_indices=None,
                             retrieve_next_token=None, retrieve_next_sibling=None,
                             retrieve_parent_token=None, **_):
    """Decode: x [N, D], one token per request -> [N, D].
    Verify: x [N, D, T], a linear chain of T tokens per request -> [N, D, T];
    the window after each token goes to intermediate_conv_window[ind[n], t]
    (the commit copies the accepted one back), and the pool is left holding
    the window after all T, as SGLang's kernel leaves it."""
    if retrieve_parent_token is not None or retrieve_next_token is not None:
        raise NotImplementedError("GDN verify of a draft tree: the CPU stand-in verifies linear chains only")
    silu = activation in ("silu", "swish")
    slots = conv_state_indices.long()
    window = conv_states[slots]
    if x.dim() == 2:
        out, window = conv_step(window, x, weight, bias, silu)
        conv_states[slots] = window
        return out.to(x.dtype)
    out = torch.empty_like(x)
    rows = None if intermediate_state_indices is None else intermediate_state_indices[:x.shape[0]].long()
    for t in range(x.shape[-1]):
        y, window = conv_step(window, x[:, :, t], weight, bias, silu)
        out[:, :, t] = y.to(x.dtype)
        if rows is not None:
            intermediate_conv_window[rows, t] = window.to(intermediate_conv_window.dtype)
    conv_states[slots] = window
    return out


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens, head_first=False,
                               use_qk_l2norm_in_kernel=True, initial_state_indices=None, **_):
    """Prefill. q, k [1, T, H, K], v [1, T, HV, V], g, beta [1, T, HV]; the
    sequences packed along T at cu_seqlens. Each starts from its pool state
    (initial_state[initial_state_indices[i]]), which it leaves updated.
    Returns (out [1, T, HV, V] in v's dtype, the final states, None)."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first layout")
    num_v_heads = v.shape[-2]
    qs, ks = prepare_qk(q[0], k[0], num_v_heads, use_qk_l2norm_in_kernel)
    out = torch.empty_like(v)
    starts = cu_seqlens.tolist()
    slots = initial_state_indices.tolist()
    finals = []
    for i, slot in enumerate(slots):
        state = initial_state[slot].float().unsqueeze(0)
        for t in range(starts[i], starts[i + 1]):
            state, o = delta_rule_step(state, qs[t:t + 1], ks[t:t + 1], v[0, t:t + 1].float(),
                                       g[0, t:t + 1].float(), beta[0, t:t + 1].float())
            out[0, t] = o[0].to(v.dtype)
        initial_state[slot] = state[0].to(initial_state.dtype)
        finals.append(state[0])
    return out, torch.stack(finals) if finals else None, None


# --- torch.ops.sgl_kernel.*_cpu ----------------------------------------------

def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                               initial_state_indices, cu_seqlens, use_qk_l2norm_in_kernel=True,
                                               softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
                                               disable_state_update=False, intermediate_states_buffer=None,
                                               intermediate_state_indices=None, cache_steps=None,
                                               retrieve_parent_token=None, **_):
    """Decode (one token per request) or verify (T tokens per request, every
    request the same T): q, k [1, N*T, H, K], v [1, N*T, HV, V], a, b [N*T, HV].
    Returns out [1, N*T, HV, V]. The state after each verify position goes to
    intermediate_states_buffer[ind[n], t]; the pool is updated unless
    disable_state_update (a verify leaves it for the commit)."""
    if is_kda or retrieve_parent_token is not None:
        raise NotImplementedError("GDN verify of a draft tree or KDA layers: not in the CPU stand-in")
    n = initial_state_indices.shape[0]
    total, num_v_heads = v.shape[1], v.shape[2]
    steps = total // n if n else 0
    if n * steps != total or (cu_seqlens is not None and cu_seqlens.numel() == n + 1
                              and not torch.equal(cu_seqlens.cpu(), torch.arange(n + 1) * steps)):
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: requests of unequal lengths")
    slots = initial_state_indices.long()
    state = initial_state_source[slots].float()
    # SGLang passes its whole (padded) table of buffer rows: the first N are this batch's.
    rows = None if intermediate_states_buffer is None else intermediate_state_indices[:n].long()
    out = torch.empty_like(v).view(n, steps, num_v_heads, -1)

    def position(x, t):
        # Position t of every request as a contiguous [N, ...] tensor: a decode
        # step's inputs have this shape, and torch's elementwise kernels round
        # an element by where it falls in their vector loop, so verify computes
        # on exactly the shapes decode does.
        return x.reshape(n, steps, *x.shape[1:])[:, t].contiguous()

    for t in range(steps):
        g, beta = gdn_gates(A_log, position(a, t), position(b, t), dt_bias, softplus_beta, softplus_threshold)
        qt, kt = prepare_qk(position(q[0], t), position(k[0], t), num_v_heads, use_qk_l2norm_in_kernel)
        state, o = delta_rule_step(state, qt, kt, position(v[0], t).float(), g, beta)
        out[:, t] = o.to(v.dtype)
        if rows is not None:
            intermediate_states_buffer[rows, t] = state.to(intermediate_states_buffer.dtype)
    if not disable_state_update:
        initial_state_source[slots] = state.to(initial_state_source.dtype)
    return out.view(1, total, num_v_heads, -1)


def fused_gdn_gating_cpu(A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):
    """(g, beta), each [1, T, HV] float32."""
    g, beta = gdn_gates(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    return g.unsqueeze(0), beta.unsqueeze(0)


def fused_sigmoid_mul_cpu(x, gate):
    """x *= sigmoid(gate), in place (gate may be a strided view of x's shape)."""
    x.mul_(torch.sigmoid(gate.float()).to(x.dtype).reshape(x.shape))
    return x


def _gemma_rmsnorm_heads(x, weight, eps, head_dim):
    """Per head: x * rsqrt(mean(x^2) + eps) * (1 + w), in float32, back to x's dtype."""
    h = x.reshape(-1, head_dim).float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return h.to(x.dtype)


def fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim):
    """Per-head Gemma RMSNorm of q and k: ([T*Hq, hd], [T*Hk, hd])."""
    return _gemma_rmsnorm_heads(q, q_weight, eps, head_dim), _gemma_rmsnorm_heads(k, k_weight, eps, head_dim)


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, q_weight, k_weight, eps, head_dim, num_heads):
    """q_gate [T, num_heads * 2 * hd], per head [q_h | gate_h] -> (q normed, k normed, gate),
    each [T, -1]."""
    tokens = q_gate.shape[0]
    per_head = q_gate.view(tokens, num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    q_normed = _gemma_rmsnorm_heads(q, q_weight, eps, head_dim).view(tokens, -1)
    k_normed = _gemma_rmsnorm_heads(k, k_weight, eps, head_dim).view(tokens, -1)
    return q_normed, k_normed, gate.reshape(tokens, -1).contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk,
                                                  head_v):
    """[q | k | v | z] and [b | a] rows -> (qkv [T, 2*H*Kd + HV*Vd], z [T, HV, Vd],
    b [T, HV], a [T, HV]), each contiguous."""
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    tokens = mixed_qkvz.shape[0]
    qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:qkv_dim + num_heads_v * head_v].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:2 * num_heads_v].contiguous()
    return qkv, z, b, a


# The torch.ops.sgl_kernel names SGLang's CPU model and attention code binds at import.
GDN_TORCH_OPS = {
    fn.__name__: fn for fn in (
        fused_gdn_gating_cpu, fused_sigmoid_gating_delta_rule_update_cpu, fused_sigmoid_mul_cpu,
        fused_qk_gemma_rmsnorm_cpu, fused_qk_gemma_rmsnorm_with_gate_cpu,
        fused_qkvzba_split_reshape_cat_contiguous_cpu,
    )
}
