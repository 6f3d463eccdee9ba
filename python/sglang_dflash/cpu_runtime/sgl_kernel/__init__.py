"""CPU stand-in for SGLang's `sgl_kernel`, shipped by sglang-dflash.

Only for hosts without CUDA (the PyPI wheel needs libcuda to import). The ops
that SGLang's CPU code paths reach while serving DFLASH are implemented in
plain torch in `ops.py`; every other attribute resolves to a callable that
raises `NotImplementedError` naming the op, so nothing silently returns
garbage. We register no `torch.ops.sgl_kernel` ops on purpose: SGLang probes
`torch.ops.sgl_kernel.convert_weight_packed` to decide whether the Intel AMX
backend is usable, and it is not. The GDN ops of hybrid targets (`mamba.py`)
that SGLang reads from that namespace are attached there as plain callables.
"""

import importlib

from .ops import *  # noqa: F401,F403
from .ops import IMPLEMENTED_OPS

__version__ = "0.4.10"
IS_SGLANG_DFLASH_STANDIN = True


class MissingOp:
    """Placeholder for an op this stand-in does not implement."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel op '{self.__name__}' is not available: this host runs the "
            "CPU stand-in from sglang-dflash, which implements only "
            f"{sorted(IMPLEMENTED_OPS)}"
        )

    def __repr__(self) -> str:
        return f"<missing sgl_kernel op {self.__name__}>"


def __getattr__(name: str):
    # Dunder lookups (pickling, import machinery) must fail normally.
    if name.startswith("__"):
        raise AttributeError(name)
    return MissingOp(name)


# A real submodule (SGLang imports `sgl_kernel.speculative`), imported by name:
# `from . import speculative` would find the MissingOp of `__getattr__` instead.
speculative = importlib.import_module(__name__ + ".speculative")
mamba = importlib.import_module(__name__ + ".mamba")  # the GDN ops of hybrid targets


def _bind_gdn_ops() -> None:
    """SGLang's CPU GDN code binds these `torch.ops.sgl_kernel` names at import;
    they are attached as plain Python callables (no op registered, so nothing
    else in that namespace, `convert_weight_packed` included, appears)."""
    import torch

    for name, fn in mamba.GDN_TORCH_OPS.items():
        setattr(torch.ops.sgl_kernel, name, fn)


_bind_gdn_ops()
