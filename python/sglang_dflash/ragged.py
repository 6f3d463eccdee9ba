"""Index arithmetic over ragged runs (one run of consecutive integers per
request), in plain torch and without `torch.repeat_interleave`; and the gather
of paged K/V rows by a per-request slot table (`gather_rows`).

Why not `repeat_interleave`: its CPU kernel hands even a 16-element repeat to
the intra-op thread pool, and on a loaded host the calling thread then waits
for a descheduled worker thread (a measurable share of a W = 0 step). The
elementwise ops, masks and gathers used here run inline at these sizes.
"""

from __future__ import annotations

import torch


# Below this many values the runs are built in Python lists: a handful of
# list operations and two tensor constructions, no torch kernel that could
# enter the thread pool (measured in the serving scheduler at batch 16, per
# call: repeat_interleave 650 us mean, the torch grid below 70 us, lists 38 us).
_LIST_MAX_VALUES = 4096


def ragged_runs(starts: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The runs starts[i], starts[i] + 1, ..., starts[i] + lens[i] - 1, back to
    back in order, flattened.

    Args:
        starts, lens: [n] integer tensors on one device (lens >= 0).
    Returns:
        (run, value): [total] int64 each, on that device; run[j] is the i whose
        run value[j] belongs to.
    """
    if lens.device.type == "cpu":
        lens_list = lens.tolist()
        if sum(lens_list) <= _LIST_MAX_VALUES:
            run = [i for i, n in enumerate(lens_list) for _ in range(n)]
            value = [a + k for a, n in zip(starts.tolist(), lens_list) for k in range(n)]
            return torch.tensor(run, dtype=torch.int64), torch.tensor(value, dtype=torch.int64)
    lens = lens.long()
    width = int(lens.max()) if lens.numel() else 0
    offsets = torch.arange(width, device=lens.device)
    keep = offsets.view(1, -1) < lens.view(-1, 1)  # [n, width]
    run = torch.arange(lens.numel(), device=lens.device).view(-1, 1).expand_as(keep)[keep]
    value = (starts.long().view(-1, 1) + offsets.view(1, -1))[keep]
    return run, value


def gather_rows(cache: torch.Tensor, slots: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """cache.index_select(dim, slots) for a [n, L] slot table: the rows as
    [..., n, L, ...] (dim `dim` of `cache` replaced by n, L).

    Why not `cache[slots]`: advanced indexing with a 2-D index runs torch's
    generic index kernel, 1.5-4.5x slower on CPU than index_select on the
    flattened table (for a [8, 400] table of 512-byte rows: ~310 against
    ~55 us), and the verify and draft steps gather every layer's K and V
    this way. int32 and int64 tables both work without a cast."""
    n, length = slots.shape
    rows = cache.index_select(dim, slots.reshape(-1))
    return rows.unflatten(dim, (n, length))
