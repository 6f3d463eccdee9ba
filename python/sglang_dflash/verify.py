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

from sglang_dflash.ops import chain_rejection
from sglang_dflash.rejection import AcceptResult, greedy_accept, target_probs


@dataclass
class SamplingRows:
    temperature: torch.Tensor  # [bs] float32 (1.0 for greedy rows)
    top_p: torch.Tensor  # [bs] float32
    top_k: torch.Tensor  # [bs] int64, 1 for greedy rows
    min_p: torch.Tensor  # [bs] float32

    @property
    def greedy(self) -> torch.Tensor:
        """[bs] bool rows decoded greedily."""
        return self.top_k <= 1

    def repeat(self, n: int) -> "SamplingRows":
        """Each row repeated n times (one per verify position), flattened."""
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
    flat = rows.repeat(width)
    p = target_probs(logits.reshape(-1, vocab).float(), flat.temperature, flat.top_p, flat.top_k, flat.min_p)
    p = p.view(bs, width, vocab)
    if (q_ids is None) != (q_probs is None):
        raise ValueError("verify_block: q_ids and q_probs come together")
    if q_ids is None:  # deterministic drafts: q is one-hot at the draft
        q_ids, q_probs = drafts.unsqueeze(-1), torch.ones(drafts.shape + (1,), device=p.device)
    sampled = chain_rejection(drafts, q_ids, q_probs, p, uniforms.accept, uniforms.sample)
    greedy = rows.greedy.unsqueeze(1)
    return AcceptResult(
        accept_len=torch.where(rows.greedy, greedy_result.accept_len, sampled.accept_len),
        tokens=torch.where(greedy, greedy_result.tokens, sampled.tokens),
    )
