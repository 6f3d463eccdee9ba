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
    RopeScaling,
    build_target_layer_ids,
    parse_drafter_config,
    resolve_mask_token_id,
    serving_dtype,
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


def _all(*mutators):
    def mutate(cfg):
        for m in mutators:
            m(cfg)
    return mutate

INVALID = [
    # (mutator, target kwargs, words the message must contain)
    (_set("dflash_config.target_layer_ids", [1, 2, 9]), TARGET,
     ["dflash_config.target_layer_ids[2] = 9", "out of range", "4 layers"]),
    (_set("dflash_config.target_layer_ids", [1, 4]), TARGET,
     ["dflash_config.target_layer_ids[1] = 4", "out of range", "4 layers", "< 4"]),
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
    (_set("num_target_layers", 2.5), TARGET, ["num_target_layers = 2.5", "int"]),
    (_set("num_hidden_layers", 0), TARGET, ["num_hidden_layers = 0"]),
    (_set("num_hidden_layers", _DELETE), TARGET, ["num_hidden_layers", "missing"]),
    (_set("num_key_value_heads", 3), TARGET, ["num_key_value_heads = 3", "divide"]),
    (_set("rms_norm_eps", -1.0), TARGET, ["rms_norm_eps = -1.0"]),
    (_set("rope_theta", "big"), TARGET, ["rope_theta"]),
    (_set("hidden_act", "gelu"), TARGET, ["hidden_act", "gelu", "silu"]),
    (_set("attention_bias", "yes"), TARGET, ["attention_bias = 'yes'", "bool"]),
    (_set("rope_is_neox_style", False), TARGET, ["rope_is_neox_style = False"]),
    (_set("dtype", "float8"), TARGET, ["dtype = 'float8'"]),
    (_set("architectures", ["LlamaForCausalLM"]), TARGET, ["architectures", "DFlashDraftModel"]),
    (_set("architectures", ["DFlashDraftModel", "DFlash2DraftModel"]), TARGET,
     ["architectures", "exactly one"]),
    (_set("architectures", _DELETE), TARGET, ["architectures"]),
    (_set("layer_types", ["sliding_attention", "full_attention"]), TARGET, ["layer_types"]),
    (_set("rope_scaling", {"rope_type": "longrope", "factor": 4.0}), TARGET,
     ["rope_scaling.rope_type = 'longrope'", "not supported"]),
    (_set("rope_scaling", {"rope_type": "yarn"}), TARGET,
     ["rope_scaling.factor", "required", "'yarn'"]),
    (_set("rope_scaling", {"rope_type": "linear", "factor": -2.0}), TARGET,
     ["rope_scaling.factor = -2.0", "> 0"]),
    (_set("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2}),
     TARGET, ["rope_scaling.attention_factor", "not supported"]),
    (_set("rope_scaling", {"factor": 4.0}), TARGET, ["rope_scaling", "rope_type"]),
    (_set("rope_parameters", {"rope_type": "default", "mrope_section": [8, 8]}), TARGET,
     ["rope_parameters.mrope_section"]),
    (_all(_set("rope_parameters", {"rope_type": "linear", "factor": 3.0}),
          _set("rope_scaling", {"type": "linear", "factor": 2.0})), TARGET,
     ["rope_scaling", "disagrees with rope_parameters"]),
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


# ---------------------------------------------------------------------------
# Tolerance rules shared with sglang 0.5.23
# ---------------------------------------------------------------------------


def test_target_layer_ids_may_tap_the_last_layer(caplog):
    """sglang's resolve_target_layer_ids allows ids up to L - 1 (a warning says
    that most targets do not capture after their last layer)."""
    with caplog.at_level("WARNING", logger="sglang_dflash.config"):
        cfg = parse_drafter_config(v1_dict(target_layer_ids=[1, 3]), **TARGET)
    assert cfg.target_layer_ids == (1, 3)
    assert "last layer (3)" in caplog.text


def test_num_target_layers_mismatch_only_warns(caplog):
    raw = v1_dict()
    raw["num_target_layers"] = 36
    with caplog.at_level("WARNING", logger="sglang_dflash.config"):
        cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.num_target_layers == 4  # the runtime target's depth
    assert "num_target_layers = 36" in caplog.text and "4 layers" in caplog.text
    # Without a target the declared depth bounds the ids.
    assert parse_drafter_config(raw).num_target_layers == 36


def test_attention_bias_and_dtype():
    raw = v1_dict()
    raw.update(attention_bias=True, dtype="bfloat16", torch_dtype="float32")
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.attention_bias is True and cfg.dtype == "bfloat16"  # dtype wins (transformers 5)
    del raw["dtype"]
    assert parse_drafter_config(raw, **TARGET).dtype == "float32"


@pytest.mark.parametrize("declared,server,want", [
    ("bfloat16", "auto", "bfloat16"), ("float32", "auto", "float16"), (None, "auto", "float16"),
    ("bfloat16", "float32", "float32"),
])
def test_serving_dtype_follows_sglang_dtype_auto(declared, server, want):
    raw = v1_dict()
    if declared:
        raw["dtype"] = declared
    assert serving_dtype(parse_drafter_config(raw, **TARGET), server) == want


@pytest.mark.parametrize("arch,version", [
    ("DFlashDraftModel", 1), ("DFlash2DraftModel", 2),
    # Empty subclasses of DFlash2DraftModel in sglang 0.5.23: same weights and math.
    ("DFlash2BeamDraftModel", 2), ("MiniMaxDFlash2DraftModel", 2),
])
def test_architecture_aliases(arch, version):
    raw = v2_dict() if version == 2 else v1_dict()
    raw["architectures"] = [arch]
    assert parse_drafter_config(raw, **TARGET).version == version


@pytest.mark.parametrize("gating,gate", [
    (None, "per-head"),  # absent: sglang's getattr(config, "gating", True)
    (True, "per-head"), ("per-head", "per-head"), ("per-element", "per-element"),
    (False, None), ("disabled", None),
])
def test_laguna_drafter_gating(gating, gate):
    """sglang's Laguna drafter: a v1 layout with a gate per its `gating` (as sglang's
    normalize_gating reads it) and the Laguna context norms."""
    raw = v1_dict()
    raw["architectures"] = ["DFlashLagunaForCausalLM"]
    if gating is not None:
        raw["gating"] = gating
    cfg = parse_drafter_config(raw, **TARGET)
    assert (cfg.version, cfg.attention_gate, cfg.laguna_context) == (1, gate, True)


@pytest.mark.parametrize("arch,gating,needle", [
    ("DFlashLagunaForCausalLM", "per-channel", "gating"),
    ("DFlashLagunaForCausalLM", ["per-head"], "gating"),
    # a gate on an architecture whose sglang class builds none is refused, not ignored
    ("DFlashDraftModel", True, "gating"),
])
def test_bad_gating_is_refused_naming_the_key(arch, gating, needle):
    raw = v1_dict()
    raw["architectures"], raw["gating"] = [arch], gating
    with pytest.raises(ValueError, match=needle):
        parse_drafter_config(raw, **TARGET)


@pytest.mark.parametrize("arch", ["MuseGlimmerAssistantModel"])
def test_upstream_only_architectures_are_refused_by_name(arch):
    raw = v1_dict()
    raw["architectures"] = [arch]
    with pytest.raises(ValueError) as info:
        parse_drafter_config(raw, **TARGET)
    message = str(info.value)
    for word in (arch, "not support", "SGLANG_DFLASH_UPSTREAM=1"):
        assert word in message, (word, message)


# ---------------------------------------------------------------------------
# RoPE keys
# ---------------------------------------------------------------------------


def rope_cfg(**keys):
    raw = v1_dict()
    raw.update(keys)
    return parse_drafter_config(raw, **TARGET)


def test_rope_theta_sources():
    # rope_parameters' theta wins over a top-level rope_theta (sglang's get_rope_config).
    cfg = rope_cfg(rope_parameters={"rope_type": "default", "rope_theta": 5e5}, rope_theta=1e6)
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling is None
    # rope_scaling null (SpecForge's v1 configs) and an int theta.
    cfg = rope_cfg(rope_scaling=None, rope_theta=1000000)
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None
    # Legacy `type` and both dicts saying the same thing.
    cfg = rope_cfg(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=1e6)
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling == RopeScaling("linear", factor=2.0)
    cfg = rope_cfg(rope_scaling={"type": "linear", "factor": 2.0},
                   rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 3e5})
    assert cfg.rope_theta == 3e5 and cfg.rope_scaling.factor == 2.0


def test_rope_scaling_defaults_follow_sglang_get_rope():
    cfg = rope_cfg(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
    assert cfg.rope_scaling == RopeScaling(
        "yarn", factor=4.0, original_max_position_embeddings=2048)  # max_position_embeddings
    cfg = rope_cfg(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192})
    assert cfg.rope_scaling.original_max_position_embeddings == 8192
    cfg = rope_cfg(rope_scaling={"rope_type": "dynamic", "alpha": 2.0})
    assert cfg.rope_scaling.alpha == 2.0 and cfg.rope_scaling.factor == 1.0
    cfg = rope_cfg(rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16,
                                 "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False})
    s = cfg.rope_scaling
    assert (s.beta_fast, s.mscale, s.mscale_all_dim, s.truncate) == (16.0, 1.0, 0.5, False)


# ---------------------------------------------------------------------------
# Mask token id from the tokenizer
# ---------------------------------------------------------------------------


class FakeTokenizer:
    def __init__(self, vocab, mask_token=None, mask_token_id=None):
        self.vocab, self.mask_token, self.mask_token_id = vocab, mask_token, mask_token_id

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


def no_mask_id(**dflash):
    raw = v1_dict(**dflash)
    del raw["dflash_config"]["mask_token_id"]
    cfg = parse_drafter_config(raw, **TARGET)
    assert cfg.mask_token_id is None  # parsing passes without it
    return cfg


def test_mask_token_id_from_config_checked_against_tokenizer():
    cfg = parse_drafter_config(v1_dict(), **TARGET)  # mask_token_id 3
    assert resolve_mask_token_id(cfg, FakeTokenizer({"a": 0}), 1024) == 3
    assert resolve_mask_token_id(cfg, None, 1024) == 3
    assert resolve_mask_token_id(cfg, FakeTokenizer({"<|MASK|>": 3}), 1024) == 3
    with pytest.raises(ValueError, match=r"mask_token_id = 3 conflicts.*'<\|MASK\|>' to 9"):
        resolve_mask_token_id(cfg, FakeTokenizer({"<|MASK|>": 9}), 1024)
    with pytest.raises(ValueError, match=r"mask_token_id = 3 is outside the target vocabulary"):
        resolve_mask_token_id(cfg, None, 3)


def test_mask_token_id_from_tokenizer():
    cfg = no_mask_id()
    # The tokenizer's own mask token, when it is the drafter's mask_token.
    tok = FakeTokenizer({"a": 0, "<|MASK|>": 5}, mask_token="<|MASK|>", mask_token_id=7)
    assert resolve_mask_token_id(cfg, tok, 1024) == 7
    # Otherwise a vocabulary lookup (a tokenizer or a plain mapping).
    tok = FakeTokenizer({"a": 0, "<|MASK|>": 5}, mask_token="[MASK]", mask_token_id=1)
    assert resolve_mask_token_id(cfg, tok, 1024) == 5
    assert resolve_mask_token_id(cfg, {"<|MASK|>": 6}, 1024) == 6
    # A custom mask_token string.
    cfg = no_mask_id(mask_token="<mask>")
    assert resolve_mask_token_id(cfg, {"<mask>": 8, "<|MASK|>": 6}, 1024) == 8


def test_mask_token_id_unresolvable_fails_clearly():
    cfg = no_mask_id()
    with pytest.raises(ValueError) as info:
        resolve_mask_token_id(cfg, FakeTokenizer({"a": 0, "b": 1}), 1024)
    message = str(info.value)
    for word in ("mask_token_id is not set", "'<|MASK|>'", "does not add tokens",
                 "SGLang would add it as id 2"):
        assert word in message, (word, message)
    with pytest.raises(ValueError, match="no tokenizer"):
        resolve_mask_token_id(cfg, None, 1024)
    with pytest.raises(ValueError, match=r"'<\|MASK\|>' = 1024 is outside"):
        resolve_mask_token_id(cfg, {"<|MASK|>": 1024}, 1024)


def test_repeated_target_layer_ids_are_refused():
    """SGLang captures each target layer once; a repeated id (e.g. the derived
    [1, 1] for a 4-layer target and 2 draft layers) would crash the first prefill."""
    with pytest.raises(ValueError, match="target_layer_ids = \\[1, 1\\] must not repeat a layer"):
        parse_drafter_config(v1_dict(target_layer_ids=[1, 1]), target_num_layers=4)
    raw = v1_dict()
    del raw["dflash_config"]["target_layer_ids"]
    assert build_target_layer_ids(4, 2) == [1, 1]  # upstream's derivation for this pair ...
    with pytest.raises(ValueError, match="must not repeat a layer"):
        parse_drafter_config(raw, target_num_layers=4)  # ... is refused, not served
