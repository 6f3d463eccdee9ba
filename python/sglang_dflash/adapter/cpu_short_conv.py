"""Short-convolution hybrid targets (LFM2, LFM2-MoE) on SGLang's CPU engine.

SGLang 0.5.23's LFM2 conv layers call the causal depthwise convolution of
`layers/attention/mamba/causal_conv1d.py` (prefill, decode) and its Triton
kernel directly (a verify block, keeping the window after each position for
the commit). Without a compiled CUDA kernel these run Triton, which needs a
GPU, so the layers fail on any CPU. AROUND hooks send host tensors to the
torch convolution our `sgl_kernel` stand-in already serves Gated DeltaNet
with (`cpu_runtime/sgl_kernel/mamba.py`: decode and every verify position
run one per-token step, so a verified position equals a decode step) and
leave device tensors to SGLang. The call sites pass no activation (LFM2 gates
outside the conv) and no draft tree (DFLASH verifies a chain).
"""

from __future__ import annotations

_CONV = "sglang.srt.layers.attention.mamba.causal_conv1d"
CONV_FN_TARGET = f"{_CONV}.causal_conv1d_fn"
CONV_UPDATE_TARGET = f"{_CONV}.causal_conv1d_update"
CONV_UPDATE_TRITON_TARGET = "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update"


def _ops():
    from sglang_dflash.cpu_runtime.sgl_kernel import mamba

    return mamba


def conv_fn_on_cpu(original, x, weight, bias=None, query_start_loc=None, cache_indices=None,
                   has_initial_state=None, conv_states=None, activation="silu", **kwargs):
    """Prefill: x [D, T] (packed sequences) -> [D, T]; each sequence's last
    inputs are left in its pool window."""
    if x.device.type != "cpu" or query_start_loc is None or cache_indices is None:
        return original(x, weight, bias, query_start_loc=query_start_loc, cache_indices=cache_indices,
                        has_initial_state=has_initial_state, conv_states=conv_states,
                        activation=activation, **kwargs)
    if has_initial_state is None:
        has_initial_state = cache_indices.new_zeros(cache_indices.shape, dtype=bool)
    return _ops().causal_conv1d_fn_cpu(x, weight, bias, activation, conv_states, has_initial_state,
                                       cache_indices, query_start_loc)


def conv_update_on_cpu(original, x, conv_state, weight, bias=None, activation=None, *args,
                       conv_state_indices=None, intermediate_conv_window=None,
                       intermediate_state_indices=None, **kwargs):
    """Decode (x [N, D]) or a verify chain (x [N, D, T], windows after each
    position to `intermediate_conv_window`) on host tensors."""
    unsupported = args or any(kwargs.get(k) is not None for k in
                              ("cache_seqlens", "num_accept_tokens", "retrieve_next_token",
                               "retrieve_parent_token"))
    if x.device.type != "cpu" or conv_state_indices is None or unsupported:
        return original(x, conv_state, weight, bias, activation, *args,
                        conv_state_indices=conv_state_indices,
                        **({} if intermediate_conv_window is None else
                           {"intermediate_conv_window": intermediate_conv_window,
                            "intermediate_state_indices": intermediate_state_indices}),
                        **kwargs)
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    return _ops().causal_conv1d_update_cpu(x, conv_state, weight, bias, activation, conv_state_indices,
                                           intermediate_conv_window, intermediate_state_indices)


def register(registry, hook_type) -> None:
    for target, hook in ((CONV_FN_TARGET, conv_fn_on_cpu), (CONV_UPDATE_TARGET, conv_update_on_cpu),
                         (CONV_UPDATE_TRITON_TARGET, conv_update_on_cpu)):
        registry.register(target, hook, hook_type.AROUND)
