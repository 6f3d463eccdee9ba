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
from sglang_dflash.select import lattice_scores
from sglang_dflash.vocab_head import VocabHead


@dataclass
class Proposal:
    drafts: torch.Tensor  # [bs, S] int64 drafted tokens for block positions 1..S
    # The walk's q over each slot's K candidates (DFlash 2), or None: a
    # deterministic draft (DFlash v1 argmax), whose q is one-hot.
    q_probs: Optional[torch.Tensor] = None  # [bs, S, K] float32
    q_ids: Optional[torch.Tensor] = None  # [bs, S, K] int64 the candidates q_probs is over

    def first(self, width: int) -> Proposal:
        """The proposal of the first `width` slots (views, no copy)."""
        cut = lambda t: None if t is None else t[:, :width]  # noqa: E731
        return Proposal(self.drafts[:, :width], cut(self.q_probs), cut(self.q_ids))

    def rows(self, n: int) -> Proposal:
        """The proposal of the first `n` requests (views, no copy)."""
        cut = lambda t: None if t is None else t[:n]  # noqa: E731
        return Proposal(self.drafts[:n], cut(self.q_probs), cut(self.q_ids))


def propose(drafter, hidden: torch.Tensor, anchor: torch.Tensor, head: VocabHead,
            temperature: torch.Tensor, greedy: torch.Tensor, uniforms: torch.Tensor, *,
            all_greedy: bool = False) -> Proposal:
    """The drafter version's proposal from its block states (arguments as
    `propose_selector`; v1 reads only hidden and head)."""
    if drafter.cfg.version == 1:
        return propose_argmax(hidden, head)
    return propose_selector(drafter, hidden, anchor, head, temperature, greedy, uniforms,
                            all_greedy=all_greedy)


def propose_argmax(hidden: torch.Tensor, head: VocabHead) -> Proposal:
    """DFlash v1. hidden: [bs, S, H] drafter states at block positions 1..S."""
    return Proposal(drafts=head.argmax(hidden))


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
        drafts and the walk's q over each slot's candidates (one-hot for
        greedy rows).
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
    return Proposal(drafts=path.tokens, q_probs=path.q, q_ids=cands.ids)
