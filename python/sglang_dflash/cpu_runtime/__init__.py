"""Run SGLang 0.5.23's CPU engine on a host without CUDA.

The PyPI `sgl_kernel` wheel is CUDA-only and fails to import without libcuda,
and SGLang imports it at module import time in every process (before any
plugin runs). `STANDIN_DIR` holds an importable stand-in named `sgl_kernel`;
it must come first on `sys.path` / `PYTHONPATH` in the launching process and
in every process SGLang spawns. `activate()` does that for this process and
its children; `cpu_env()` gives the variables for a shell.
"""

from __future__ import annotations

import os
import sys

STANDIN_DIR = os.path.dirname(os.path.abspath(__file__))


def cuda_available() -> bool:
    """True when a usable CUDA device exists (checked without importing sglang)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken CUDA install: treat as no GPU
        return False


def cpu_env(base: dict | None = None) -> dict:
    """Environment variables that select SGLang's CPU engine with the stand-in."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if STANDIN_DIR not in paths:
        paths.insert(0, STANDIN_DIR)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    # Inductor needs a C++ toolchain per shape; SGLang's CPU path works eager.
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    # torch's CPU allocator asks for transparent huge pages (madvise) for large
    # blocks: the KV pools and weights a decode step gathers from at random.
    # Without them identical servers ran several percent apart for their whole
    # life (docs/decisions.md).
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env


def activate() -> None:
    """Set up this process (and children it spawns) for the CPU engine.

    Must run before the first `import sglang` / `import sgl_kernel`.
    """
    if "sgl_kernel" in sys.modules and not getattr(
        sys.modules["sgl_kernel"], "IS_SGLANG_DFLASH_STANDIN", False
    ):
        raise RuntimeError(
            "sglang_dflash.cpu_runtime.activate() must run before sgl_kernel is imported"
        )
    os.environ.update(cpu_env())
    if STANDIN_DIR not in sys.path:
        sys.path.insert(0, STANDIN_DIR)
