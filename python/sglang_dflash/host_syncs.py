"""Counting the host reads of device values inside a decode step.

On a GPU every read of a device value by the host (`.item()`, `int(t)`,
`bool(t)`, `.tolist()`, boolean-mask indexing, `nonzero`) waits for the
device to finish the work queued before it, which stalls the launch of the
next kernels and prevents capturing the step in a CUDA graph. The decode step
is budgeted at one such read. `HostSyncCounter` counts them on any device,
so the budget is tested on a CPU host where every tensor stands in for a
CUDA one: a TorchDispatchMode sees the ops that read values back
(`_local_scalar_dense` behind item/int/bool/float, `nonzero`, boolean
indexing, `masked_select`, `repeat_interleave` without an output size,
`unique`), and `Tensor.tolist` / `Tensor.numpy`, which do not dispatch, are
wrapped while counting.

Imports torch and the stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ALWAYS = {
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten.nonzero_static",  # static size, but still a read on some backends
    "aten.masked_select",
    "aten._unique2",
    "aten.unique_consecutive",
    "aten.unique_dim",
}


def _op_name(func) -> str:
    return str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def is_host_read(func, args, kwargs) -> bool:
    """Whether an op needs the values of a device tensor on the host."""
    name = _op_name(func)
    if name in _ALWAYS:
        return True
    if name in ("aten.index", "aten.index_put", "aten.index_put_"):
        return _bool_index(args)
    if name == "aten.repeat_interleave":  # tensor repeats: the output size is a read unless given
        return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    return False


class HostSyncCounter(TorchDispatchMode):
    """Counts host reads of tensor values while active (`with counter:`).

    `counter.paused()` excludes a section (the target model's own forward,
    which is SGLang's, not this project's). `reads` counts by op name, or by
    op name and the caller's file:line with `where=True` (to find them).
    """

    def __init__(self, where: bool = False):
        super().__init__()
        self.where = where
        self.reads: Counter = Counter()
        self._paused = 0
        self._saved = {}

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._paused and is_host_read(func, args, kwargs):
            self.reads[self._key(_op_name(func))] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved = {}

    def _wrap(self, name, original):
        counter = self

        def read(tensor, *args, **kwargs):
            if not counter._paused:
                counter.reads[counter._key(f"Tensor.{name}")] += 1
            return original(tensor, *args, **kwargs)

        return read

    def _key(self, name: str) -> str:
        if not self.where:
            return name
        here = os.path.dirname(os.path.abspath(__file__))
        torch_dir = os.path.dirname(torch.__file__)
        for frame in reversed(traceback.extract_stack()[:-2]):
            if frame.filename == os.path.abspath(__file__) or frame.filename.startswith(torch_dir):
                continue
            if frame.filename.startswith(here) or "sglang" in frame.filename:
                return f"{name} at {os.path.relpath(frame.filename, os.path.dirname(here))}:{frame.lineno}"
        return name
