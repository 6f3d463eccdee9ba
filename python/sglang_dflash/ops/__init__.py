"""The single dispatch point between the Triton kernels and their torch twins.

    selector_walk(scores, cand_ids, temperature, greedy, uniforms) -> select.Path
        twin: select.walk; kernel: ops.walk_triton.walk
    chain_rejection(draft_tokens, q_ids, q_probs, p, accept_uniforms, sample_uniforms) -> AcceptResult
        twin: ops.rejection_ref.chain_rejection_sample_uniforms;
        kernel: ops.rejection_triton.chain_rejection_sample_uniforms
    block_context_attention(q, k_block, v_block, ctx, positions, causal, window) -> out
        twin: ops.context_attention_ref.block_context_attention (gathers, one
        host read of the lengths); kernel: ops.context_attention_triton (paged,
        no gather, no host read)

Each pair has the same signature and the same result (the walk's q within
1e-6), and neither draws random numbers, so either can be captured in a CUDA
graph. The choice is made once per device type, at the first call, cached
and logged once (a kernel at the edge, chosen in one place, said in the log):

    * CPU (or any non-CUDA) tensors: the torch twin;
    * CUDA tensors: the Triton kernel if `import triton` works and the
      environment variable SGLANG_DFLASH_DISABLE_TRITON is not set to 1,
      else the torch twin.

Triton is imported lazily, inside the CUDA branch, so this package imports
on hosts without Triton. `backend(device)` reports the decision; tests call
`reset_backend_cache()` to decide again.
"""

import importlib
import logging
import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from sglang_dflash import select
from sglang_dflash.ops import context_attention_ref
from sglang_dflash.ops.context_attention_ref import PagedLayer
from sglang_dflash.ops.rejection_ref import chain_rejection_sample_uniforms
from sglang_dflash.rejection import AcceptResult

logger = logging.getLogger(__name__)

DISABLE_TRITON_ENV = "SGLANG_DFLASH_DISABLE_TRITON"
BACKEND_TRITON = "triton"
BACKEND_TORCH = "torch"


class _Impl(NamedTuple):
    name: str  # BACKEND_TRITON or BACKEND_TORCH
    walk: Callable[..., select.Path]
    chain_rejection: Callable[..., AcceptResult]
    block_context_attention: Callable[..., torch.Tensor]


_TORCH_IMPL = _Impl(BACKEND_TORCH, select.walk, chain_rejection_sample_uniforms,
                    context_attention_ref.block_context_attention)
_DECISIONS: dict = {}  # device type -> _Impl, filled once per device type


def selector_walk(
    scores: torch.Tensor,
    cand_ids: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    all_greedy: bool = False,
) -> select.Path:
    """`select.walk` through the backend chosen for scores' device.

    Args:
        scores: [bs, S, K, K] float32; cand_ids: [bs, S, K] int64;
        temperature: [bs] float32; greedy: [bs] bool; uniforms: [bs, S] float32.
        all_greedy: every row is greedy (known on the host): the torch twin
            skips the softmax; the kernel handles greedy rows in one pass anyway.

    Returns:
        Path with tokens, choice [bs, S] and q [bs, S, K].
    """
    impl = _impl(scores.device)
    if impl.name == BACKEND_TORCH:
        return select.walk(scores, cand_ids, temperature, greedy, uniforms, all_greedy=all_greedy)
    return impl.walk(scores, cand_ids, temperature, greedy, uniforms)


def chain_rejection(
    draft_tokens: torch.Tensor,
    q_ids: torch.Tensor,
    q_probs: torch.Tensor,
    p: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> AcceptResult:
    """`rejection_ref.chain_rejection_sample_uniforms` through the chosen backend.

    Args:
        draft_tokens: [bs, S] int64; q_ids, q_probs: [bs, S, K] int64 / float32
        the sparse q; p: [bs, S+1, V] float32; accept_uniforms: [bs, S];
        sample_uniforms: [bs, S+1].

    Returns:
        AcceptResult with accept_len [bs] and tokens [bs, S+1].
    """
    return _impl(p.device).chain_rejection(draft_tokens, q_ids, q_probs, p, accept_uniforms,
                                           sample_uniforms)


def block_context_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    ctx: PagedLayer,
    positions: torch.Tensor,
    *,
    causal: bool = False,
    window: int | None = None,
) -> torch.Tensor:
    """The drafter's block attention over its paged context, through the chosen
    backend (see `context_attention_ref.block_context_attention`).

    Args:
        q: [bs, B, nh, d]; k_block, v_block: [bs, B, kvh, d]; ctx: the layer's
        cache and slot table; positions: [bs, B] int64.

    Returns:
        [bs, B, nh, d].
    """
    return _impl(q.device).block_context_attention(q, k_block, v_block, ctx, positions,
                                                   causal=causal, window=window)


def backend(device) -> str:
    """The backend used for tensors on `device` ("triton" or "torch"); decides if needed."""
    return _impl(torch.device(device)).name


def reset_backend_cache() -> None:
    """Forget the cached decisions (tests only; the next call decides and logs again)."""
    _DECISIONS.clear()


def _impl(device: torch.device) -> _Impl:
    impl = _DECISIONS.get(device.type)
    if impl is None:
        impl, reason = _decide(device.type)
        _DECISIONS[device.type] = impl
        logger.info("sglang_dflash.ops: %s tensors use the %s backend (%s)",
                    device.type, impl.name, reason)
    return impl


def _decide(device_type: str) -> tuple[_Impl, str]:
    """Pick the backend for one device type; returns it and the reason to log."""
    if device_type != "cuda":
        return _TORCH_IMPL, "Triton kernels run on CUDA only"
    if os.environ.get(DISABLE_TRITON_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return _TORCH_IMPL, f"{DISABLE_TRITON_ENV} is set"
    try:
        walk_triton = importlib.import_module("sglang_dflash.ops.walk_triton")
        rejection_triton = importlib.import_module("sglang_dflash.ops.rejection_triton")
        attention_triton = importlib.import_module("sglang_dflash.ops.context_attention_triton")
    except ImportError as exc:  # triton missing or unusable: decided here, once
        return _TORCH_IMPL, f"triton does not import: {exc}"
    impl = _Impl(BACKEND_TRITON, walk_triton.walk, rejection_triton.chain_rejection_sample_uniforms,
                 attention_triton.block_context_attention)
    return impl, "triton imports"
