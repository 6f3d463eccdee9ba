"""The CPU engine's LoRA pinning shim (adapter/cpu_lora.py): on a host that
cannot pin, pinning becomes a no-op for the process; elsewhere nothing changes.
Run in a subprocess: the shim patches torch process-wide."""

import subprocess
import sys

CHECK = """
import torch
from sglang_dflash.adapter import cpu_lora
before = torch.tensor
cpu_lora.unpinned_lora_on_cpu()
if cpu_lora.can_pin():
    assert torch.tensor is before, "a host that can pin must be left alone"
    print("left alone")
else:
    t = torch.tensor([1, 2, 3], dtype=torch.int32, pin_memory=True)
    e = torch.empty((4,), dtype=torch.int32, device="cpu", pin_memory=True)
    z = torch.zeros(2, pin_memory=True)
    assert t.tolist() == [1, 2, 3] and e.shape == (4,) and z.tolist() == [0.0, 0.0]
    assert t.pin_memory() is t
    cpu_lora.unpinned_lora_on_cpu()  # idempotent: wraps once
    assert torch.tensor.__wrapped__ is before
    print("no-op pinning")
"""


def test_pinning_is_a_no_op_only_where_nothing_can_pin():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import torch

    can_pin = torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available())
    assert proc.stdout.split("\n")[-2] == ("left alone" if can_pin else "no-op pinning")
