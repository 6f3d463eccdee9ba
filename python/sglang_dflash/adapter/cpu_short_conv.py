"""Short-convolution hybrid targets (LFM2, LFM2-MoE) on SGLang's CPU engine.

SGLang 0.5.23's LFM2 conv layers call the causal depthwise convolution of
`layers/attention/mamba/causal_conv1d.py` (prefill, decode) and its Triton
kernel directly (a verify block, keeping the window after each position for
the commit). Without a compiled CUDA kernel these run Triton, which needs a
GPU, so the layers fail on any CPU. AROUND hooks send host tensors to the
torch convolution our `sgl_kernel` stand-in already serves Gated DeltaNet
with (`cpu_runtime/sgl_kernel/mamba.py`: decode and every verify position
run one per-token step, so a verified position equals a decode step) and
leave device tensors, and call forms DFLASH on a CPU never makes (a draft
tree, accept counts, a circular buffer), to SGLang with their arguments as given.
"""

from __future__ import annotations

import torch

_CONV = "sglang.srt.layers.attention.mamba.causal_conv1d"
CONV_FN_TARGET = f"{_CONV}.causal_conv1d_fn"
CONV_UPDATE_TARGET = f"{_CONV}.causal_conv1d_update"
CONV_UPDATE_TRITON_TARGET = "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update"


def _ops():
    from sglang_dflash.cpu_runtime.sgl_kernel import mamba

    return mamba


def _leading(args: tuple, kwargs: dict, names: tuple) -> list | None:
    """The arguments `names` (positional first, then by keyword), or None where a
    call passes more positionals than those: a form the torch path does not take."""
    if len(args) > len(names):
        return None
    return [args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(names)]


def conv_fn_on_cpu(original, x, weight, *args, **kwargs):
    """Prefill: x [D, T] (packed sequences) -> [D, T]; each sequence's last
    inputs are left in its pool window."""
    lead = _leading(args, kwargs, ("bias", "query_start_loc", "cache_indices", "has_initial_state",
                                   "conv_states", "activation"))
    if x.device.type != "cpu" or lead is None:
        return original(x, weight, *args, **kwargs)
    bias, query_start_loc, cache_indices, has_initial_state, conv_states, activation = lead
    if query_start_loc is None or cache_indices is None or conv_states is None:  # not a pool-backed prefill
        return original(x, weight, *args, **kwargs)
    if len(args) < 6 and "activation" not in kwargs:
        activation = "silu"  # SGLang's default
    if has_initial_state is None:
        has_initial_state = cache_indices.new_zeros(cache_indices.shape, dtype=torch.bool)
    return _ops().causal_conv1d_fn_cpu(x, weight, bias, activation, conv_states, has_initial_state,
                                       cache_indices, query_start_loc)


_UPDATE_UNSUPPORTED = ("cache_seqlens", "num_accept_tokens", "retrieve_next_token",
                       "retrieve_next_sibling", "retrieve_parent_token")


def conv_update_on_cpu(original, x, conv_state, weight, *args, **kwargs):
    """Decode (x [N, D]) or a verify chain (x [N, D, T], windows after each
    position to `intermediate_conv_window`) on host tensors."""
    lead = _leading(args, kwargs, ("bias", "activation"))
    slots = kwargs.get("conv_state_indices")
    if (x.device.type != "cpu" or lead is None or slots is None
            or any(kwargs.get(k) is not None for k in _UPDATE_UNSUPPORTED)):
        return original(x, conv_state, weight, *args, **kwargs)
    bias, activation = lead
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    return _ops().causal_conv1d_update_cpu(x, conv_state, weight, bias, activation, slots,
                                           kwargs.get("intermediate_conv_window"),
                                           kwargs.get("intermediate_state_indices"))


def register(registry, hook_type) -> None:
    for target, hook in ((CONV_FN_TARGET, conv_fn_on_cpu), (CONV_UPDATE_TARGET, conv_update_on_cpu),
                         (CONV_UPDATE_TRITON_TARGET, conv_update_on_cpu)):
        registry.register(target, hook, hook_type.AROUND)
