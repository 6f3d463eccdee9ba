"""Mamba2 hybrid targets (Nemotron-H) on SGLang's CPU engine.

SGLang 0.5.23's Mamba2 mixer (`layers/attention/mamba/mamba.py`) cannot run on
a CPU: its causal convolutions are imported only in CUDA, NPU and XPU builds
(on a CPU the names are unbound and the first prefill fails), and its selective
scan is Triton only (`mamba_chunk_scan_combined` over a prefill,
`selective_state_update` per decode token or verify block). Here:

* when a mixer is built on a host whose build left the convolution names
  unbound, they are bound to the torch convolution LFM2's layers use on a CPU
  (`cpu_short_conv`: the same prefill, decode and verify forms);
* AROUND hooks send the scan and the state update of host tensors to their
  torch twins (`cpu_runtime/mamba2.py`) and everything else to SGLang.

Forms DFLASH on a CPU never makes (a gated scan, a draft tree, the
extra_buffer radix cache's state tracking) go to SGLang's kernels as they
would without us.
"""

from __future__ import annotations

import functools
import sys

MIXER_INIT_TARGET = "sglang.srt.layers.attention.mamba.mamba.MambaMixer2.__init__"
_OPS = "sglang.kernels.ops.mamba.triton_ops"
SCAN_TARGET = f"{_OPS}.ssd_combined.mamba_chunk_scan_combined"
STATE_UPDATE_TARGET = f"{_OPS}.ssu_dispatch.selective_state_update"

_SCAN_UNSERVED = ("z", "track_end_locs")
_UPDATE_UNSERVED = ("z", "retrieve_parent_token")


def _twins():
    from sglang_dflash.cpu_runtime import mamba2

    return mamba2


def _no_conv_kernel(*_, **__):
    raise NotImplementedError("this SGLang build has no causal-conv1d kernel for the Mamba2 mixer on this host, "
                              "and the torch convolution does not serve this call form")


def bind_cpu_convolutions(original, mixer, *args, **kwargs):
    """AROUND the mixer's constructor: bind the convolution names the module
    lacks (a CPU build) to the torch convolution, once, before the first forward."""
    from sglang_dflash.adapter import cpu_short_conv

    module = sys.modules[type(mixer).__module__]
    convs = {"causal_conv1d_fn": cpu_short_conv.conv_fn_on_cpu,
             "causal_conv1d_fn_triton": cpu_short_conv.conv_fn_on_cpu,
             "causal_conv1d_update": cpu_short_conv.conv_update_on_cpu,
             "causal_conv1d_update_triton": cpu_short_conv.conv_update_on_cpu}
    for name, conv in convs.items():
        if not hasattr(module, name):
            setattr(module, name, functools.partial(conv, _no_conv_kernel))
    return original(mixer, *args, **kwargs)


def _served(x, kwargs: dict, unserved: tuple, extra_positionals: tuple) -> bool:
    return (x.device.type == "cpu" and not extra_positionals
            and all(kwargs.get(k) is None for k in unserved)
            and not kwargs.get("return_intermediate_states", False))


def scan_on_cpu(original, x, dt, A, B, C, chunk_size=None, D=None, *args, **kwargs):
    """Prefill: host tensors to the token-by-token scan."""
    if not _served(x, kwargs, _SCAN_UNSERVED, args):
        return original(x, dt, A, B, C, chunk_size, D, *args, **kwargs)
    return _twins().mamba_chunk_scan_cpu(x, dt, A, B, C, chunk_size, D, **kwargs)


def state_update_on_cpu(original, state, x, dt, A, B, C, D=None, *args, **kwargs):
    """Decode or a verify chain of host tensors, indexed by pool slot."""
    if not _served(x, kwargs, _UPDATE_UNSERVED, args) or kwargs.get("state_batch_indices") is None:
        return original(state, x, dt, A, B, C, D, *args, **kwargs)
    return _twins().selective_state_update_cpu(state, x, dt, A, B, C, D, **kwargs)


def register(registry, hook_type) -> None:
    registry.register(MIXER_INIT_TARGET, bind_cpu_convolutions, hook_type.AROUND)
    registry.register(SCAN_TARGET, scan_on_cpu, hook_type.AROUND)
    registry.register(STATE_UPDATE_TARGET, state_update_on_cpu, hook_type.AROUND)
