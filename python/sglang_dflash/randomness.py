"""Uniforms for requests with a `sampling_seed`, drawn on the device.

A seeded request must sample the same tokens whatever else is in its batch,
so its draws are a function of (seed, position of the step's anchor) only.
A generator per request seeded on the host would need the anchor position on
the host (a device read per seeded request per step, and no graph capture);
instead the draws come from a counter-based generator evaluated elementwise
on the device: SplitMix64 (Steele, Lea and Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014) over the key (seed, position,
draw index), the top 24 bits of each output scaled to a float32 in [0, 1).

int64 arithmetic in torch wraps modulo 2^64 on CPU and CUDA; `>>` on int64 is
arithmetic, so logical shifts mask the sign-extended bits.

Imports torch and the stdlib only.
"""

from __future__ import annotations

import torch


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GAMMA = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 values."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 output function of state `x` (int64, elementwise)."""
    z = x + _GAMMA
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def counter_uniforms(seeds: torch.Tensor, positions: torch.Tensor, count: int) -> torch.Tensor:
    """Reproducible uniforms per (seed, position).

    Args:
        seeds: [n] int64 request seeds.
        positions: [n] int64 anchor positions, on the device the draws go to.
        count: draws per request.
    Returns:
        [n, count] float32 in [0, 1), a function of (seed, position) only.
    """
    key = splitmix64(splitmix64(seeds.to(positions.device, torch.int64)) ^ positions.to(torch.int64))
    index = torch.arange(count, dtype=torch.int64, device=positions.device)
    bits = splitmix64(key.unsqueeze(1) + index * _GAMMA)  # [n, count]
    return _shr(bits, 40).to(torch.float32) * (1.0 / (1 << 24))
