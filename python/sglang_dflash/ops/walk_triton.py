"""Triton selector walk: the GPU twin of `select.walk` (same signature, same output).

One program per request walks the S drafted slots with the chosen row kept in
registers: slot 0 reads score row 0 (all rows of slot 0 are equal), slot e
reads the row of the candidate chosen at slot e - 1. Per row, exactly as
`select._walk_slot`:

    row   = NaN -> -inf, +inf -> float32 max
    dead  = max(row) == -inf                      -> choice 0, one-hot q
    greedy                                        -> first argmax, one-hot q
    sampled: q = softmax((row - max(row)) / max(T, MIN_TEMPERATURE))
             choice = min(#{j < K: cdf_j <= u}, last j with q_j > 0)

Nothing here draws random numbers: the uniforms come from the caller, so a
launch can be captured in a CUDA graph. Imports triton at module level: only
`sglang_dflash.ops` imports this module, and only on the CUDA branch (or under
TRITON_INTERPRET=1 in tests).
"""

import torch
import triton
import triton.language as tl

from sglang_dflash.select import MIN_TEMPERATURE, Path, _check_walk_inputs

_FLOAT32_MAX = 3.4028234663852886e38


@triton.jit
def _walk_kernel(
    scores_ptr,  # [bs, S, K, K] float32
    cand_ptr,  # [bs, S, K] int64
    temp_ptr,  # [bs] float32
    greedy_ptr,  # [bs] uint8 (a view of the bool tensor)
    u_ptr,  # [bs, S] float32
    tokens_ptr,  # [bs, S] int64 out
    choice_ptr,  # [bs, S] int64 out
    q_ptr,  # [bs, S, K] float32 out
    s_sb, s_ss, s_sp, s_sc,  # scores strides
    s_cb, s_cs, s_ck,  # cand_ids strides
    s_ub, s_us,  # uniforms strides
    s_tb, s_ts,  # tokens strides
    s_hb, s_hs,  # choice strides
    s_qb, s_qs, s_qk,  # q strides
    NUM_SLOTS: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MIN_TEMP: tl.constexpr,
    FMAX: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    valid = offs < K
    temp = tl.maximum(tl.load(temp_ptr + b).to(tl.float32), MIN_TEMP)
    greedy = tl.load(greedy_ptr + b) != 0
    row = tl.zeros((), dtype=tl.int64)  # slot 0: any row (all equal)
    for e in range(NUM_SLOTS):
        ptr = scores_ptr + b * s_sb + e * s_ss + row * s_sp + offs * s_sc
        x = tl.load(ptr, mask=valid, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)  # NaN -> -inf
        x = tl.where(x == float("inf"), FMAX, x)  # +inf -> float32 max
        peak = tl.max(x, axis=0)
        dead = peak == float("-inf")
        # Subtract the peak before dividing by T (row / T alone overflows).
        shifted = tl.fdiv(x - tl.where(dead, 0.0, peak), temp, ieee_rounding=True)
        w = tl.exp(shifted)  # padded lanes: exp(-inf) = 0
        q_s = tl.fdiv(w, tl.sum(w, axis=0), ieee_rounding=True)
        # inverse CDF, clamped to the last candidate with q > 0
        u = tl.load(u_ptr + b * s_ub + e * s_us).to(tl.float32)
        cdf = tl.cumsum(q_s, axis=0)
        count = tl.sum(((cdf <= u) & valid).to(tl.int64), axis=0)
        last_pos = tl.max(tl.where((q_s > 0) & valid, offs, 0), axis=0).to(tl.int64)
        sampled = tl.minimum(count, last_pos)
        first_max = tl.min(tl.where(x == peak, offs, BLOCK_K), axis=0).to(tl.int64)
        choice = tl.where(greedy, first_max, sampled)
        choice = tl.where(dead, 0, choice).to(tl.int64)
        one_hot = greedy | dead
        q = tl.where(one_hot, tl.where(offs == choice, 1.0, 0.0), q_s)
        tl.store(q_ptr + b * s_qb + e * s_qs + offs * s_qk, q, mask=valid)
        tl.store(choice_ptr + b * s_hb + e * s_hs, choice)
        token = tl.load(cand_ptr + b * s_cb + e * s_cs + choice * s_ck)
        tl.store(tokens_ptr + b * s_tb + e * s_ts, token.to(tl.int64))
        row = choice  # the next slot's predecessor is this slot's pick


def walk(
    scores: torch.Tensor,
    cand_ids: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
) -> Path:
    """`select.walk` on the GPU; same arguments, same Path (q within 1e-6).

    Args:
        scores: [bs, S, K, K] float32 lattice.
        cand_ids: [bs, S, K] int64 candidate token ids.
        temperature: [bs] float32; clamped to >= MIN_TEMPERATURE.
        greedy: [bs] bool.
        uniforms: [bs, S] float32 in [0, 1).

    Returns:
        Path with tokens, choice [bs, S] int64 and q [bs, S, K] float32.
    """
    _check_walk_inputs(scores, cand_ids, temperature, greedy, uniforms)
    bs, num_slots, k, _ = scores.shape
    tokens = torch.empty(bs, num_slots, dtype=torch.int64, device=scores.device)
    choice = torch.empty_like(tokens)
    q = torch.empty(bs, num_slots, k, dtype=torch.float32, device=scores.device)
    walk_into(scores, cand_ids, temperature, greedy, uniforms, tokens, choice, q)
    return Path(tokens=tokens, choice=choice, q=q)


def walk_into(scores, cand_ids, temperature, greedy, uniforms, tokens, choice, q) -> None:
    """Launch the walk into caller-owned outputs (static graph buffers, poison checks).

    Args as `walk`, plus tokens, choice [bs, S] int64 and q [bs, S, K] float32
    to overwrite completely. Inputs are not validated here; `walk` does that.
    """
    bs, num_slots, k, _ = scores.shape
    if bs == 0 or num_slots == 0:
        return
    assert tokens.dtype == choice.dtype == torch.int64 and q.dtype == torch.float32
    _walk_kernel[(bs,)](
        scores, cand_ids, temperature, greedy.view(torch.uint8), uniforms, tokens, choice, q,
        *scores.stride(), *cand_ids.stride(), *uniforms.stride(), *tokens.stride(),
        *choice.stride(), *q.stride(),
        NUM_SLOTS=num_slots, K=k, BLOCK_K=max(triton.next_power_of_2(k), 2),
        MIN_TEMP=MIN_TEMPERATURE, FMAX=_FLOAT32_MAX,
        num_warps=1,
    )
