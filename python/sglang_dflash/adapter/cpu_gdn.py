"""Hybrid linear-attention (Gated DeltaNet) targets on SGLang's CPU engine.

SGLang 0.5.23's GDN layers (Qwen3.5, Qwen3-Next) reach two kinds of kernels on a
CPU: the CPU wheel's `sgl_kernel` ops, which our stand-in implements in torch
(`cpu_runtime/sgl_kernel/mamba.py`), and, on a host without Intel AMX, the
gated RMSNorm after the recurrence, which SGLang then runs as a Triton kernel
on host tensors (it fails: Triton needs a GPU). AROUND hooks compute that norm
(Qwen3.5's and Qwen3-Next's classes) in torch on such hosts and leave every
other host to SGLang. Qwen3-Next's GDN layer also asks the accelerator module
for its norm's device when it is built, which is CUDA in a CUDA build of torch
even on a host without a GPU; on such a host it is given the CPU.
"""

from __future__ import annotations

import functools
import importlib

import torch
import torch.nn.functional as F

GATED_NORM_TARGET = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"
FUSED_GATED_NORM_TARGET = "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward"
NEXT_GDN_INIT_TARGET = "sglang.srt.models.qwen3_next.Qwen3GatedDeltaNet.__init__"

_GATES = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


@functools.cache
def _fla(name: str):
    """SGLang's `fla.<name>` kernel module, imported on the first hooked call
    and kept (SGLang has loaded it by then: the hooked class lives there);
    importing it here instead would tie this module's import to SGLang's."""
    return importlib.import_module(f"sglang.kernels.ops.attention.fla.{name}")


def gated_rmsnorm(x, weight, z, eps: float, activation: str = "swish", group_size=None):
    """rmsnorm(x) * weight * act(z), per group of `group_size` (the whole row
    when None), in float32, back to x's dtype (norm before gate)."""
    dtype, width = x.dtype, x.shape[-1]
    h = x.float()
    size = group_size or width
    grouped = h.reshape(*h.shape[:-1], width // size, size)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    out = grouped.reshape(h.shape) * weight.float()
    if z is not None:
        out = out * _GATES[activation](z.float())
    return out.to(dtype)


def torch_gated_norm_on_cpu(original, norm, x, z=None):
    """AROUND SGLang's gated RMSNorm forward: host tensors on a host whose CPU
    path would launch Triton (no AMX kernel) take the torch computation."""
    if x.device.type != "cpu" or _fla("layernorm_gated")._use_cpu or not norm.norm_before_gate:
        return original(norm, x, z)
    return gated_rmsnorm(x, norm.weight, z, norm.eps, norm.activation, norm.group_size)


def torch_fused_gated_norm_on_cpu(original, norm, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """AROUND Qwen3-Next's fused gated RMSNorm (norm before the gate, one group)."""
    if x.device.type != "cpu" or _fla("fused_norm_gate")._use_cpu or residual is not None or prenorm:
        return original(norm, x, g, residual, prenorm, residual_in_fp32)
    return gated_rmsnorm(x, norm.weight, g, norm.eps, norm.activation)


def cpu_device_module_without_gpu(original, *args, **kwargs):
    """AROUND Qwen3-Next's GDN layer constructor: on a host without a GPU,
    `torch.get_device_module()` (no device named) answers with the CPU module."""
    if torch.cuda.is_available():
        return original(*args, **kwargs)
    accelerator_module = torch.get_device_module

    def device_module(device=None):
        return torch.cpu if device is None else accelerator_module(device)

    torch.get_device_module = device_module
    try:
        return original(*args, **kwargs)
    finally:
        torch.get_device_module = accelerator_module
