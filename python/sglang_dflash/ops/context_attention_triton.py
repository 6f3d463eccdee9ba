"""Triton block attention over the drafter's paged context: the GPU twin of
`context_attention_ref.block_context_attention` (same signature and result).

One program per (request, query head) holds the B block queries in registers
and streams the request's own context keys in tiles, reading each key's slot
from `req_to_token` on the device, up to that request's prefix length (a
windowed layer starts at the window's left edge), then the block's own keys;
an online softmax in float32 accumulates the output. Nothing is gathered or
padded to the batch's longest context and nothing is read back to the host,
so memory and time follow the tokens present, and a launch can be captured in
a CUDA graph. Imports triton at module level: only `sglang_dflash.ops`
imports this module, on the CUDA branch (or under TRITON_INTERPRET=1 in tests).
"""

import math

import torch
import triton
import triton.language as tl

from sglang_dflash.ops.context_attention_ref import PagedLayer


@triton.jit
def _block_context_attention_kernel(
    q_ptr, kb_ptr, vb_ptr, kc_ptr, vc_ptr, r2t_ptr, rpi_ptr, prefix_ptr, pos_ptr, out_ptr,
    s_qb, s_qm, s_qh, s_qd,  # q [bs, B, nh, d]
    s_kbb, s_kbm, s_kbh, s_kbd,  # k_block [bs, B, kvh, d]
    s_vbb, s_vbm, s_vbh, s_vbd,  # v_block
    s_kcs, s_kch, s_kcd,  # k_cache [slots, kvh, d]
    s_vcs, s_vch, s_vcd,  # v_cache
    s_rr, s_rt,  # req_to_token [R, T]
    s_pb, s_pm,  # positions [bs, B]
    s_ob, s_om, s_oh, s_od,  # out [bs, B, nh, d]
    scale, window,
    B: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, IEEE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    kvh = h // GROUP
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_ok = m < B
    d_ok = d < D
    q = tl.load(q_ptr + b * s_qb + m[:, None] * s_qm + h * s_qh + d[None, :] * s_qd,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    q_pos = tl.load(pos_ptr + b * s_pb + m * s_pm, mask=m_ok, other=0)
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    row = tl.load(rpi_ptr + b).to(tl.int64)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    lo = tl.zeros((), tl.int64)
    if WINDOWED:
        lo = tl.maximum(tl.load(pos_ptr + b * s_pb).to(tl.int64) - window, 0)
    for start in range(lo, prefix, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < prefix
        slot = tl.load(r2t_ptr + row * s_rr + n * s_rt, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(kc_ptr + slot[:, None] * s_kcs + kvh * s_kch + d[None, :] * s_kcd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(vc_ptr + slot[:, None] * s_vcs + kvh * s_vch + d[None, :] * s_vcd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        seen = m_ok[:, None] & n_ok[None, :]
        m_i, l_i, acc = _update(q, k, v, n, q_pos, seen, m_i, l_i, acc, scale, window,
                                CAUSAL, WINDOWED, IEEE)

    # The block's own keys, at the query positions.
    n = tl.arange(0, BLOCK_M)
    n_ok = n < B
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(kb_ptr + b * s_kbb + n[:, None] * s_kbm + kvh * s_kbh + d[None, :] * s_kbd,
                mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(vb_ptr + b * s_vbb + n[:, None] * s_vbm + kvh * s_vbh + d[None, :] * s_vbd,
                mask=kv_mask, other=0.0).to(tl.float32)
    k_pos = tl.load(pos_ptr + b * s_pb + n * s_pm, mask=n_ok, other=0)
    seen = m_ok[:, None] & n_ok[None, :]
    m_i, l_i, acc = _update(q, k, v, k_pos, q_pos, seen, m_i, l_i, acc, scale, window,
                            CAUSAL, WINDOWED, IEEE)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + b * s_ob + m[:, None] * s_om + h * s_oh + d[None, :] * s_od,
             out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _update(q, k, v, k_pos, q_pos, seen, m_i, l_i, acc, scale, window,
            CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, IEEE: tl.constexpr):
    """One tile of keys into the running (max, sum, output) of every query row."""
    if CAUSAL:
        seen = seen & (k_pos[None, :] <= q_pos[:, None])
    if WINDOWED:
        seen = seen & (k_pos[None, :] >= q_pos[:, None] - window)
        if not CAUSAL:
            seen = seen & (k_pos[None, :] <= q_pos[:, None] + window)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l_i, acc


def block_context_attention(q, k_block, v_block, ctx: PagedLayer, positions, *,
                            causal=False, window=None):
    """See `context_attention_ref.block_context_attention`."""
    bs, block, heads, dim = q.shape
    kv_heads = k_block.shape[2]
    out = torch.empty_like(q)
    if bs == 0:
        return out
    ieee = q.dtype == torch.float32  # float32 models: no TF32 rounding in the dots
    grid = (bs, heads)
    _block_context_attention_kernel[grid](
        q, k_block, v_block, ctx.k_cache, ctx.v_cache, ctx.req_to_token, ctx.req_pool_indices,
        ctx.prefix_lens, positions, out,
        *q.stride(), *k_block.stride(), *v_block.stride(),
        *ctx.k_cache.stride(), *ctx.v_cache.stride(), *ctx.req_to_token.stride(),
        *positions.stride(), *out.stride(),
        1.0 / math.sqrt(dim), -1 if window is None else int(window),
        B=block, D=dim, GROUP=heads // kv_heads,
        BLOCK_M=max(16, triton.next_power_of_2(block)), BLOCK_N=32,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
        CAUSAL=bool(causal), WINDOWED=window is not None, IEEE=ieee,
        num_warps=4,
    )
    return out
