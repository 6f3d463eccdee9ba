"""CPU tensor parallelism helpers: the cores each rank pins itself to, and
the model-parallel groups built without PyNccl on the CPU engine."""

import pytest

from sglang_dflash.adapter import cpu_parallel
from sglang_dflash.adapter.cpu_parallel import parse_cpu_list, split_cores


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_cpu_list("5") == [5]
    with pytest.raises(ValueError):
        parse_cpu_list("4-2")
    with pytest.raises(ValueError):
        parse_cpu_list("")


def test_split_cores_evenly_in_contiguous_groups():
    assert split_cores(2, [0, 1]) == ["0", "1"]
    assert split_cores(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]  # a spare core stays unused
    assert split_cores(1, [3, 7]) == ["3,7"]
    with pytest.raises(RuntimeError, match="need at least 3"):
        split_cores(3, [0, 1])


@pytest.mark.parametrize("cpu", [True, False])
def test_no_pynccl_on_cpu_only(monkeypatch, cpu):
    import sglang.srt.utils as utils

    monkeypatch.setattr(utils, "is_cpu", lambda: cpu)
    seen = []

    def original(group_ranks, local_rank, backend, use_pynccl=None, **kwargs):
        seen.append(use_pynccl)

    cpu_parallel.no_pynccl_on_cpu(original, [[0, 1]], 0, "gloo")
    cpu_parallel.no_pynccl_on_cpu(original, [[0, 1]], 0, "gloo", True)  # positional
    cpu_parallel.no_pynccl_on_cpu(original, [[0, 1]], 0, "gloo", use_pynccl=True)
    assert seen == ([False] * 3 if cpu else [None, True, True])
