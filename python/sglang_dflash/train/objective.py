"""Block-diffusion training objective for DFlash drafters.

For a token sequence tok[0..T) whose target features feat[0..T) are known:

* pick anchors a (positions whose next token is a training label);
* the block is [tok[a], MASK x (B-1)] at positions a .. a+B-1;
* the context is feat[p] for p < a only, injected as K/V through the
  drafter's `context_kv` path with a validity mask: nothing at or after the
  anchor leaks into the block (at decode time the anchor is the bonus token,
  which the target has not yet run);
* the label at block slot k (1..B-1) is tok[a+k];
* logits = drafter hidden @ target lm_head^T, and the loss is a weighted CE

      loss = sum_{a,k} w_k * mask[a,k] * CE(logits[a,k], tok[a+k]) / sum_{a,k} w_k * mask[a,k]

  with w_k = exp(-(k-1) / gamma). Later slots are only useful when every
  earlier one is accepted, so they matter less; gamma = 7 is SpecForge's
  `--loss-decay-gamma` default for DFlash (docs/design.md §8).

Labels past the sequence end, or at positions the caller's `loss_mask`
excludes (prompt tokens, padding), are ignored. Anchors are drawn only where
the first label tok[a+1] counts, and with a >= 1 so the context is non-empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import DFlashDrafter, reference_draft_logits


@dataclass(frozen=True)
class ObjectiveConfig:
    num_anchors: int = 16  # blocks drawn per sequence per step
    gamma: float = 7.0  # slot-weight decay, w_k = exp(-(k-1)/gamma)
    min_anchor: int = 1  # smallest anchor position (context needs >= 1 token)

    def __post_init__(self):
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors = {self.num_anchors} must be >= 1")
        if not self.gamma > 0:
            raise ValueError(f"gamma = {self.gamma} must be > 0")
        if self.min_anchor < 1:
            raise ValueError(f"min_anchor = {self.min_anchor} must be >= 1")


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # [] weighted mean CE
    accuracy: torch.Tensor  # [] top-1 accuracy over counted labels (unweighted)
    slot_accuracy: torch.Tensor  # [B-1] top-1 accuracy per slot k = 1..B-1
    num_labels: int

    @property
    def first_accuracy(self) -> torch.Tensor:
        return self.slot_accuracy[0]


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1 -> [B-1] float32."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator,
                   min_anchor: int = 1):
    """Draw distinct anchors per sequence, uniformly among eligible positions.

    A position a is eligible when min_anchor <= a and loss_mask[a + 1] is True
    (its first label counts).

    Args:
        loss_mask: [bs, T] bool, True where tok[p] may be a label.
    Returns:
        anchors [bs, A] int64 with A = min(num_anchors, T) (sorted, valid
        first; padding entries are 0) and anchor_valid [bs, A] bool.
    """
    bs, seq_len = loss_mask.shape
    eligible = torch.zeros_like(loss_mask)
    eligible[:, min_anchor:seq_len - 1] = loss_mask[:, min_anchor + 1:]
    # Random keys in [0, 1), -1 where ineligible: the top-A keys are a uniform sample.
    keys = torch.rand(bs, seq_len, generator=generator).masked_fill(~eligible, -1.0)
    count = min(num_anchors, seq_len)
    top, idx = keys.topk(count, dim=1)
    valid = top >= 0
    anchors = torch.where(valid, idx, torch.zeros_like(idx))
    order = torch.argsort(anchors + (~valid).long() * seq_len, dim=1)
    return anchors.gather(1, order), valid.gather(1, order)


def block_labels(tokens: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                 anchor_valid: torch.Tensor, block_size: int):
    """Labels tok[a+k] for slots k = 1..B-1 and whether each counts.

    Args:
        tokens, loss_mask: [bs, T]; anchors, anchor_valid: [bs, A].
    Returns:
        labels [bs, A, B-1] int64 (0 where not counted), label_mask [bs, A, B-1] bool.
    """
    seq_len = tokens.shape[1]
    offsets = torch.arange(1, block_size, device=tokens.device)
    pos = anchors.unsqueeze(-1) + offsets  # [bs, A, B-1]
    inside = pos < seq_len
    pos = pos.clamp(max=seq_len - 1)
    flat = pos.flatten(1)  # [bs, A*(B-1)]
    labels = tokens.gather(1, flat).view_as(pos)
    counted = loss_mask.gather(1, flat).view_as(pos) & inside & anchor_valid.unsqueeze(-1)
    return torch.where(counted, labels, torch.zeros_like(labels)), counted


def context_mask(anchors: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[bs, A] anchors -> [bs, A, T] bool: context position p is visible iff p < a."""
    positions = torch.arange(seq_len, device=anchors.device)
    return positions < anchors.unsqueeze(-1)


def draft_hidden_for_anchors(drafter: DFlashDrafter, features: torch.Tensor,
                             tokens: torch.Tensor, anchors: torch.Tensor,
                             embed, mask_token_id: int) -> torch.Tensor:
    """Run the drafter on every (sequence, anchor) block.

    Context K/V are computed once per sequence (`context_kv` over all T
    positions) and shared by its blocks; each block sees only p < a.

    Args:
        features: [bs, T, n*H] target features; tokens: [bs, T]; anchors: [bs, A].
        embed: the target's input embedding module.
    Returns:
        hidden [bs*A, B, H].
    """
    bs, seq_len = tokens.shape
    num_anchors, block = anchors.shape[1], drafter.cfg.block_size
    positions = torch.arange(seq_len, device=tokens.device)
    ctx = drafter.context_features(features.flatten(0, 1))  # [bs*T, H]
    ctx_k, ctx_v = drafter.context_kv(ctx, positions.repeat(bs))  # [nl, bs*T, kvh, d]
    ctx_k = ctx_k.unflatten(1, (bs, seq_len)).repeat_interleave(num_anchors, dim=1)
    ctx_v = ctx_v.unflatten(1, (bs, seq_len)).repeat_interleave(num_anchors, dim=1)
    valid = context_mask(anchors, seq_len).flatten(0, 1)  # [bs*A, T]
    block_ids = torch.full((bs * num_anchors, block), mask_token_id, device=tokens.device)
    block_ids[:, 0] = tokens.gather(1, anchors).flatten()
    block_pos = anchors.flatten().unsqueeze(-1) + torch.arange(block, device=tokens.device)
    return drafter.forward_block(embed(block_ids), block_pos, ctx_k, ctx_v, valid)


def block_diffusion_loss(drafter: DFlashDrafter, features: torch.Tensor, tokens: torch.Tensor,
                         loss_mask: torch.Tensor, anchors: torch.Tensor,
                         anchor_valid: torch.Tensor, embed, lm_head_weight: torch.Tensor,
                         mask_token_id: int, gamma: float) -> LossOutput:
    """Weighted block CE (see module docstring) for given anchors.

    Args:
        features: [bs, T, n*H]; tokens, loss_mask: [bs, T]; anchors, anchor_valid: [bs, A];
        lm_head_weight: [V, H] target head (frozen).
    """
    hidden = draft_hidden_for_anchors(drafter, features, tokens, anchors, embed, mask_token_id)
    logits = reference_draft_logits(hidden[:, 1:], lm_head_weight)  # [bs*A, B-1, V]
    labels, counted = block_labels(tokens, loss_mask, anchors, anchor_valid,
                                   drafter.cfg.block_size)
    return weighted_block_ce(logits, labels.flatten(0, 1), counted.flatten(0, 1), gamma)


def weighted_block_ce(logits: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor,
                      gamma: float) -> LossOutput:
    """The weighted CE of `block_diffusion_loss` from draft logits.

    Args:
        logits: [N, B-1, V] draft logits; labels, counted: [N, B-1].
    """
    block = logits.shape[1] + 1
    ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [bs*A, B-1]
    weights = slot_weights(block, gamma).to(ce.device) * counted
    loss = (ce * weights).sum() / weights.sum().clamp(min=1e-9)
    hits = (logits.argmax(-1) == labels) & counted
    return LossOutput(
        loss=loss,
        accuracy=hits.sum() / counted.sum().clamp(min=1),
        slot_accuracy=hits.sum(0) / counted.sum(0).clamp(min=1),
        num_labels=int(counted.sum()),
    )


def expected_acceptance(per_slot_accuracy: torch.Tensor) -> float:
    """Rough AL from per-slot accuracies [B-1]: 1 + sum_k prod_{j<=k} acc_j."""
    return 1.0 + float(torch.cumprod(per_slot_accuracy, 0).sum())
