"""Triton chain rejection sampling: the GPU twin of
`ops.rejection_ref.chain_rejection_sample_uniforms` (same signature, same result).

One program per request. q is sparse: each slot's K candidate ids and
their probabilities (zero elsewhere), so q_i(x) is a K-wide lookup:

    accept_len = #leading i with u_i * q_i(x_i) < p_i(x_i)
    i = accept_len; w = max(0, p_i - q_i) if i < S else p_S   (full vocabulary)
    w = p_i if sum(w) == 0                                    (empty residual)
    emitted = min(#{j: cdf_j <= v_i * sum(w)}, last j with w_j > 0)

The vocabulary is streamed twice in chunks of BLOCK_V: once for sum(w), once
for the CDF count. Sums and the CDF are float64, as in the torch twin, so the
chunked order picks the same token as torch's sequential cumsum (see
rejection_ref.py). The residual itself is formed in float32, elementwise, so
it is bit-identical to the twin's (each vocabulary entry matches at most one
distinct candidate, so its q is that probability plus zeros). Nothing here draws random numbers, so a
launch can be captured in a CUDA graph.

Imports triton at module level: only `sglang_dflash.ops` imports this module,
and only on the CUDA branch (or under TRITON_INTERPRET=1 in tests).
"""

import torch
import triton
import triton.language as tl

from sglang_dflash.rejection import PAD_TOKEN_ID, AcceptResult, check_sparse_chain_inputs

DEFAULT_BLOCK_V = 2048


@triton.jit
def _chain_rejection_kernel(
    draft_ptr,  # [bs, S] int64
    qid_ptr,  # [bs, S, K] int64 candidate ids
    qpr_ptr,  # [bs, S, K] float32 their probabilities
    p_ptr,  # [bs, S+1, V] float32
    ua_ptr,  # [bs, S] float32 accept uniforms
    us_ptr,  # [bs, S+1] float32 sample uniforms
    accept_len_ptr,  # [bs] int64 out
    tokens_ptr,  # [bs, S+1] int64 out
    vocab,
    s_db, s_ds,
    s_ib, s_is, s_ik,
    s_qb, s_qs, s_qk,
    s_pb, s_ps, s_pv,
    s_ab, s_as,
    s_ub, s_us,
    s_tb, s_ts,
    NUM_SLOTS: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    koffs = tl.arange(0, BLOCK_K)
    km = koffs < K
    # -- accept tests, stopping at the first rejection
    n = tl.zeros((), dtype=tl.int64)
    alive = tl.full((), 1, dtype=tl.int1)
    for i in range(NUM_SLOTS):
        x = tl.load(draft_ptr + b * s_db + i * s_ds).to(tl.int64)
        ids = tl.load(qid_ptr + b * s_ib + i * s_is + koffs * s_ik, mask=km, other=-1).to(tl.int64)
        probs = tl.load(qpr_ptr + b * s_qb + i * s_qs + koffs * s_qk, mask=km, other=0.0).to(tl.float32)
        qx = tl.sum(tl.where(ids == x, probs, 0.0), axis=0)
        px = tl.load(p_ptr + b * s_pb + i * s_ps + x * s_pv).to(tl.float32)
        u = tl.load(ua_ptr + b * s_ab + i * s_as).to(tl.float32)
        alive = alive & (u * qx < px)
        n += alive.to(tl.int64)
    rejected = n < NUM_SLOTS
    p_row = p_ptr + b * s_pb + n * s_ps
    # q at the first rejection (none after S accepts): its candidates, once
    row = tl.minimum(n, NUM_SLOTS - 1)
    row_ids = tl.load(qid_ptr + b * s_ib + row * s_is + koffs * s_ik, mask=km & rejected,
                      other=-1).to(tl.int64)
    row_probs = tl.load(qpr_ptr + b * s_qb + row * s_qs + koffs * s_qk, mask=km & rejected,
                        other=0.0).to(tl.float32)
    offs = tl.arange(0, BLOCK_V)
    # -- pass 1: mass of the residual and of p_i
    res_sum = tl.zeros((), dtype=tl.float64)
    p_sum = tl.zeros((), dtype=tl.float64)
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        m = idx < vocab
        pv = tl.load(p_row + idx * s_pv, mask=m, other=0.0).to(tl.float32)
        qv = tl.sum(tl.where(idx[:, None] == row_ids[None, :], row_probs[None, :], 0.0), axis=1)
        res_sum += tl.sum(tl.maximum(pv - qv, 0.0).to(tl.float64), axis=0)
        p_sum += tl.sum(pv.to(tl.float64), axis=0)
    empty = res_sum <= 0.0
    total = tl.where(empty, p_sum, res_sum)
    v = tl.load(us_ptr + b * s_ub + n * s_us).to(tl.float32)
    threshold = v.to(tl.float64) * total
    # -- pass 2: inverse CDF over the chosen weights
    running = tl.zeros((), dtype=tl.float64)
    count = tl.zeros((), dtype=tl.int64)
    last_pos = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        m = idx < vocab
        pv = tl.load(p_row + idx * s_pv, mask=m, other=0.0).to(tl.float32)
        qv = tl.sum(tl.where(idx[:, None] == row_ids[None, :], row_probs[None, :], 0.0), axis=1)
        w = tl.where(empty, pv, tl.maximum(pv - qv, 0.0))
        w64 = w.to(tl.float64)
        cdf = running + tl.cumsum(w64, axis=0)
        count += tl.sum(((cdf <= threshold) & m).to(tl.int64), axis=0)
        last_pos = tl.maximum(last_pos, tl.max(tl.where((w > 0) & m, idx, 0), axis=0).to(tl.int64))
        running += tl.sum(w64, axis=0)
    emitted = tl.minimum(count, last_pos)
    # -- accepted drafts, the emitted token at accept_len, then padding
    tl.store(accept_len_ptr + b, n)
    for j in range(NUM_SLOTS + 1):
        d = tl.load(draft_ptr + b * s_db + j * s_ds, mask=j < n, other=PAD).to(tl.int64)
        tok = tl.where(j < n, d, tl.where(j == n, emitted, PAD))
        tl.store(tokens_ptr + b * s_tb + j * s_ts, tok)


def chain_rejection_sample_uniforms(
    draft_tokens: torch.Tensor,
    q_ids: torch.Tensor,
    q_probs: torch.Tensor,
    p: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> AcceptResult:
    """`rejection_ref.chain_rejection_sample_uniforms` on the GPU (same arguments).

    Args:
        draft_tokens: [bs, S] int64, each in [0, V) (not checked on device:
            an id outside reads out of bounds, where the twin's gather raises).
        q_ids: [bs, S, K] int64 distinct candidate ids per slot; q_probs:
        [bs, S, K] float32 their q; p: [bs, S+1, V] float32 (finite);
        accept_uniforms: [bs, S]; sample_uniforms: [bs, S+1].

    Returns:
        AcceptResult with accept_len [bs] and tokens [bs, S+1].
    """
    check_sparse_chain_inputs(draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms)
    bs, num_slots = draft_tokens.shape
    accept_len = torch.empty(bs, dtype=torch.int64, device=p.device)
    tokens = torch.empty(bs, num_slots + 1, dtype=torch.int64, device=p.device)
    chain_rejection_into(draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms,
                         accept_len, tokens)
    return AcceptResult(accept_len, tokens)


def chain_rejection_into(draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms,
                         accept_len, tokens, block_v: int = DEFAULT_BLOCK_V) -> None:
    """Launch into caller-owned outputs (static graph buffers, poison checks).

    Args as `chain_rejection_sample_uniforms`, plus accept_len [bs] and tokens
    [bs, S+1] int64 to overwrite completely, and the chunk width block_v (a
    power of two). Inputs are not validated here.
    """
    bs, num_slots = draft_tokens.shape
    if bs == 0:
        return
    assert accept_len.dtype == tokens.dtype == torch.int64
    assert block_v >= 16 and block_v & (block_v - 1) == 0, block_v
    vocab, k = p.shape[2], q_ids.shape[2]
    block_k = max(triton.next_power_of_2(k), 2)
    # The residual's [BLOCK_V, BLOCK_K] candidate match per chunk stays within
    # 32k elements.
    block_v = min(block_v, max(triton.next_power_of_2(vocab), 16), max(32768 // block_k, 16))
    _chain_rejection_kernel[(bs,)](
        draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms, accept_len, tokens,
        vocab, *draft_tokens.stride(), *q_ids.stride(), *q_probs.stride(), *p.stride(),
        *accept_uniforms.stride(), *sample_uniforms.stride(), *tokens.stride(),
        NUM_SLOTS=num_slots, K=k, BLOCK_K=block_k, BLOCK_V=block_v, PAD=PAD_TOKEN_ID,
        num_warps=8 if block_v >= 2048 else 4,
    )
