"""Torch versions of sgl_kernel CUDA ops that SGLang 0.5.23 may call directly
on a CUDA host (outside BaseFusedOp dispatch). Device-agnostic: they run on
CUDA tensors (and on CPU, which is how they are tested here). Each follows the
sgl_kernel signature as SGLang calls it; `out=` / in-place contracts are kept."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm",
    "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "gelu_quick",
    "apply_rope_with_cos_sin_cache_inplace", "rotary_embedding",
    "top_k_renorm_prob", "top_p_renorm_prob", "top_k_mask_logits",
    "weak_ref_tensor", "is_arch_support_pdl", "get_cuda_stream",
]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight.float() + offset)).to(x.dtype)


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps)
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """residual += input; input = rmsnorm(residual) (both in place)."""
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps, offset=1.0)
    if out is None:
        return y
    out.copy_(y)
    return out


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, offset=1.0))


def _gated(fn, input, out):
    d = input.shape[-1] // 2
    y = fn(input[..., :d]) * input[..., d:]
    if out is None:
        return y
    out.copy_(y)
    return out


def silu_and_mul(input, out=None, enable_pdl=None):
    return _gated(F.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _gated(F.gelu, input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _gated(lambda t: F.gelu(t, approximate="tanh"), input, out)


def gelu_quick(input, out=None):
    y = input * torch.sigmoid(1.702 * input)
    if out is None:
        return y
    out.copy_(y)
    return out


def _rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, is_neox: bool) -> None:
    """Rotate the first `rot` features of x [T, H, D] in place; cos/sin [T, rot/2]."""
    xr = x[..., :rot].float()
    c, s = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        y = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    x[..., :rot] = y.to(x.dtype)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                          is_neox=True, *args, **kwargs):
    """cos_sin_cache [max_pos, rot] = [cos | sin]; query/key [T, H*D] or [T, H, D]."""
    rot = cos_sin_cache.shape[-1]
    cs = cos_sin_cache[positions.long()].float()
    cos, sin = cs[:, : rot // 2], cs[:, rot // 2:]
    for x in (query, key):
        if x is None:
            continue
        view = x.view(x.shape[0], -1, head_size)
        _rope_(view, cos, sin, rot, is_neox)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key


def _as_row(value, probs: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(probs.device).reshape(-1, 1)
    return torch.full((probs.shape[0], 1), value, device=probs.device)


def top_k_renorm_prob(probs, top_k, *args, **kwargs):
    k = _as_row(top_k, probs).long().clamp(min=1, max=probs.shape[-1])
    sorted_p, _ = probs.sort(dim=-1, descending=True)
    kth = sorted_p.gather(-1, k - 1)
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs, top_p, *args, **kwargs):
    p = _as_row(top_p, probs).float()
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    keep_sorted = before < p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_k_mask_logits(logits, top_k, *args, **kwargs):
    k = _as_row(top_k, logits).long().clamp(min=1, max=logits.shape[-1])
    kth = logits.sort(dim=-1, descending=True)[0].gather(-1, k - 1)
    return torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf")))


def weak_ref_tensor(tensor):
    """sgl_kernel returns a tensor aliasing `tensor`'s memory without owning it, so a
    CUDA graph's outputs do not keep the graph pool alive. Torch has no such view;
    returning the tensor itself keeps the memory alive longer (more memory, same
    values)."""
    return tensor


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch: off (a launch-overlap optimisation only)."""
    return False


def get_cuda_stream() -> int:
    return torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() else 0
