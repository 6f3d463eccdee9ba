"""`sgl_kernel` for the GPU kit: sglang-dflash's CPU stand-in, extended for CUDA.

The stand-in (`sglang_dflash/cpu_runtime/sgl_kernel`) is written for SGLang's
CPU engine. On CUDA, SGLang 0.5.23 reaches `sgl_kernel` differently:

* it imports submodules at module level under `if is_cuda()`:
  `sgl_kernel.quantization` (layers/quantization/gguf.py:49, imported by nearly
  every server module), `sgl_kernel.utils` (layers/attention/triton_backend.py:71),
  `sgl_kernel.scalar_type` (layers/quantization/utils.py:27), and others on
  paths a dense bf16 Qwen3 server does not take. The stand-in has none, so
  `import sglang.srt.managers.scheduler` fails with ModuleNotFoundError;
* it calls CUDA ops directly (outside BaseFusedOp dispatch), e.g.
  `weak_ref_tensor` when capturing CUDA graphs, and `rmsnorm` /
  `fused_add_rmsnorm` / `silu_and_mul` / `top_k_renorm_prob` where a layer's
  `forward_cuda` runs.

This package re-exports the stand-in's ops, adds device-agnostic torch versions
of those CUDA ops (`cuda_ops.py`), and answers any other `sgl_kernel.<sub>`
import with a module whose attributes are `Missing` placeholders: attribute
chains work (`scalar_types.uint4b8` at import time), calling one raises
NotImplementedError naming it. Every placeholder name that is requested is
appended to $KIT_SGL_KERNEL_LOG (one "request NAME" / "call NAME" per line),
so a GPU run reports exactly which ops SGLang wanted.

The kit also sets SGLANG_FORCE_FUSED_OP_BACKEND=torch so that BaseFusedOp
layers (RMSNorm, rotary, SiluAndMul, ...) run their pure-torch forward_native,
and SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (engine.py checks the installed
`sglang-kernel` distribution on CUDA).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

from sglang_dflash.cpu_runtime.sgl_kernel import ops as _standin_ops
from sglang_dflash.cpu_runtime.sgl_kernel.ops import *  # noqa: F401,F403

from . import cuda_ops as _cuda_ops
from .cuda_ops import *  # noqa: F401,F403

__version__ = "0.4.10"
IS_SGLANG_DFLASH_STANDIN = True
IS_GPU_KIT_OVERLAY = True
IMPLEMENTED_OPS = set(_standin_ops.IMPLEMENTED_OPS) | set(_cuda_ops.__all__)

_LOG = os.environ.get("KIT_SGL_KERNEL_LOG")
_REQUESTED: set[str] = set()


def _note(kind: str, name: str) -> None:
    key = f"{kind} {name}"
    if key in _REQUESTED:
        return
    _REQUESTED.add(key)
    if _LOG:
        try:
            with open(_LOG, "a") as f:
                f.write(f"{key} pid={os.getpid()}\n")
        except OSError:
            pass


def requested_names() -> set[str]:
    return set(_REQUESTED)


class Missing:
    """Placeholder for an sgl_kernel attribute this overlay does not implement."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}")

    def __call__(self, *args, **kwargs):
        _note("call", self.__name__)
        raise NotImplementedError(
            f"sgl_kernel op '{self.__name__}' is not available: the GPU kit's sgl_kernel "
            f"overlay implements only {sorted(IMPLEMENTED_OPS)}")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<missing sgl_kernel op {self.__name__}>"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    _note("request", name)
    return Missing(name)


# ---- submodules ---------------------------------------------------------------------

# Implemented submodules: name -> attributes.
_SUBMODULE_ATTRS = {
    "utils": {"is_arch_support_pdl": _cuda_ops.is_arch_support_pdl,
              "get_cuda_stream": _cuda_ops.get_cuda_stream},
    "speculative": {
        "reconstruct_indices_from_tree_mask": _standin_ops.reconstruct_indices_from_tree_mask,
        "reconstruct_indices_from_tree_mask_cpu": _standin_ops.reconstruct_indices_from_tree_mask,
    },
    "elementwise": {name: getattr(_cuda_ops, name) for name in _cuda_ops.__all__},
}


def _make_submodule(fullname: str) -> types.ModuleType:
    sub = fullname[len(__name__) + 1:]
    module = types.ModuleType(fullname)
    module.__dict__.update(_SUBMODULE_ATTRS.get(sub.split(".")[0], {}) if "." not in sub else {})
    module.__path__ = []  # a package, so deeper imports come here too

    def _getattr(attr: str, _prefix=sub):
        if attr.startswith("__"):
            raise AttributeError(attr)
        _note("request", f"{_prefix}.{attr}")
        return Missing(f"{_prefix}.{attr}")

    module.__getattr__ = _getattr
    return module


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _make_submodule(spec.name)

    def exec_module(self, module):
        sub = module.__name__[len(__name__) + 1:]
        if sub not in _SUBMODULE_ATTRS:
            _note("module", sub)


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())

speculative = importlib.import_module(__name__ + ".speculative")
utils = importlib.import_module(__name__ + ".utils")
