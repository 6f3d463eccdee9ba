"""Chain rejection sampling from pre-drawn uniforms: the torch twin of the kernel.

Same rule as `rejection.chain_rejection_sample` (accept x_i iff
u_i * q_i(x_i) < p_i(x_i); at the first rejection emit from
norm(max(0, p_i - q_i)) over the FULL vocabulary, from p_i if that residual
is empty; after S accepts emit the bonus from p_S), but the emitted token is
drawn by inverse CDF from a caller-supplied uniform instead of
`torch.multinomial`, so a step consumes no RNG state and can be captured in a
CUDA graph. And q comes sparse, as the selector walk makes it (K candidates
per slot, zero elsewhere): only the rejected slot's q is scattered over the
vocabulary, one [bs, V] row instead of a dense [bs, S, V] q.

Inverse CDF, for the unnormalized emit distribution w [V]:

    cdf = cumsum(w) in float64, thr = v * cdf[V - 1]
    token = min(#{j: cdf_j <= thr}, last j with w_j > 0)

float64 makes the CDF independent of summation order to ~1e-16, so the
Triton kernel (which sums in chunks) picks the same token except with
probability ~V * 1e-16; in float32 over V = 151k entries the two orders
would disagree on flat distributions. The clamp only matters when rounding
leaves thr at or above the last CDF step.

Imports torch, the stdlib and sglang_dflash.rejection only.
"""

import torch

from sglang_dflash.rejection import (
    AcceptResult,
    _assemble_tokens,
    _emit_distribution,
    _leading_true,
    check_sparse_chain_inputs,
    sparse_q_row,
)


def chain_rejection_sample_uniforms(
    draft_tokens: torch.Tensor,
    q_ids: torch.Tensor,
    q_probs: torch.Tensor,
    p: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> AcceptResult:
    """Exact chain rejection sampling of S drafts per request, RNG-free.

    Args:
        draft_tokens: [bs, S] int64 drafted tokens x_0..x_{S-1}.
        q_ids: [bs, S, K] int64 the distinct candidates each draft was drawn
            among (the draft one of them); q_probs: [bs, S, K] float32 their
            probabilities, q = 0 for every other token (the walk's q; a
            deterministic draft is K = 1, probability 1).
        p: [bs, S+1, V] float32 target probabilities.
        accept_uniforms: [bs, S] float32 in [0, 1) for the accept tests.
        sample_uniforms: [bs, S+1] float32 in [0, 1); column accept_len draws
            the emitted token (residual at a rejection, bonus after S accepts).
            Independent of accept_uniforms and of the draft's uniforms.

    Returns:
        AcceptResult with accept_len [bs] and tokens [bs, S+1].
    """
    check_sparse_chain_inputs(draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms)
    num_slots = draft_tokens.shape[1]
    drafts = draft_tokens.long().unsqueeze(-1)  # [bs, S, 1]
    p_draft = torch.gather(p[:, :num_slots].float(), -1, drafts).squeeze(-1)  # [bs, S]
    q_draft = torch.where(q_ids.long() == drafts, q_probs.float(), 0.0).sum(-1)  # [bs, S]
    accepted = accept_uniforms.float() * q_draft < p_draft  # [bs, S]
    accept_len = _leading_true(accepted)
    q_row = sparse_q_row(q_ids, q_probs, accept_len, p.shape[2])
    emit_from = _emit_distribution(q_row, p, accept_len)  # [bs, V] unnormalized
    v = torch.gather(sample_uniforms.float(), 1, accept_len.unsqueeze(1))  # [bs, 1]
    emitted = inverse_cdf(emit_from, v.squeeze(1))
    return AcceptResult(accept_len, _assemble_tokens(draft_tokens, accept_len, emitted))


def chain_rejection_sparse_p(
    draft_tokens: torch.Tensor,
    q_ids: torch.Tensor,
    q_probs: torch.Tensor,
    p_ids: torch.Tensor,
    p_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> AcceptResult:
    """`chain_rejection_sample_uniforms` with p given sparse, as
    `rejection.target_probs_sparse` makes it for top-k rows: R ids per row
    (ascending) and their probabilities, 0 elsewhere. The same tokens from the
    same uniforms: p's zeros add nothing to the accept tests, the residual or
    its float64 CDF, so nothing over the vocabulary is needed.

    Args:
        draft_tokens: [bs, S]; q_ids, q_probs: [bs, S, K] (as the dense twin);
        p_ids: [bs, S+1, R] int64 ascending per row; p_probs: [bs, S+1, R] float32;
        accept_uniforms: [bs, S]; sample_uniforms: [bs, S+1].
    Returns:
        AcceptResult with accept_len [bs] and tokens [bs, S+1].
    """
    bs, num_slots = draft_tokens.shape
    if p_ids.shape != p_probs.shape or p_ids.shape[:2] != (bs, num_slots + 1):
        raise ValueError(f"p_ids {tuple(p_ids.shape)} and p_probs {tuple(p_probs.shape)} must be "
                         f"[{bs}, {num_slots + 1}, R] for drafts {tuple(draft_tokens.shape)}")
    drafts = draft_tokens.long().unsqueeze(-1)  # [bs, S, 1]
    p_draft = torch.where(p_ids[:, :num_slots] == drafts, p_probs[:, :num_slots].float(), 0.0).sum(-1)
    q_draft = torch.where(q_ids.long() == drafts, q_probs.float(), 0.0).sum(-1)  # [bs, S]
    accepted = accept_uniforms.float() * q_draft < p_draft  # [bs, S]
    accept_len = _leading_true(accepted)
    batch = torch.arange(bs, device=p_ids.device)
    ids = p_ids[batch, accept_len]  # [bs, R]
    q_row = None
    if num_slots > 0:  # q at the first rejection over p's ids (zero after S accepts)
        slot = accept_len.clamp(max=num_slots - 1)
        match = ids.unsqueeze(-1) == q_ids[batch, slot].long().unsqueeze(1)  # [bs, R, K]
        q_row = torch.where(match, q_probs[batch, slot].float().unsqueeze(1), 0.0).sum(-1)
        q_row = torch.where((accept_len < num_slots).unsqueeze(1), q_row, 0.0)
    weights = _emit_distribution(q_row, p_probs, accept_len)  # [bs, R]: the residual over p's ids
    v = torch.gather(sample_uniforms.float(), 1, accept_len.unsqueeze(1)).squeeze(1)
    emitted = ids.gather(1, inverse_cdf(weights, v).unsqueeze(1)).squeeze(1)
    return AcceptResult(accept_len, _assemble_tokens(draft_tokens, accept_len, emitted))


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of unnormalized non-negative weights.

    Args:
        weights: [N, V] float32, non-negative.
        u: [N] float32 in [0, 1).

    Returns:
        [N] int64: min(#{j: cdf_j <= u * total}, last j with weights_j > 0),
        cdf in float64; 0 for a row without positive weight.
    """
    cdf = torch.cumsum(weights.double(), dim=-1)  # [N, V]
    threshold = u.double().unsqueeze(-1) * cdf[:, -1:]  # [N, 1]
    count = (cdf <= threshold).sum(dim=-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_positive = torch.where(weights > 0, positions, torch.zeros_like(positions)).max(-1).values
    return torch.minimum(count, last_positive)
