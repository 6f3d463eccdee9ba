"""`DFlashDraftModel` / `DFlash2DraftModel` (and the aliases SGLang 0.5.23
registers, `DFlashLagunaForCausalLM` among them): our drafter as SGLang model classes.

SGLang resolves a checkpoint's `architectures[0]` through `ModelRegistry` and
builds the class as `Cls(config, quant_config=None, prefix="")`, then streams
`(name, tensor)` pairs into `load_weights`. The plugin registers these classes
over upstream's of the same names, so any SGLang code path that loads a
published DFlash / DFlash 2 checkpoint gets our strict behaviour: the config is
validated key by key (`config.parse_drafter_config`) and `load_weights`
refuses missing, unexpected, mis-shaped or non-finite weights with one error
naming all of them, where upstream's loader skips unknown names and leaves
missing conv / selector weights at their initial values.

Our worker builds the same module directly (`checkpoint.load_drafter`, which
also checks the pair against the target); the forward takes the drafter's
real inputs (block embeddings, positions, context K/V) because the drafter is
not run by SGLang's ModelRunner: its context cache is indexed by the target's
KV slots (see adapter/worker.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from sglang_dflash.checkpoint import load_state_strict
from sglang_dflash.config import parse_drafter_config
from sglang_dflash.model import DFlashDrafter


def _config_dict(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


class DFlashDraftModel(nn.Module):
    """A DFlash drafter (v1 or DFlash 2 layout, chosen by its config)."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        if quant_config is not None:
            raise ValueError("sglang-dflash drafters do not support quantization")
        self.cfg = parse_drafter_config(_config_dict(config))
        self.drafter = DFlashDrafter(self.cfg)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_state_strict(self.drafter, weights, origin=type(self).__name__)

    def forward(self, block_embeds, block_positions, ctx_k, ctx_v, ctx_valid):
        """Hidden states of one block: see `DFlashDrafter.forward_block`."""
        return self.drafter.forward_block(block_embeds, block_positions, ctx_k, ctx_v, ctx_valid)


class DFlash2DraftModel(DFlashDraftModel):
    """The published DFlash 2 architecture name; same class, v2 config."""


class DFlash2BeamDraftModel(DFlashDraftModel):
    """An alias SGLang 0.5.23 loads as DFlash 2 (an empty subclass upstream)."""


class MiniMaxDFlash2DraftModel(DFlashDraftModel):
    """An alias SGLang 0.5.23 loads as DFlash 2 (an empty subclass upstream)."""


class DFlashLagunaForCausalLM(DFlashDraftModel):
    """SGLang's Laguna drafter name: v1 with attention gates and context norms (config.py)."""


EntryClass = [DFlashDraftModel, DFlash2DraftModel, DFlash2BeamDraftModel, MiniMaxDFlash2DraftModel,
              DFlashLagunaForCausalLM]
