"""Drafter training: the block-diffusion objective and a small trainer.

Imports neither sglang nor the adapter. `objective` needs only torch; the
trainer drives a frozen HF target (duck-typed, so transformers is needed only
to build one).
"""

from .objective import (
    LossOutput,
    ObjectiveConfig,
    block_diffusion_loss,
    block_labels,
    context_mask,
    sample_anchors,
    slot_weights,
)
from .trainer import (
    AcceptanceReport,
    TrainConfig,
    TrainHistory,
    measure_acceptance,
    train_drafter,
)

__all__ = [
    "AcceptanceReport",
    "LossOutput",
    "ObjectiveConfig",
    "TrainConfig",
    "TrainHistory",
    "block_diffusion_loss",
    "block_labels",
    "context_mask",
    "measure_acceptance",
    "sample_anchors",
    "slot_weights",
    "train_drafter",
]
