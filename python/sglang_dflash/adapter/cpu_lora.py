"""LoRA adapters on SGLang's CPU engine.

SGLang 0.5.23's LoRA code allocates host buffers with `pin_memory=True` (the
LoRA layers' output offsets, the backends' per-batch segment tables) and pins
adapter weights. Pinning needs an accelerator driver, so on a host without one
every `--enable-lora` server fails at start-up ("Found no NVIDIA driver"), with
or without speculation. Pinned pages only speed host-to-device copies, which a
CPU engine never makes, so on such a host the LoRA manager's construction
makes pinning a no-op for the process: `Tensor.pin_memory()` returns the tensor
and the factory functions ignore `pin_memory=`. Hosts that can pin are left
alone, and a server without LoRA never builds a LoRA manager, so it is never
patched.
"""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger(__name__)

LORA_MANAGER_TARGET = "sglang.srt.lora.lora_manager.LoRAManager.__init__"

# Every torch factory SGLang's LoRA code passes `pin_memory=` to, and their kin.
_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange",
              "empty_like", "zeros_like", "ones_like", "full_like")
_installed = False


def can_pin() -> bool:
    """Whether this process can allocate page-locked host memory (it needs an
    accelerator: CUDA, ROCm, XPU, ...)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


def _ignore_pin_memory(factory):
    @functools.wraps(factory)
    def call(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return call


def install_no_pinning() -> None:
    """Make pinning a no-op in this process (idempotent)."""
    global _installed
    if _installed:
        return
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    for name in _FACTORIES:
        setattr(torch, name, _ignore_pin_memory(getattr(torch, name)))
    _installed = True
    logger.info("sglang-dflash: no accelerator to pin host memory for; LoRA buffers stay pageable")


def unpinned_lora_on_cpu(*args, **kwargs):
    """BEFORE `LoRAManager.__init__`: on a host that cannot pin, turn pinning off."""
    if not can_pin():
        install_no_pinning()
    return None
