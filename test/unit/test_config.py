"""DrafterConfig parsing and validation (no torch model needed)."""

import copy
import sys
from pathlib import Path

import pytest

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.config import (  # noqa: E402
    DrafterConfig,
    build_target_layer_ids,
    parse_drafter_config,
)

TARGET = dict(target_hidden_size=64, target_vocab_size=1024, target_num_layers=4)


def v1_dict(**dflash):
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "vocab_size": 1024, "hidden_act": "silu", "attention_bias": False,
        "num_target_layers": 4,
        "dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token_id": 3},
    }
    cfg["dflash_config"].update(dflash)
    return cfg


def v2_dict(**dflash):
    keys = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=8,
                output_multiplier=0.5, final_logit_softcapping=20.0)
    cfg = v1_dict(**{**keys, **dflash})
    cfg["architectures"] = ["DFlash2DraftModel"]
    return cfg


def test_v1_parses():
    cfg = parse_drafter_config(v1_dict(), **TARGET)
    assert cfg.version == 1
    assert cfg.target_layer_ids == (0, 2) and cfg.num_context_features == 2
    assert cfg.block_size == 8 and cfg.mask_token_id == 3 and cfg.num_target_layers == 4
    assert not cfg.has_conv and not cfg.has_selector
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2


def test_v2_parses():
    cfg = parse_drafter_config(v2_dict(), **TARGET)
    assert cfg.version == 2 and cfg.has_conv and cfg.has_selector
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.conv_num_groups) == (2, 16, 4)
    assert (cfg.selector_rank, cfg.selector_top_k) == (16, 8)
    assert cfg.output_multiplier == 0.5 and cfg.final_logit_softcapping == 20.0


def test_defaults_and_fallbacks():
    raw = v1_dict()
    del raw["head_dim"], raw["num_key_value_heads"], raw["rope_theta"]
    raw["dflash_config"] = {"target_layer_ids": [0]}
    raw["block_size"] = 4  # top-level fallback, as sglang reads it
    raw["mask_token_id"] = 7
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}  # transformers 5 style
    cfg = parse_drafter_config(raw)
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 4
    assert cfg.block_size == 4 and cfg.mask_token_id == 7 and cfg.rope_theta == 5e5


def test_text_config_section_is_used():
    raw = v1_dict()
    text = {k: raw.pop(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "head_dim",
                                    "vocab_size")}
    raw["text_config"] = text
    assert parse_drafter_config(raw, **TARGET).hidden_size == 64


def test_softcap_nonpositive_disables():
    cfg = parse_drafter_config(v2_dict(final_logit_softcapping=0.0))
    assert cfg.final_logit_softcapping is None


# Expected values are what sglang 0.5.23's build_target_layer_ids returns.
@pytest.mark.parametrize("layers,draft,expected", [
    (36, 1, [18]), (36, 5, [1, 9, 17, 25, 33]), (28, 5, [1, 7, 13, 19, 25]),
    (4, 2, [1, 1]), (64, 5, [1, 16, 31, 46, 61]), (10, 3, [1, 4, 7]),
    # Python rounds half to even, as upstream does: 15.5 -> 16, 44.5 -> 44.
    (62, 5, [1, 16, 30, 44, 59]), (48, 6, [1, 10, 19, 27, 36, 45]),
])
def test_build_target_layer_ids(layers, draft, expected):
    assert build_target_layer_ids(layers, draft) == expected


def test_target_layer_ids_derived_when_absent():
    raw = v1_dict()
    del raw["dflash_config"]["target_layer_ids"]
    raw["num_target_layers"] = 36
    raw["num_hidden_layers"] = 5
    cfg = parse_drafter_config(raw, target_num_layers=36)
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33)
    raw["num_hidden_layers"] = 1
    assert parse_drafter_config(raw, target_num_layers=36).target_layer_ids == (18,)


def _set(path, value):
    """Return a mutator that sets a dotted key (value None deletes it)."""
    def mutate(cfg):
        *parents, leaf = path.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return mutate


_DELETE = object()

INVALID = [
    # (mutator, target kwargs, words the message must contain)
    (_set("dflash_config.target_layer_ids", [1, 2, 9]), TARGET,
     ["dflash_config.target_layer_ids[2] = 9", "out of range", "4 layers"]),
    # The last layer's output is never captured by sglang (it reads layer k at layer k+1).
    (_set("dflash_config.target_layer_ids", [1, 3]), TARGET,
     ["dflash_config.target_layer_ids[1] = 3", "out of range", "4 layers"]),
    (_set("dflash_config.target_layer_ids", []), TARGET, ["dflash_config.target_layer_ids"]),
    (_set("dflash_config.target_layer_ids", [1, True]), TARGET, ["target_layer_ids[1]"]),
    (_set("dflash_config.target_layer_ids", "1,2"), TARGET, ["target_layer_ids"]),
    (_set("dflash_config.block_size", 1), TARGET, ["dflash_config.block_size = 1", ">= 2"]),
    (_set("dflash_config.block_size", 8.0), TARGET, ["dflash_config.block_size", "int"]),
    (_set("dflash_config.block_size", True), TARGET, ["dflash_config.block_size"]),
    (_set("dflash_config.mask_token_id", 1024), TARGET, ["mask_token_id = 1024", "vocab_size"]),
    (_set("dflash_config.mask_token_id", -1), TARGET, ["mask_token_id = -1"]),
    (_set("dflash_config.mask_token_id", False), TARGET, ["mask_token_id"]),
    (_set("hidden_size", 128), TARGET, ["hidden_size = 128", "target's hidden_size = 64"]),
    (_set("vocab_size", 2048), TARGET, ["vocab_size = 2048", "target's vocab_size = 1024"]),
    (_set("num_target_layers", 36), TARGET, ["num_target_layers = 36", "4 layers"]),
    (_set("num_hidden_layers", 0), TARGET, ["num_hidden_layers = 0"]),
    (_set("num_hidden_layers", _DELETE), TARGET, ["num_hidden_layers", "missing"]),
    (_set("num_key_value_heads", 3), TARGET, ["num_key_value_heads = 3", "divide"]),
    (_set("rms_norm_eps", -1.0), TARGET, ["rms_norm_eps = -1.0"]),
    (_set("rope_theta", "big"), TARGET, ["rope_theta"]),
    (_set("hidden_act", "gelu"), TARGET, ["hidden_act", "gelu", "silu"]),
    (_set("attention_bias", True), TARGET, ["attention_bias"]),
    (_set("architectures", ["LlamaForCausalLM"]), TARGET, ["architectures", "DFlashDraftModel"]),
    (_set("architectures", _DELETE), TARGET, ["architectures"]),
    (_set("layer_types", ["sliding_attention", "full_attention"]), TARGET, ["layer_types"]),
    (_set("is_causal", True), TARGET, ["is_causal"]),
    (_set("rope_scaling", {"rope_type": "yarn", "factor": 4.0}), TARGET,
     ["rope_scaling.rope_type"]),
    (_set("dflash_config.conv_kernel_size", 2), TARGET, ["conv_kernel_size = 2", "together"]),
    (_set("dflash_config.selector_rank", 16), TARGET, ["selector_rank = 16"]),
    (_set("dflash_config.projector_type", "domino"), TARGET, ["projector_type"]),
    (_set("dflash_config.target_layer_ids", _DELETE), {}, ["target_layer_ids", "missing"]),
]


@pytest.mark.parametrize("mutate,target,words", INVALID,
                         ids=[" ".join(w[0].split()[:2]) for _, _, w in INVALID])
def test_invalid_v1(mutate, target, words):
    raw = copy.deepcopy(v1_dict())
    if not target:
        del raw["num_target_layers"]
    mutate(raw)
    with pytest.raises(ValueError) as info:
        parse_drafter_config(raw, **target)
    message = str(info.value)
    assert message.startswith("drafter config: ")
    for word in words:
        assert word in message, (word, message)


INVALID_V2 = [
    (_set("dflash_config.conv_group_size", 24), ["conv_group_size = 24", "divide hidden_size"]),
    (_set("dflash_config.conv_group_size", 0), ["conv_kernel_size = 2", "together"]),
    (_set("dflash_config.conv_kernel_size", -1), ["conv_kernel_size = -1"]),
    (_set("dflash_config.selector_top_k", 0), ["selector_rank = 16", "together"]),
    (_set("dflash_config.selector_top_k", 2000), ["selector_top_k = 2000", "vocab_size"]),
    (_set("dflash_config.selector_rank", 0), ["selector_rank", "together"]),
    (_set("dflash_config.output_multiplier", 0.0), ["output_multiplier = 0.0"]),
    (_set("dflash_config.output_multiplier", True), ["output_multiplier"]),
    (_set("dflash_config.selector_rank", 16.5), ["selector_rank = 16.5", "int"]),
]


@pytest.mark.parametrize("mutate,words", INVALID_V2, ids=[w[0] for _, w in INVALID_V2])
def test_invalid_v2(mutate, words):
    raw = copy.deepcopy(v2_dict())
    mutate(raw)
    with pytest.raises(ValueError) as info:
        parse_drafter_config(raw, **TARGET)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_v2_requires_selector():
    raw = v2_dict()
    raw["dflash_config"].update(selector_rank=0, selector_top_k=0)
    with pytest.raises(ValueError, match="selector_rank = 0 must be > 0 for DFlash2DraftModel"):
        parse_drafter_config(raw, **TARGET)


def test_dataclass_validates_direct_construction():
    cfg = parse_drafter_config(v1_dict(), **TARGET)
    fields = dict(cfg.__dict__)
    fields["block_size"] = 1
    with pytest.raises(ValueError, match="block_size = 1"):
        DrafterConfig(**fields)
