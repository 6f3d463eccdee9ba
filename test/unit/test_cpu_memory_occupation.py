"""The scheduler's memory release on a CPU host (adapter/cpu_memory_occupation.py):
it synchronizes the CPU's device module, only during the call, only where no
accelerator exists."""

import pytest
import torch

from sglang_dflash.adapter import cpu_memory_occupation


def _release():
    return torch.get_device_module(), torch.get_device_module("cpu")


def test_release_synchronizes_the_cpu_only_where_nothing_else_exists(monkeypatch):
    original = torch.get_device_module
    monkeypatch.setattr(cpu_memory_occupation, "can_pin", lambda: False)
    assert cpu_memory_occupation.release_on_cpu(_release) == (torch.cpu, torch.cpu)
    assert torch.get_device_module is original
    monkeypatch.setattr(cpu_memory_occupation, "can_pin", lambda: True)
    seen = []
    cpu_memory_occupation.release_on_cpu(lambda: seen.append(torch.get_device_module is original))
    assert seen == [True]


def test_the_device_module_comes_back_when_the_release_fails(monkeypatch):
    original = torch.get_device_module
    monkeypatch.setattr(cpu_memory_occupation, "can_pin", lambda: False)

    def failing():
        raise AssertionError("release_memory_occupation should be called only when server is idle.")

    with pytest.raises(AssertionError):
        cpu_memory_occupation.release_on_cpu(failing)
    assert torch.get_device_module is original
