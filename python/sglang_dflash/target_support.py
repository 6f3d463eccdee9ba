"""Targets this worker can serve: full-attention decoder stacks with one KV pool.

The worker indexes the drafter's context by the target's KV slot ids and sizes
it from the target's first layer's key buffer, and the verify attention reads
one full-attention pool. A target with linear-attention / state-space layers
(Qwen3-Next, Qwen3.5, Mamba hybrids) or sliding-window layers (a second, windowed
KV pool) breaks those assumptions, so it is refused at start-up with the reason
rather than served with wrong output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HYBRID_KEYS = ("full_attention_interval", "hybrid_override_pattern", "linear_num_value_heads",
                "linear_key_head_dim", "mamba_d_state", "ssm_state_size", "attn_layer_indices")
_HYBRID_TYPES = ("mamba", "jamba", "zamba", "falcon_h1", "nemotron_h", "qwen3_next", "qwen3_5",
                 "granitemoehybrid", "lfm2", "minimax")


def unsupported_target_reason(config: Mapping[str, Any]) -> str | None:
    """Why a target (its HF text config as a dict) cannot be served, or None."""
    model_type = str(config.get("model_type", "")).lower()
    if any(t in model_type for t in _HYBRID_TYPES):
        return f"model_type {model_type!r} has linear-attention / state-space layers"
    hybrid = [k for k in _HYBRID_KEYS if config.get(k) is not None]
    if hybrid:
        return f"its config declares hybrid layers ({', '.join(hybrid)})"
    types = config.get("layer_types")
    if isinstance(types, (list, tuple)):
        other = sorted({str(t) for t in types} - {"full_attention"})
        if other:
            return f"layer_types has {other} layers (only full_attention is supported)"
    if config.get("sliding_window") and config.get("use_sliding_window"):
        return f"it uses sliding-window attention (sliding_window = {config['sliding_window']})"
    return None
