"""Tensor / data parallelism on SGLang's CPU engine.

SGLang 0.5.23 builds every model-parallel group with a PyNccl communicator
unless the platform opts out, and its CPU platform does not: where torch ships
NCCL (any CUDA build of torch, as `pip install sglang` installs) the group
creation then fails on a CPU host (`Expected a cuda device, but got: cpu`).
On the CPU engine the collectives run over gloo (`GroupCoordinator.all_reduce`
and `all_gather` take the `torch.distributed` path for CPU tensors when the
shared-memory kernels of an Intel AMX build are absent), so the groups are
built without PyNccl.

Thread binding: SGLang reads each rank's cores from SGLANG_CPU_OMP_THREADS_BIND
("0-3|4-7", one group per rank), refuses to start without it when there are
more ranks than NUMA nodes (one node on most small hosts), and applies it only
through the Intel AMX build of `sgl_kernel`; elsewhere every rank's torch uses
every core, and two ranks on two cores then fight over both. Here the cores
are split evenly when the variable is unset, and each rank pins itself to its
group and sizes torch's thread pool to it.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

PARALLEL_GROUP_TARGET = "sglang.srt.distributed.parallel_state.init_model_parallel_group"
THREADS_BINDING_TARGET = "sglang.srt.utils.numa_utils.init_threads_binding"
BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
_USE_PYNCCL_POSITION = 3  # init_model_parallel_group(group_ranks, local_rank, backend, use_pynccl, ...)


def no_pynccl_on_cpu(original, *args, **kwargs):
    """AROUND `init_model_parallel_group`: on the CPU engine, no PyNccl."""
    from sglang.srt.utils import is_cpu

    if is_cpu():
        if len(args) > _USE_PYNCCL_POSITION:
            args = (*args[:_USE_PYNCCL_POSITION], False, *args[_USE_PYNCCL_POSITION + 1:])
        else:
            kwargs["use_pynccl"] = False
    return original(*args, **kwargs)


def parse_cpu_list(spec: str) -> list[int]:
    """"0-3,6" -> [0, 1, 2, 3, 6] (the Linux cpu-list format SGLang's bind groups use)."""
    cpus: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"bad CPU range {part!r} in {spec!r}")
        cpus.extend(range(lo, hi + 1))
    if not cpus:
        raise ValueError(f"empty CPU list {spec!r}")
    return cpus


def split_cores(ranks: int, cores: list[int]) -> list[str]:
    """Each of `ranks` ranks' cores: `cores` cut into contiguous groups of equal
    size, as cpu lists ("0|1" for two ranks on two cores)."""
    if ranks > len(cores):
        raise RuntimeError(f"sglang-dflash: {ranks} ranks (tp x dp x pp) need at least {ranks} "
                           f"CPU cores; this process may use {len(cores)}")
    per = len(cores) // ranks
    return [",".join(str(c) for c in cores[i * per:(i + 1) * per]) for i in range(ranks)]


def bind_rank_threads(original, *args, numa_index: int, world_size: int, **kwargs):
    """AROUND SGLang's `init_threads_binding`: with more ranks than NUMA nodes
    and no SGLANG_CPU_OMP_THREADS_BIND (where SGLang refuses to start), split
    this host's cores evenly between the ranks; then pin this rank to its
    cores when SGLang itself will not (no AMX `sgl_kernel`)."""
    from sglang.srt.distributed import bootstrap
    from sglang.srt.utils.numa_utils import get_cpu_ids_by_node

    if BIND_ENV not in os.environ and world_size > len(get_cpu_ids_by_node()):
        cores = split_cores(world_size, sorted(os.sched_getaffinity(0)))[numa_index]
    else:
        cores = original(*args, numa_index=numa_index, world_size=world_size, **kwargs)
    if getattr(bootstrap, "_is_cpu_amx_available", False) or getattr(bootstrap, "_is_cpu_arm64", False):
        return cores  # sgl_kernel's init_cpu_threads_env binds them
    import torch

    cpus = parse_cpu_list(cores)
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    logger.info("sglang-dflash: rank %d of %d pinned to CPUs %s (%d torch threads)", numa_index,
                world_size, cores, len(cpus))
    return cores
