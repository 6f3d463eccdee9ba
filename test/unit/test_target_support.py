"""Targets the worker serves, and those it refuses at start-up, each with a named reason."""

import pytest
from sglang_dflash.target_support import has_recurrent_state, unsupported_target_reason


def test_full_attention_targets_are_served():
    assert unsupported_target_reason({"model_type": "qwen3", "layer_types": ["full_attention"] * 4}) is None
    # Qwen3 configs carry a sliding_window that is off unless use_sliding_window is set.
    assert unsupported_target_reason({"model_type": "qwen3", "sliding_window": 4096,
                                      "use_sliding_window": False}) is None


@pytest.mark.parametrize("config", [
    {"model_type": "laguna", "sliding_window": 512,
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]},
    {"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
    {"model_type": "gemma3_text", "sliding_window": 512, "layer_types": ["sliding_attention"] * 5},
    {"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True},
])
def test_sliding_window_targets_are_served(config):
    """Sliding layers, in one pool or SGLang's windowed second pool: the worker's
    context is keyed by full-pool slots, which every token keeps."""
    assert unsupported_target_reason(config) is None


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_next"])
def test_gdn_hybrids_are_served(model_type):
    """Gated DeltaNet hybrids: the worker commits their recurrent state (linear_state.py)."""
    config = {"model_type": model_type, "full_attention_interval": 4,
              "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    assert unsupported_target_reason(config) is None


@pytest.mark.parametrize("model_type", ["lfm2", "lfm2_moe"])
def test_short_conv_hybrids_are_served(model_type):
    """LFM2's conv windows live in the same state pool, committed the same way."""
    config = {"model_type": model_type, "layer_types": ["conv", "full_attention", "conv", "full_attention"]}
    assert unsupported_target_reason(config) is None


def test_mamba2_hybrids_are_served():
    """Nemotron-H's Mamba2 layers keep a conv window and an SSM state in the same pool."""
    assert unsupported_target_reason({"model_type": "nemotron_h", "hybrid_override_pattern": "M*M-"}) is None


@pytest.mark.parametrize("config, needle", [
    ({"model_type": "lfm2", "layer_types": ["conv", "linear_attention"]}, "linear_attention"),
    ({"model_type": "qwen3_next"}, "full_attention_interval"),
    ({"model_type": "qwen3_5_text", "full_attention_interval": 2,
      "layer_types": ["linear_attention", "sliding_attention"]}, "sliding_attention"),
    ({"model_type": "jamba", "attn_layer_indices": [3]}, "linear-attention"),
    ({"model_type": "falcon_h1", "mamba_d_state": 16}, "linear-attention"),
    ({"model_type": "custom", "full_attention_interval": 4}, "full_attention_interval"),
    ({"model_type": "llama", "layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
    ({"model_type": "llama4_text", "layer_types": ["chunked_attention", "full_attention"]},
     "chunked_attention"),
])
def test_state_space_and_other_layer_kinds_are_refused(config, needle):
    reason = unsupported_target_reason(config)
    assert reason is not None and needle in reason


@pytest.mark.parametrize("model_type, recurrent", [
    ("qwen3_5_text", True), ("qwen3_next", True), ("lfm2", True), ("lfm2_moe", True), ("nemotron_h", True),
    ("qwen3", False), ("laguna", False), ("gpt_oss", False), ("deepseek_v3", False),
])
def test_recurrent_state_targets(model_type, recurrent):
    """Targets whose state pool SGLang sizes from --max-running-requests under speculation."""
    assert has_recurrent_state({"model_type": model_type}) is recurrent
