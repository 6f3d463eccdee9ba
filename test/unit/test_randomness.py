"""randomness.py: the counter-based uniforms of seeded requests."""

import pytest
import torch

from sglang_dflash.randomness import counter_uniforms, splitmix64

MASK = (1 << 64) - 1


def _splitmix64_reference(x: int) -> int:
    """SplitMix64's output function in Python integers (Steele et al., 2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_splitmix64_matches_the_reference_on_int64_wraparound():
    values = [0, 1, 12345, (1 << 62) + 3, (1 << 63) + 7, MASK]
    signed = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values], dtype=torch.int64)
    got = [v & MASK for v in splitmix64(signed).tolist()]
    assert got == [_splitmix64_reference(v) for v in values]
    assert _splitmix64_reference(0) == 0xE220A8397B1DCDAF  # the published first output for seed 0


def test_draws_depend_on_seed_and_position_only():
    a = counter_uniforms(torch.tensor([7, 8, 7]), torch.tensor([30, 30, 31]), 16)
    alone = counter_uniforms(torch.tensor([7]), torch.tensor([30]), 16)
    assert torch.equal(a[0], alone[0])  # the batch around a row does not matter
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert torch.equal(counter_uniforms(torch.tensor([7]), torch.tensor([30]), 8)[0], alone[0, :8])


@pytest.mark.parametrize("seed", [0, 3, 99])
def test_draws_are_uniform(seed):
    """Kolmogorov-Smirnov against U[0, 1): with n = 200,000 draws, D above
    1.63 / sqrt(n) (alpha = 0.01) would reject; also in range [0, 1)."""
    n = 200_000
    u = counter_uniforms(torch.tensor([seed]), torch.tensor([5]), n)[0].double()
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    sorted_u = u.sort().values
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    d = max(float((grid - sorted_u).max()), float((sorted_u - (grid - 1 / n)).max()))
    assert d < 1.63 / n ** 0.5, d
    # neighbouring draws are uncorrelated
    corr = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(corr)) < 0.01
