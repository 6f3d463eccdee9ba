"""/release_memory_occupation on SGLang's CPU engine.

SGLang 0.5.23 ends the scheduler's `release_memory_occupation` (the call
colocated RL trainers make between rollouts) with
`torch.get_device_module().synchronize()`. On a host without an accelerator
that is `torch.cuda`, which raises, and the exception kills the scheduler:
the server dies, plain decoding included. Everything before it (the radix
cache flushed, the memory saver's pauses, no-ops without it) works on a CPU,
so there the call runs with the CPU's device module, whose synchronize has
nothing to wait for. Hosts with an accelerator are left alone.
"""

from __future__ import annotations

import contextlib

import torch

from sglang_dflash.adapter.cpu_lora import can_pin

RELEASE_TARGET = ("sglang.srt.managers.scheduler_components.weight_updater."
                  "SchedulerWeightUpdaterManager.release_memory_occupation")


@contextlib.contextmanager
def _cpu_device_module():
    original = torch.get_device_module

    def device_module(device=None):
        return torch.cpu if device is None else original(device)

    torch.get_device_module = device_module
    try:
        yield
    finally:
        torch.get_device_module = original


def release_on_cpu(original, *args, **kwargs):
    """AROUND the scheduler's release: on a host without an accelerator, the
    device module it synchronizes is the CPU's."""
    if can_pin():
        return original(*args, **kwargs)
    with _cpu_device_module():
        return original(*args, **kwargs)
