"""Hybrid linear-attention (Gated DeltaNet) targets on SGLang's CPU engine.

SGLang 0.5.23's GDN layers (Qwen3.5, Qwen3-Next) reach two kinds of kernels on a
CPU: the CPU wheel's `sgl_kernel` ops, which our stand-in implements in torch
(`cpu_runtime/sgl_kernel/mamba.py`), and, on a host without Intel AMX, the
gated RMSNorm after the recurrence, which SGLang then runs as a Triton kernel
on host tensors (it fails: Triton needs a GPU). An AROUND hook computes that
norm in torch on such hosts and leaves every other host to SGLang.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GATED_NORM_TARGET = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"

_GATES = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


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
    from sglang.kernels.ops.attention.fla import layernorm_gated

    if x.device.type != "cpu" or layernorm_gated._use_cpu or not norm.norm_before_gate:
        return original(norm, x, z)
    return gated_rmsnorm(x, norm.weight, z, norm.eps, norm.activation, norm.group_size)
