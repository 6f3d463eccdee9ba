"""Targets this worker can serve: attention decoder stacks (full and
sliding-window layers), the Gated DeltaNet hybrids (Qwen3.5, Qwen3-Next), the
short-convolution hybrids (LFM2) and the Mamba2 hybrids (Nemotron-H).

The worker indexes the drafter's context by the target's full-pool KV slot ids.
A hybrid sliding-window target (SGLang's `SWAKVPool`: Laguna, gpt-oss, Gemma 4,
MiMo-V2) keeps its sliding layers in a second, windowed pool whose slots are the
full pool's translated; every full slot id stays valid while its request lives,
so the drafter's context is unaffected, and the CPU verify attention reads a
sliding layer through the translation (`adapter/attention.py`). A GDN hybrid
keeps the full-attention pool for its full-attention layers and a per-request
recurrent state for its linear ones, which a verify leaves untouched (SGLang's
GDN verify keeps the state after each position) and the worker commits at the
accepted position (`adapter/linear_state.py`); an LFM2 conv layer keeps a conv
window only, and a Nemotron-H Mamba2 layer a conv window and an SSM state in the
same pool layout, committed the same way. Other state-space hybrids (Mamba,
Jamba, Falcon-H1, ...) are refused at start-up with the reason rather than
served with wrong output. A multi-head latent attention target (DeepSeek-V2/V3,
Kimi-K2.5) caches one compressed latent row per token in SGLang's MLA pool,
keyed by the same slots, so it needs nothing here. Whether the target's model class can hand the drafter its layers
is SGLang's to say (`set_dflash_layers_to_capture`), checked when it loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HYBRID_KEYS = ("full_attention_interval", "hybrid_override_pattern", "linear_num_value_heads",
                "linear_key_head_dim", "mamba_d_state", "ssm_state_size", "attn_layer_indices")
_HYBRID_TYPES = ("mamba", "jamba", "zamba", "falcon_h1", "nemotron_h", "qwen3_next", "qwen3_5",
                 "granitemoehybrid", "lfm2", "minimax")
# GDN hybrids SGLang serves under DFLASH (their models capture the drafter's layers).
GDN_HYBRID_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
_GDN_LAYER_TYPES = {"full_attention", "linear_attention"}
# Short-convolution hybrids SGLang serves under DFLASH: each conv layer keeps a
# per-request conv window in the same state pool, committed the same way.
SHORT_CONV_HYBRID_TYPES = ("lfm2", "lfm2_moe")
_SHORT_CONV_LAYER_TYPES = {"full_attention", "conv"}
# Mamba2 hybrids SGLang serves under DFLASH (SGLang validates their layer list).
MAMBA2_HYBRID_TYPES = ("nemotron_h",)
_ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}


def is_gdn_hybrid(config: Mapping[str, Any]) -> bool:
    return str(config.get("model_type", "")).lower() in GDN_HYBRID_TYPES


def has_recurrent_state(config: Mapping[str, Any]) -> bool:
    """Whether a servable target keeps per-request recurrent state (GDN, short
    conv, Mamba2 layers) in SGLang's state pool."""
    model_type = str(config.get("model_type", "")).lower()
    return is_gdn_hybrid(config) or model_type in SHORT_CONV_HYBRID_TYPES + MAMBA2_HYBRID_TYPES


def unsupported_target_reason(config: Mapping[str, Any]) -> str | None:
    """Why a target (its HF text config as a dict) cannot be served, or None."""
    model_type = str(config.get("model_type", "")).lower()
    if is_gdn_hybrid(config):
        types = config.get("layer_types")
        other = sorted({str(t) for t in types or ()} - _GDN_LAYER_TYPES)
        if other:
            return f"layer_types has {other} layers (a GDN hybrid has full and linear attention only)"
        if config.get("full_attention_interval") is None:
            return ("its config has no full_attention_interval (SGLang places the hybrid's "
                    "full-attention layers by it)")
        return None
    if model_type in SHORT_CONV_HYBRID_TYPES:
        other = sorted({str(t) for t in config.get("layer_types") or ()} - _SHORT_CONV_LAYER_TYPES)
        if other:
            return f"layer_types has {other} layers (a short-conv hybrid has full attention and conv only)"
        return None
    if model_type in MAMBA2_HYBRID_TYPES:
        return None
    if any(t in model_type for t in _HYBRID_TYPES):
        return f"model_type {model_type!r} has linear-attention / state-space layers"
    hybrid = [k for k in _HYBRID_KEYS if config.get(k) is not None]
    if hybrid:
        return f"its config declares hybrid layers ({', '.join(hybrid)})"
    types = config.get("layer_types")
    if isinstance(types, (list, tuple)):
        other = sorted({str(t) for t in types} - _ATTENTION_LAYER_TYPES)
        if other:
            return f"layer_types has {other} layers (full and sliding attention are supported)"
    return None
