"""The drafter's context: target features of committed tokens, as drafter K/V.

The drafter attends to context K/V projected from the target's hidden states
of every committed token (docs/design.md §2). Rows live in `DraftKVCache`, indexed
by the target's own KV slot ids. `DraftContext` decides when they are written:

* a committed row must be in the cache before the drafter next reads it;
* while speculation is off (W = 0) nothing reads it, so the worker may defer
  rows: they are queued and projected in one pass when the cache is next read
  (or a prefill writes, or the queue is full). On a CPU server one projection
  of N rows costs far less than N / bs small ones per step (the per-step
  projection was ~8% of a W = 0 step with the demo pair).

Slot reuse: a finished request's slots may be handed to another request while
its rows still wait in the queue. Rows are applied in commit order with the
last row per slot winning, which is what writing them eagerly would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sglang_dflash.draft import context_slots
from sglang_dflash.model import PagedContext
from sglang_dflash.ragged import gather_rows

@dataclass
class GatheredContext:
    """The drafter's context for one step, copied out of the cache and padded."""

    k: torch.Tensor  # [num_layers, bs, L, kv_heads, head_dim] L = longest context
    v: torch.Tensor  # [num_layers, bs, L, kv_heads, head_dim]
    valid: torch.Tensor  # [bs, L] bool: position j < the request's context length


# (features [N, F], positions [N]) -> k, v [num_layers, N, kv_heads, head_dim]
Projector = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class DraftKVCache:
    """Per-layer context K/V of the drafter, one row per target KV slot.

    Invariants: row `s` holds the drafter's context K/V of the committed token
    that the target stores in slot `s` (RoPE at that token's absolute position)
    once `DraftContext` has flushed; rows are read only for committed positions
    of a request that owns the slot, so stale rows of freed or rejected slots
    are never read before being overwritten.
    """

    def __init__(self, *, num_layers, num_slots, num_kv_heads, head_dim, dtype, device):
        # One row past the target's slots: a write-only sink for rows that must
        # not land anywhere (see `DraftContext.flush`).
        shape = (num_layers, num_slots + 1, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def num_slots(self) -> int:
        return self.k.shape[1] - 1

    @property
    def sink(self) -> int:
        """A row id no target slot maps to; never read."""
        return self.k.shape[1] - 1

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [N] (distinct); k, v [num_layers, N, kv_heads, head_dim]."""
        self.k[:, slots] = k.to(self.k.dtype)
        self.v[:, slots] = v.to(self.v.dtype)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots [bs, L] -> k, v [num_layers, bs, L, kv_heads, head_dim]."""
        return gather_rows(self.k, slots, dim=1), gather_rows(self.v, slots, dim=1)


def last_per_slot(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """[N] bool: True at the last occurrence of each slot id (no device sync)."""
    order = torch.arange(slots.numel(), device=slots.device)
    last = torch.full((num_slots,), -1, dtype=order.dtype, device=slots.device)
    last.scatter_reduce_(0, slots, order, reduce="amax")
    return last[slots] == order


class DraftContext:
    """Committed rows -> drafter K/V, written eagerly or deferred until read."""

    def __init__(self, kv: DraftKVCache, project: Projector, max_pending_bytes: int = 64 << 20,
                 deferrable: bool = True):
        self.kv = kv
        self.project = project
        # False: `defer` is ignored and every row is written at once (something
        # outside this class reads or writes the pool's rows).
        self.deferrable = deferrable
        self.max_pending_bytes = int(max_pending_bytes)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending_bytes = 0
        self.flushes = 0  # deferred batches projected (visible for tests and stats)

    @property
    def pending_rows(self) -> int:
        return sum(int(s.numel()) for _, _, s in self._pending)

    def commit(self, features, positions, slots, *, defer: bool = False) -> None:
        """Rows of committed tokens: features [N, F], positions [N], slots [N].

        Not deferred: earlier deferred rows are written first (a row written
        now may reuse a slot an older deferred row names).
        """
        if slots.numel() == 0:
            return
        slots, positions = slots.to(torch.int64), positions.to(torch.int64)
        if defer and self.deferrable:
            self._pending.append((features, positions, slots))
            self._pending_bytes += features.numel() * features.element_size()
            if self._pending_bytes > self.max_pending_bytes:
                self.flush()
            return
        self.flush()
        self._write(features, positions, slots)

    def flush(self) -> None:
        """Project and write every deferred row in one pass."""
        if not self._pending:
            return
        features, positions, slots = (torch.cat(parts) for parts in zip(*self._pending))
        self._pending, self._pending_bytes = [], 0
        # Only the last row per slot may land. Rows superseded later in the
        # queue are sent to the sink rather than dropped: selecting rows by
        # mask is a host read of the mask (a device sync on a GPU).
        keep = last_per_slot(slots, self.kv.num_slots)
        self._write(features, positions, torch.where(keep, slots, self.kv.sink))
        self.flushes += 1

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Context K/V at slots [bs, L]; deferred rows are written first."""
        self.flush()
        return self.kv.gather(slots)

    def gathered(self, rows: torch.Tensor, prefix_lens: torch.Tensor, max_prefix: int) -> GatheredContext:
        """Each request's context K/V copied out and padded to the longest
        (`max_prefix`, read on the host by the caller); rows: [bs, >= max_prefix]
        slot-table rows."""
        slots, valid = context_slots(rows, prefix_lens, max_prefix)
        k, v = self.gather(slots)
        return GatheredContext(k, v, valid)

    def paged(self, req_to_token, req_pool_indices, prefix_lens) -> PagedContext:
        """The cache itself and the slot table, for a drafter pass that reads its
        context in place; deferred rows are written first."""
        self.flush()
        return PagedContext(self.kv.k, self.kv.v, req_to_token, req_pool_indices, prefix_lens)

    def _write(self, features, positions, slots) -> None:
        k, v = self.project(features, positions)
        self.kv.write(slots, k, v)
