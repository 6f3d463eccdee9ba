"""DFlash 2 candidate-selector training: a K-way loss over the target's top-K.

For every drafted slot e (0-based over the S = B - 1 drafted positions):

* C_e = top-K ids of the target LM head applied to the drafter hidden h_e
  (ids taken from detached logits; the unary scores keep their gradient);
* when the gold token g_e is not in C_e it replaces the lowest candidate
  (index K - 1); its unary is its own logit, which is <= every kept one, so
  the candidates stay sorted;
* scores s_e[p, c] come from `select.lattice_scores`; teacher forcing picks
  the row p whose predecessor is the GOLD previous token: slot 0 reads any row
  (the predecessor is the anchor), slot e >= 1 the row of g_{e-1} in C_{e-1}
  (always present after insertion);
* loss = CE over the K scores of that row with target index(g_e), weighted by
  the same slot decay as the block objective.

Gradients reach the codebooks, the hidden projection and (through the unary
and h_e) the drafter body.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..candidates import Candidates, transform_unary
from ..select import lattice_scores
from .objective import slot_weights


@dataclass(frozen=True)
class SelectorLoss:
    loss: torch.Tensor  # [] weighted mean K-way CE
    accuracy: torch.Tensor  # [] teacher-forced selector top-1 == gold (unweighted)
    gold_in_topk: torch.Tensor  # [] fraction of counted slots whose gold was in the top-K
    slot_accuracy: torch.Tensor  # [S]


def candidates_with_gold(logits: torch.Tensor, gold: torch.Tensor, k: int,
                         output_multiplier: float = 1.0, softcap: float | None = None):
    """Top-K candidates with the gold token inserted.

    Args:
        logits: [N, S, V] draft logits (with grad); gold: [N, S] int64.
    Returns:
        Candidates (ids [N, S, K], unary [N, S, K] with grad), gold_index [N, S]
        and was_in_topk [N, S] bool.
    """
    ids = logits.detach().topk(k, dim=-1).indices  # [N, S, K]
    hit = ids == gold.unsqueeze(-1)
    in_topk = hit.any(-1)
    ids = ids.clone()
    ids[..., -1] = torch.where(in_topk, ids[..., -1], gold)
    gold_index = torch.where(in_topk, hit.long().argmax(-1), torch.full_like(gold, k - 1))
    unary = transform_unary(logits.gather(-1, ids), output_multiplier, softcap)
    return Candidates(ids=ids, unary=unary), gold_index, in_topk


def selector_kway_loss(drafter, hidden: torch.Tensor, logits: torch.Tensor,
                       anchor: torch.Tensor, gold: torch.Tensor, counted: torch.Tensor,
                       gamma: float = 7.0) -> SelectorLoss:
    """Teacher-forced K-way CE of the candidate selector.

    Args:
        drafter: a DFlash 2 drafter (cfg.selector_top_k, candidate_selector).
        hidden: [N, S, H] drafter hidden at the drafted slots.
        logits: [N, S, V] target-head logits of `hidden` (float32).
        anchor: [N] block anchor tokens; gold: [N, S] labels; counted: [N, S] bool.
    """
    cfg, sel = drafter.cfg, drafter.candidate_selector
    if sel is None:
        raise ValueError("selector_kway_loss needs a DFlash 2 drafter with a candidate selector")
    cands, gold_index, in_topk = candidates_with_gold(
        logits, gold, cfg.selector_top_k, cfg.output_multiplier, cfg.final_logit_softcapping)
    scores = lattice_scores(cands, hidden.float(), anchor, sel.predecessor_codebook,
                            sel.successor_codebook, sel.hidden_projection.weight)  # [N,S,K,K]
    rows = torch.cat((torch.zeros_like(gold_index[:, :1]), gold_index[:, :-1]), dim=1)  # [N, S]
    k = scores.shape[-1]
    row_scores = scores.gather(2, rows[:, :, None, None].expand(-1, -1, 1, k)).squeeze(2)
    ce = F.cross_entropy(row_scores.transpose(1, 2), gold_index, reduction="none")  # [N, S]
    weights = slot_weights(gold.shape[1] + 1, gamma).to(ce.device) * counted
    loss = (ce * weights).sum() / weights.sum().clamp(min=1e-9)
    hits = (row_scores.argmax(-1) == gold_index) & counted
    n = counted.sum().clamp(min=1)
    return SelectorLoss(loss=loss, accuracy=hits.sum() / n,
                        gold_in_topk=(in_topk & counted).sum() / n,
                        slot_accuracy=hits.sum(0) / counted.sum(0).clamp(min=1))
