"""Per-request truncation of the verified block (ragged verify), in plain torch.

The policy picks one verify width W for the whole batch; within it, request i
verifies only its first n_i <= W drafts, those the drafter is confident about.
At a large batch every verified token costs real compute, and drafts after a
low-confidence one are seldom accepted: cutting them saves verify work where
it buys least. Measured offline on the demo pair (greedy reference loop, 16
prompts per workload), the selector's confidence is calibrated enough that
per-slot acceptance climbs from ~0.4 at confidence 0.4-0.5 to 0.91-0.97 above
0.9, and truncation at a survival threshold of 0.5 keeps ~90-95% of the
committed tokens while verifying ~25-35% fewer (benchmark/RESULTS.md).

Rule: the survival of draft k is the running product of the confidences
c_1..c_k; request i verifies the longest prefix of its W drafts whose
survival stays >= `threshold` (0 keeps all W). n_i = 0 is allowed: that
request verifies only its anchor, i.e. decodes plainly this step.

Why lossless: verification of any prefix of the drafts is exact (greedy by
match, sampling by chain rejection with the bonus drawn from p after the last
verified draft). Under sampling the decision to verify draft k must not depend
on draft k's own value, or the accepted tokens would be biased toward tokens
the drafter likes; c_k is therefore the walk's peak probability at slot k
(`select.path_confidence`), a function of the slot's score row, which the
previous choices fix, and never of the token drawn there.
"""

from __future__ import annotations

import torch

from sglang_dflash.propose import Proposal
from sglang_dflash.verify import VerifyUniforms


def draft_limits(confidence: torch.Tensor, width: int, threshold: float) -> torch.Tensor:
    """Drafts to verify per request.

    Args:
        confidence: [bs, S] float in [0, 1], S >= width; c_k of drafted slot k.
        width: W, the step's verify width (drafts per request at most).
        threshold: survival floor in [0, 1); 0 verifies all W.
    Returns:
        [bs] int64 n_i in [0, W]: the number of leading k <= W with
        prod_{j <= k} c_j >= threshold.
    """
    if confidence.dim() != 2 or confidence.shape[1] < width:
        raise ValueError(f"confidence {tuple(confidence.shape)} must be [bs, S >= {width}]")
    bs = confidence.shape[0]
    if width == 0 or threshold <= 0:
        return torch.full((bs,), width, dtype=torch.int64, device=confidence.device)
    survival = torch.cumprod(confidence[:, :width].float().clamp(0, 1), dim=1)  # [bs, W]
    # Survival is non-increasing in k, so the kept slots are a prefix.
    return (survival >= threshold).sum(dim=1)


def verify_mask(limits: torch.Tensor, num_verify: int) -> torch.Tensor:
    """[bs, W+1] bool: block rows each request verifies (anchor + n_i drafts)."""
    rows = torch.arange(num_verify, device=limits.device)
    return rows.unsqueeze(0) <= limits.unsqueeze(1)


def narrow_step(proposal: Proposal, uniforms: VerifyUniforms, width: int) -> tuple[Proposal, VerifyUniforms]:
    """A step's proposal and verify draws cut to its first `width` drafts.

    When every request's limit is <= width, the step verifies that narrower
    block (rectangular when all limits equal it) rather than a padded ragged
    block of the policy's W. The uniforms keep their columns (draft k's accept
    test, the bonus draw at each accept length), so the narrowed step decides
    exactly as the wide ragged step with the same limits would."""
    return proposal.first(width), VerifyUniforms(accept=uniforms.accept[:, :width],
                                                 sample=uniforms.sample[:, : width + 1])
