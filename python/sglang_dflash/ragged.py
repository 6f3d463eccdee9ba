"""Index arithmetic over ragged runs (one run of consecutive integers per
request), in plain torch and without `torch.repeat_interleave`; and the gather
of paged K/V rows by a per-request slot table (`gather_rows`).

Why not `repeat_interleave`: its CPU kernel hands even a 16-element repeat to
the intra-op thread pool, and on a loaded 2-core host the calling thread then
waits for a descheduled worker thread. Inside a serving scheduler at batch 16
the KV-slot assignment built on it took 650 us mean and 1.3 ms at p90 per call
(35 us on an idle host), about 4% of a W = 0 step that plain decoding does not
pay. Elementwise ops, boolean masks and gathers this small run inline
(torch parallelizes them only above ~32k elements).
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


def unpack_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Packed rows [n, ...] -> the padded [rows.numel(), ...] layout, where
    `rows` [bs, W] (or flat) marks the rows that are really there, as a prefix
    of each request's row block starting with its first row (a ragged verify:
    every request verifies its anchor). A row that is not there holds a copy of
    the row before it (its request's last real row), for callers that never
    read it. One gather: no zero fill, no mask scatter (at batch 64 a verify's
    logits are 512 x V)."""
    index = (torch.cumsum(rows.reshape(-1).to(torch.int64), dim=0) - 1).clamp(min=0)
    return packed.index_select(0, index)


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
