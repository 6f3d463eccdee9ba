"""From the drafter's block hidden states to one drafted path per request.

DFlash v1: the argmax of the target LM head at each drafted position (a
deterministic draft, one-hot q). DFlash 2: top-K candidates per position, the
selector's pair scores, and a greedy or sampled walk that returns the exact
distribution q it drew each token from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dflash.candidates import head_logits, topk_candidates
from sglang_dflash.ops import selector_walk
from sglang_dflash.select import dense_q, lattice_scores


@dataclass
class Proposal:
    drafts: torch.Tensor  # [bs, S] int64 drafted tokens for block positions 1..S
    q: Optional[torch.Tensor]  # [bs, S, V] float32 dense q, or None for a one-hot (argmax) draft

    def first(self, width: int) -> Proposal:
        """The proposal of the first `width` slots (views, no copy)."""
        q = None if self.q is None else self.q[:, :width]
        return Proposal(drafts=self.drafts[:, :width], q=q)


def propose_argmax(hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> Proposal:
    """DFlash v1. hidden: [bs, S, H] drafter states at block positions 1..S."""
    return Proposal(drafts=head_logits(hidden, lm_head_weight).argmax(dim=-1), q=None)


def propose_selector(
    drafter,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    lm_head_weight: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    all_greedy: bool = False,
) -> Proposal:
    """DFlash 2.

    Args:
        drafter: a DFlash 2 `DFlashDrafter` (its cfg and candidate_selector).
        hidden: [bs, S, H]; anchor: [bs] the verified token before the block.
        temperature: [bs]; greedy: [bs] bool; uniforms: [bs, S] pre-drawn.
        all_greedy: the caller knows on the host that every row is greedy
            (SGLang's `is_all_greedy`): the walk skips the softmax and CDF.
    Returns:
        drafts and the dense q over the target vocabulary (zero outside the
        candidates; one-hot for greedy rows).
    """
    cfg = drafter.cfg
    vocab = lm_head_weight.shape[0]
    cands = topk_candidates(
        hidden, lm_head_weight, cfg.selector_top_k,
        output_multiplier=cfg.output_multiplier, softcap=cfg.final_logit_softcapping,
    )
    sel = drafter.candidate_selector
    scores = lattice_scores(
        cands, hidden.float(), anchor, sel.predecessor_codebook, sel.successor_codebook,
        sel.hidden_projection.weight,
    )
    # The Triton kernel on CUDA, the torch twin elsewhere (ops/__init__.py).
    path = selector_walk(scores, cands.ids, temperature.float(), greedy, uniforms, all_greedy=all_greedy)
    return Proposal(drafts=path.tokens, q=dense_q(path.q, cands.ids, vocab))
