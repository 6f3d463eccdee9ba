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

from sglang_dflash.ops import selector_walk
from sglang_dflash.select import dense_q, lattice_scores
from sglang_dflash.vocab_head import VocabHead


@dataclass
class Proposal:
    drafts: torch.Tensor  # [bs, S] int64 drafted tokens for block positions 1..S
    q: Optional[torch.Tensor]  # [bs, S, V] float32 dense q, or None: one-hot (argmax) draft or all greedy

    def first(self, width: int) -> Proposal:
        """The proposal of the first `width` slots (views, no copy)."""
        q = None if self.q is None else self.q[:, :width]
        return Proposal(drafts=self.drafts[:, :width], q=q)


def propose_argmax(hidden: torch.Tensor, head: VocabHead) -> Proposal:
    """DFlash v1. hidden: [bs, S, H] drafter states at block positions 1..S."""
    return Proposal(drafts=head.argmax(hidden), q=None)


def propose_selector(
    drafter,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    head: VocabHead,
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
        head: the target's LM head (this rank's shard under tensor parallelism).
        temperature: [bs]; greedy: [bs] bool; uniforms: [bs, S] pre-drawn.
        all_greedy: the caller knows on the host that every row is greedy
            (SGLang's `is_all_greedy`): the walk skips the softmax and CDF.
    Returns:
        drafts and the dense q over the target vocabulary (zero outside the
        candidates; one-hot for greedy rows), or q = None when `all_greedy`.
    """
    cfg = drafter.cfg
    cands = head.topk(hidden, cfg.selector_top_k, output_multiplier=cfg.output_multiplier,
                      softcap=cfg.final_logit_softcapping)
    sel = drafter.candidate_selector
    scores = lattice_scores(
        cands, hidden.float(), anchor, sel.predecessor_codebook, sel.successor_codebook,
        sel.hidden_projection.weight,
    )
    # The Triton kernel on CUDA, the torch twin elsewhere (ops/__init__.py).
    path = selector_walk(scores, cands.ids, temperature.float(), greedy, uniforms, all_greedy=all_greedy)
    # An all-greedy batch's verify never reads q (greedy acceptance compares
    # argmaxes): no [bs, S, V] float32 tensor for it.
    q = None if all_greedy else dense_q(path.q, cands.ids, head.vocab)
    return Proposal(drafts=path.tokens, q=q)
