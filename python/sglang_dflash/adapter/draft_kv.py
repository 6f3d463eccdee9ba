"""The drafter's context KV cache, addressed by the target's KV slot ids."""

from __future__ import annotations

import torch


class DraftKVCache:
    """Per-layer context K/V of the drafter, one row per target KV slot.

    Invariants: row `s` holds the drafter's context K/V of the committed token
    that the target stores in slot `s` (RoPE at that token's absolute position).
    Rows are written whenever the target commits a token to a slot (prefill
    and decode commit) and are read only for committed positions, so stale rows
    of freed or rejected slots are never read before being overwritten.
    """

    def __init__(self, *, num_layers, num_slots, num_kv_heads, head_dim, dtype, device):
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [N]; k, v [num_layers, N, kv_heads, head_dim]."""
        self.k[:, slots] = k.to(self.k.dtype)
        self.v[:, slots] = v.to(self.v.dtype)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots [bs, L] -> k, v [num_layers, bs, L, kv_heads, head_dim]."""
        return self.k[:, slots], self.v[:, slots]
