"""Draft-step bookkeeping in plain torch: blocks, context indices, commit plans.

Layout: one verify block per request, fixed width B, so per-request tensors
are `[bs]` and per-token tensors are `[bs, B]` (no ragged offsets).
Vocabulary (see README): the *anchor* is the last verified token (the previous
step's bonus), not yet in the KV cache; `accept_len` counts accepted draft
tokens; `commit_len = accept_len + 1` adds the bonus.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftBlock:
    token_ids: torch.Tensor  # [bs, B] int64: [anchor, mask x (B-1)]
    positions: torch.Tensor  # [bs, B] int64: prefix_len + arange(B)


def make_blocks(
    anchor: torch.Tensor, prefix_lens: torch.Tensor, mask_token_id: int, block_size: int
) -> DraftBlock:
    """Build `[anchor, MASK x (B-1)]` at positions `prefix_len .. prefix_len + B - 1`.

    Args:
        anchor: [bs] last verified token per request.
        prefix_lens: [bs] committed KV length per request (the anchor's position).
    """
    if anchor.dim() != 1 or anchor.shape != prefix_lens.shape:
        raise ValueError(
            f"anchor {tuple(anchor.shape)} and prefix_lens {tuple(prefix_lens.shape)} "
            "must both be [bs]"
        )
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    bs = anchor.shape[0]
    ids = torch.full((bs, block_size), int(mask_token_id), dtype=torch.int64, device=anchor.device)
    ids[:, 0] = anchor
    offsets = torch.arange(block_size, dtype=torch.int64, device=anchor.device)
    positions = prefix_lens.to(torch.int64).unsqueeze(1) + offsets
    return DraftBlock(token_ids=ids, positions=positions)


def context_slots(
    req_to_token_rows: torch.Tensor, prefix_lens: torch.Tensor, max_prefix: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots of each request's committed context, padded to the longest.

    Args:
        req_to_token_rows: [bs, max_context] slot ids per position.
        prefix_lens: [bs] committed lengths.
        max_prefix: max(prefix_lens) if the caller already read it to the host
            (on GPU each read is a device sync); computed here otherwise.
    Returns:
        slots [bs, L] int64 (0 where invalid) and valid [bs, L] bool, L = max(prefix_lens).
    """
    if max_prefix is None:
        max_prefix = int(prefix_lens.max()) if prefix_lens.numel() else 0
    cols = torch.arange(max_prefix, device=prefix_lens.device)
    valid = cols.unsqueeze(0) < prefix_lens.unsqueeze(1)
    slots = req_to_token_rows[:, :max_prefix].to(torch.int64)
    return torch.where(valid, slots, torch.zeros_like(slots)), valid


@dataclass
class CommitPlan:
    commit_lens: torch.Tensor  # [bs] int64: accepted drafts + bonus
    new_seq_lens: torch.Tensor  # [bs] int64: committed KV length after the step


def plan_commit(accept_len: torch.Tensor, prefix_lens: torch.Tensor) -> CommitPlan:
    """Rows 0..accept_len of the verify block (the anchor and the accepted drafts)
    are now committed tokens. The bonus is the next anchor and is not in the KV
    cache yet."""
    commit_lens = accept_len.to(torch.int64) + 1
    return CommitPlan(commit_lens=commit_lens, new_seq_lens=prefix_lens.to(torch.int64) + commit_lens)
