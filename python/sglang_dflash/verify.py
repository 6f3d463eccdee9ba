"""Verification of one drafted block per request, for mixed greedy / sampled batches.

Rows are greedy or sampled per request (SGLang marks greedy requests with
top_k = 1). Greedy rows accept while the draft equals the target argmax
(output identical to plain greedy decoding). Sampled rows run exact chain
rejection sampling against the target's p (after temperature, top-k, top-p,
min-p, as plain decoding samples): with the q the draft was really drawn from
(DFlash 2 selector walk, sparse: its K candidates per slot) or, for
deterministic drafts (DFlash v1 argmax), a one-hot q (K = 1), where the
rule reduces to "draw y ~ p, accept iff y equals the draft"
(docs/design.md §6.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dflash import ops
from sglang_dflash.ops import chain_rejection
from sglang_dflash.ops.rejection_ref import chain_rejection_sparse_p
from sglang_dflash.rejection import AcceptResult, greedy_accept, target_probs, target_probs_sparse


@dataclass
class SamplingRows:
    temperature: torch.Tensor  # [bs] float32 (1.0 for greedy rows)
    top_p: torch.Tensor  # [bs] float32
    top_k: torch.Tensor  # [bs] int64, 1 for greedy rows
    min_p: torch.Tensor  # [bs] float32
    # The same filters as the host knows them, one (top_k, top_p, min_p) per
    # request (SGLang keeps them on each request), or None if not known: they
    # let `target_probs` rank fewer tokens (`rank_bound`) without a device read.
    host_filters: Optional[tuple[tuple[int, float, float], ...]] = None

    @property
    def greedy(self) -> torch.Tensor:
        """[bs] bool rows decoded greedily."""
        return self.top_k <= 1

    def rank_bound(self, vocab: int) -> Optional[int]:
        """`target_probs`' ranks: 0 when no request filters, the largest top-k
        when every filtering request has a top-k below `vocab` (greedy: 1),
        else None (a top-p or min-p request without one)."""
        if self.host_filters is None:
            return None
        bound = 0
        for top_k, top_p, min_p in self.host_filters:
            if 0 < top_k < vocab:
                bound = max(bound, top_k)
            elif top_p < 1.0 or min_p > 0.0:
                return None
        return bound

    def sparse_bound(self, vocab: int) -> Optional[int]:
        """The largest top-k when every request has one below `vocab` (greedy:
        1), so p has at most that many nonzero entries per row; else None."""
        if self.host_filters is None:
            return None
        ks = [top_k for top_k, _, _ in self.host_filters]
        return max(ks) if ks and all(0 < k < vocab for k in ks) else None

    def repeat(self, n: int) -> "SamplingRows":
        """Each row's tensors repeated n times (one per verify position),
        flattened; the host filters stay with the unrepeated rows."""
        rep = lambda t: t.repeat_interleave(n)  # noqa: E731
        return SamplingRows(rep(self.temperature), rep(self.top_p), rep(self.top_k), rep(self.min_p))


@dataclass
class VerifyUniforms:
    """Pre-drawn randomness of one verify step (drawn by the caller, so a request
    with a sampling seed is reproducible and the step is graph-capturable)."""

    accept: torch.Tensor  # [bs, S] float32 in [0, 1): accept tests
    sample: torch.Tensor  # [bs, S+1] float32 in [0, 1): the emitted token's inverse-CDF draw


def verify_block(
    drafts: torch.Tensor,
    logits: torch.Tensor,
    rows: Optional[SamplingRows],
    uniforms: Optional[VerifyUniforms] = None,
    *,
    q_ids: Optional[torch.Tensor] = None,
    q_probs: Optional[torch.Tensor] = None,
    probe: Optional[int] = None,
) -> AcceptResult:
    """Accept a prefix of `drafts` and emit the bonus, per request.

    Args:
        drafts: [bs, S] drafted tokens for block positions 1..S (S may be 0).
        logits: [bs, S+1, V] target logits after block rows 0..S (penalties,
            bias and grammar already applied).
        rows: per-request sampling parameters; None means all greedy (a batch
            whose rows are all greedy may also pass them: same result).
        uniforms: required when some row samples.
        q_ids, q_probs: [bs, S, K] the distribution each draft was drawn
            from (its candidates' ids and probabilities, zero elsewhere), or
            both None for deterministic drafts (one-hot q).
        probe: `target_probs`' probe, for batches whose rows' kept tokens have
            no host-known bound (a caller on which a device read is free).
    Returns:
        AcceptResult (accept_len [bs], tokens [bs, S+1] with the bonus at accept_len).
    """
    bs, width, vocab = logits.shape
    if drafts.shape != (bs, width - 1):
        raise ValueError(f"drafts {tuple(drafts.shape)} must be [{bs}, {width - 1}] for logits {tuple(logits.shape)}")
    greedy_result = greedy_accept(drafts, logits.argmax(dim=-1))
    if rows is None:  # all greedy, as the caller knows on the host (no device read here)
        return greedy_result
    if uniforms is None:
        raise ValueError("verify_block: sampled rows need pre-drawn uniforms")
    if (q_ids is None) != (q_probs is None):
        raise ValueError("verify_block: q_ids and q_probs come together")
    if q_ids is None:  # deterministic drafts: q is one-hot at the draft
        q_ids, q_probs = drafts.unsqueeze(-1), torch.ones(drafts.shape + (1,), device=logits.device)
    flat = rows.repeat(width)
    sparse = rows.sparse_bound(vocab)
    if sparse is not None and ops.backend(logits.device) == ops.BACKEND_TORCH:
        # Every row keeps at most `sparse` tokens: nothing over the vocabulary
        # past the softmax (the Triton kernel takes a dense p).
        p_ids, p_probs = target_probs_sparse(logits.reshape(-1, vocab), flat.temperature, flat.top_p,
                                             flat.top_k, flat.min_p, sparse)
        sampled = chain_rejection_sparse_p(drafts, q_ids, q_probs, p_ids.view(bs, width, -1),
                                           p_probs.view(bs, width, -1), uniforms.accept, uniforms.sample)
    else:
        p = target_probs(logits.reshape(-1, vocab).float(), flat.temperature, flat.top_p, flat.top_k, flat.min_p,
                         ranks=rows.rank_bound(vocab), probe=probe)
        sampled = chain_rejection(drafts, q_ids, q_probs, p.view(bs, width, vocab), uniforms.accept,
                                  uniforms.sample)
    greedy = rows.greedy.unsqueeze(1)
    return AcceptResult(
        accept_len=torch.where(rows.greedy, greedy_result.accept_len, sampled.accept_len),
        tokens=torch.where(greedy, greedy_result.tokens, sampled.tokens),
    )
