"""`sgl_kernel.speculative` of the CPU stand-in: the tree ops SGLang imports
from this submodule (NGRAM's `reconstruct_tree.py`); other names resolve to a
`MissingOp` that raises when called, like the package root."""

from .ops import reconstruct_indices_from_tree_mask, reconstruct_indices_from_tree_mask_cpu  # noqa: F401


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    from . import MissingOp

    return MissingOp(name)
