"""`ragged_runs` (both of its paths), the stand-in's KV-slot assignment built on it, and `gather_rows`."""

import random

import pytest
import torch

from sglang_dflash import ragged
from sglang_dflash.cpu_runtime.sgl_kernel import ops
from sglang_dflash.ragged import gather_rows, ragged_runs


def reference(starts, lens):
    run = [i for i, n in enumerate(lens) for _ in range(n)]
    value = [s + k for s, n in zip(starts, lens) for k in range(n)]
    return run, value


@pytest.mark.parametrize("path", ["lists", "tensor grid"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ragged_runs_match_reference(path, dtype, monkeypatch):
    if path == "tensor grid":
        monkeypatch.setattr(ragged, "_LIST_MAX_VALUES", -1)
    rng = random.Random(0)
    cases = [([], []), ([5], [0]), ([3, 9], [0, 0]), ([7], [1]), ([0, 100, 50], [3, 0, 2])]
    cases += [([rng.randrange(1000) for _ in range(n)], [rng.choice([0, 1, 1, 8, 40]) for _ in range(n)])
              for n in (1, 2, 16, 64)]
    for starts, lens in cases:
        run, value = ragged_runs(torch.tensor(starts, dtype=dtype), torch.tensor(lens, dtype=dtype))
        assert run.dtype == value.dtype == torch.int64
        assert (run.tolist(), value.tolist()) == reference(starts, lens), (starts, lens)


def test_large_totals_take_the_tensor_path_with_the_same_result():
    starts, lens = [10, 0, 7], [3000, 0, ragged._LIST_MAX_VALUES]
    run, value = ragged_runs(torch.tensor(starts), torch.tensor(lens))
    assert (run.tolist(), value.tolist()) == reference(starts, lens)


def test_assign_req_to_token_pool_writes_each_run_in_order():
    req_to_token = torch.full((4, 12), -1, dtype=torch.int32)
    rpi = torch.tensor([2, 0, 3])
    start, end = torch.tensor([1, 4, 0], dtype=torch.int32), torch.tensor([3, 4, 5], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 107)
    ops.assign_req_to_token_pool_cpu(rpi, req_to_token, start, end, out_cache_loc, 12)
    want = torch.full((4, 12), -1, dtype=torch.int32)
    want[2, 1:3] = torch.tensor([100, 101])
    want[3, 0:5] = torch.tensor([102, 103, 104, 105, 106])
    assert torch.equal(req_to_token, want)
    # ... and the inverse op reads the same cells back.
    back = torch.zeros(7, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, back, 12)
    assert back.tolist() == list(range(100, 107))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dim", [0, 1])
def test_gather_rows_equals_advanced_indexing(dtype, dim):
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(3, 50, 2, 4, generator=g) if dim == 1 else torch.randn(50, 2, 4, generator=g)
    table = torch.randint(0, 50, (5, 12), generator=g, dtype=dtype)
    for slots in (table, table[:, :7], table[2:3]):  # strided slices, as the callers pass
        want = cache[:, slots.long()] if dim == 1 else cache[slots.long()]
        got = gather_rows(cache, slots, dim=dim)
        assert got.shape == want.shape
        assert torch.equal(got, want)
