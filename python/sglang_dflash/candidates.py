"""Top-K candidate tokens per drafted position (DFlash 2, docs/design.md §5).

The drafter's hidden state at each drafted position is projected through the
*target* LM head, restricted to the real vocabulary, and the K best tokens are
kept together with their unary scores (`VocabHead.topk` in `vocab_head.py`,
built from the pieces here). The selector (`select.py`) then chooses one path
through these candidates.

Unary transform, applied to the K kept logits only:

    unary = logits * output_multiplier
    unary = softcap * tanh(unary / softcap)      # only when softcap > 0

Both steps are strictly increasing, so taking the top-K of the raw logits and
transforming afterwards keeps the same ids in the same order as transforming
the whole vocabulary first, at K/V of the cost.

Tensor parallelism: each rank computes a top-K over its own vocabulary shard
(ids shifted by the shard's offset into the global vocabulary), the ranks
all-gather `[tp, bs, S, K]` values and ids, and `merge_shard_topk` takes the
global top-K. This moves O(tp * K) values per position instead of O(V).

Imports torch and the stdlib only.
"""

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Candidates:
    """The K candidate tokens of every drafted position.

    Invariant: along the last dimension, `unary` is non-increasing, so index 0
    is each position's best candidate.
    """

    ids: torch.Tensor  # [bs, S, K] int64 token ids, sorted by unary score descending
    unary: torch.Tensor  # [bs, S, K] float32 transformed unary scores


def transform_unary(
    logits: torch.Tensor, output_multiplier: float = 1.0, softcap: Optional[float] = None
) -> torch.Tensor:
    """Apply the DFlash 2 unary transform (multiplier, then optional softcap).

    Args:
        logits: [...] float32 raw logits.
        output_multiplier: scale applied first.
        softcap: `cap * tanh(x / cap)` when a positive number, else skipped.

    Returns:
        [...] float32 transformed scores, same shape as `logits`.
    """
    unary = logits.float() * output_multiplier
    if softcap is not None and softcap > 0:
        unary = softcap * torch.tanh(unary / softcap)
    return unary


def merge_shard_topk(
    values: torch.Tensor, ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-K from the per-shard top-K of every tensor-parallel rank.

    Exact: every global top-K element is within the top-K of its own shard, so
    the union of the shard top-Ks contains the global top-K.

    Args:
        values: [tp, bs, S, K_shard] per-shard top-K values (all-gathered).
        ids: [tp, bs, S, K_shard] matching GLOBAL token ids (shard offset
            already added).
        k: candidates to keep, 1 <= k <= tp * K_shard.

    Returns:
        (values [bs, S, k], ids [bs, S, k] int64), sorted by value descending.

    Raises:
        ValueError: if the shapes differ, are not 4-D, or k is out of range.
    """
    if values.dim() != 4:
        raise ValueError(f"values must be [tp, bs, S, K], got shape {tuple(values.shape)}")
    if ids.shape != values.shape:
        raise ValueError(
            f"ids shape {tuple(ids.shape)} must equal values shape {tuple(values.shape)}"
        )
    tp, bs, num_slots, k_shard = values.shape
    if not 1 <= k <= tp * k_shard:
        raise ValueError(f"k={k} must be in [1, tp * K_shard = {tp * k_shard}]")
    # [tp, bs, S, K] -> [bs, S, tp * K]: line every shard's candidates up per position.
    flat_values = values.permute(1, 2, 0, 3).reshape(bs, num_slots, tp * k_shard)
    flat_ids = ids.permute(1, 2, 0, 3).reshape(bs, num_slots, tp * k_shard)
    top_values, where = torch.topk(flat_values, k, dim=-1, largest=True, sorted=True)
    return top_values, torch.gather(flat_ids, -1, where).to(torch.int64)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits `hidden @ weight.T` as float32, computed in the head's dtype.

    A low-precision head (bf16/fp16) is never upcast: a float32 copy of an 8B
    target's head is about 2.5 GB per step. The matmul runs in the head's
    dtype with float32 accumulation (cuBLAS writes float32 directly through
    `out_dtype`; elsewhere the kernel's float32 accumulator is rounded once to
    the head's dtype and the [N, V] result is upcast, never the [V, H] head).
    Candidate order may then tie where float32 would not; the selector's q is
    computed from these same scores, so acceptance stays exact.

    Args:
        hidden: [bs, S, H].
        weight: [V, H].

    Returns:
        [bs, S, V] float32.
    """
    # One 2-D matmul on contiguous rows: the drafter's hidden states arrive as a
    # strided slice ([:, 1:] of its block), and a 3-D matmul on a strided input
    # is about 2x slower on CPU.
    rows = hidden.reshape(-1, hidden.shape[-1])
    if weight.dtype == torch.float32:
        logits = torch.mm(rows.float(), weight.t())
    else:
        logits = _mm_float32_out(rows.to(weight.dtype), weight)
    return logits.view(*hidden.shape[:-1], weight.shape[0])


def _mm_float32_out(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[N, H] x [V, H]^T -> [N, V] float32 without copying `weight`."""
    if rows.is_cuda:
        try:
            return torch.mm(rows, weight.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # torch without mm(out_dtype=) for this dtype
            pass
    return torch.mm(rows, weight.t()).float()
