"""Drafter configuration: parse and validate a DFlash / DFlash 2 `config.json`.

`parse_drafter_config` reads the dict a published drafter ships (the keys of
sglang 0.5.23's `parse_dflash_draft_config` plus the Qwen3 backbone keys) and
returns a frozen `DrafterConfig`. Every key read is validated; a failure raises
`ValueError` naming the key, the value and the rule, e.g.

    drafter config: dflash_config.target_layer_ids[2] = 9 is out of range for a
    target with 4 layers

Per-layer attention follows sglang 0.5.23 (`models/dflash.py`
`_get_dflash_layer_attention_params`): with no `layer_types` every layer is
non-causal (ENCODER_ONLY); a `"full_attention"` layer is non-causal unless
`is_causal` is true; a `"sliding_attention"` layer is causal with the
RadixAttention window `sliding_window - 1`, i.e. a query at position q sees keys
at positions [q - (sliding_window - 1), q]. The result is stored per layer as
`DrafterConfig.layer_causal` / `layer_window`.

Features this package does not implement (RoPE scaling, Gemma norms, attention
sinks, Domino projectors, drafter embeddings) are rejected explicitly rather
than ignored, and so are the attention-type combinations whose upstream meaning
is ambiguous: `is_causal: true` without `layer_types` (sglang ignores it there,
transformers-filled `layer_types` would honour it), `is_causal: false` with
sliding layers (a non-causal window differs between sglang's attention
backends) and `use_sliding_window: true` without `layer_types` (transformers
would derive sliding layers from `max_window_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_dflash.checks import is_finite, is_int

ARCHITECTURE_VERSIONS = {"DFlashDraftModel": 1, "DFlash2DraftModel": 2}
DEFAULT_BLOCK_SIZE = 16  # sglang's default when the checkpoint names none
DEFAULT_MASK_TOKEN = "<|MASK|>"
_PREFIX = "drafter config: "

_MISSING = object()


def _fail(message: str) -> ValueError:
    return ValueError(_PREFIX + message)


@dataclass(frozen=True)
class DrafterConfig:
    """Validated drafter hyper-parameters (one per checkpoint).

    `target_layer_ids[j]` is the target layer whose *output* is feature j
    (HF `hidden_states[k + 1]`); `fc` maps the n concatenated features to H.
    """

    version: int  # 1 = DFlash, 2 = DFlash 2 (candidate selector)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    mask_token: str = DEFAULT_MASK_TOKEN
    conv_kernel_size: int = 0  # taps; 0 = no grouped convolution
    conv_group_size: int = 0  # channels per conv coefficient group
    selector_rank: int = 0  # r; 0 = no candidate selector
    selector_top_k: int = 0  # K
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # Per draft layer: causal mask (k_pos <= q_pos) and window w (keys with
    # k_pos >= q_pos - w; RadixAttention's sliding_window_size = sliding_window - 1;
    # None = unbounded). None fills in all-non-causal, unwindowed layers.
    layer_causal: tuple[bool, ...] | None = None
    layer_window: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        _check_backbone(self)
        _fill_layer_attention(self)
        _check_dflash(self)
        _check_target_layer_ids(self.target_layer_ids, self.num_target_layers)

    @property
    def num_context_features(self) -> int:
        """n: target layers concatenated per context token (`fc` input is n*H)."""
        return len(self.target_layer_ids)

    @property
    def has_conv(self) -> bool:
        return self.conv_kernel_size > 0

    @property
    def has_selector(self) -> bool:
        return self.selector_rank > 0

    @property
    def has_masked_layers(self) -> bool:
        """True when some layer is causal or windowed (needs a per-query mask)."""
        return any(self.layer_causal) or any(w is not None for w in self.layer_window)

    @property
    def conv_num_groups(self) -> int:
        return self.hidden_size // self.conv_group_size if self.has_conv else 0


# ---------------------------------------------------------------------------
# Invariants (run for every DrafterConfig, parsed or built by hand)
# ---------------------------------------------------------------------------


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise _fail(f"{key} = {value!r} {rule}")


def _check_backbone(c: DrafterConfig) -> None:
    _require(c.version in (1, 2), "version", c.version, "must be 1 or 2")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "vocab_size"):
        value = getattr(c, key)
        _require(is_int(value) and value >= 1, key, value, "must be an int >= 1")
    _require(c.num_attention_heads % c.num_key_value_heads == 0,
             "num_key_value_heads", c.num_key_value_heads,
             f"must divide num_attention_heads = {c.num_attention_heads}")
    _require(c.head_dim % 2 == 0, "head_dim", c.head_dim, "must be even (RoPE rotates halves)")
    _require(_is_positive(c.rms_norm_eps), "rms_norm_eps", c.rms_norm_eps, "must be a number > 0")
    _require(_is_positive(c.rope_theta), "rope_theta", c.rope_theta, "must be a number > 0")


def _fill_layer_attention(c: DrafterConfig) -> None:
    n = c.num_hidden_layers
    causal = (False,) * n if c.layer_causal is None else c.layer_causal
    window = (None,) * n if c.layer_window is None else c.layer_window
    for key, value in (("layer_causal", causal), ("layer_window", window)):
        _require(isinstance(value, (list, tuple)) and len(value) == n, key, value,
                 f"must have one entry per draft layer ({n})")
    causal, window = tuple(causal), tuple(window)
    object.__setattr__(c, "layer_causal", causal)
    object.__setattr__(c, "layer_window", window)
    for i, (is_causal, w) in enumerate(zip(causal, window)):
        _require(isinstance(is_causal, bool), f"layer_causal[{i}]", is_causal, "must be a bool")
        if w is None:
            continue
        _require(is_int(w) and w >= 0, f"layer_window[{i}]", w,
                 "must be None or an int >= 0 (sliding_window - 1)")
        _require(is_causal, f"layer_window[{i}]", w,
                 "needs layer_causal[i] = True (a non-causal window is not supported)")


def _check_dflash(c: DrafterConfig) -> None:
    key = "dflash_config."
    _require(is_int(c.block_size) and c.block_size >= 2, key + "block_size", c.block_size,
             "must be an int >= 2 (an anchor plus at least one mask)")
    if c.num_target_layers is not None:
        _require(is_int(c.num_target_layers) and c.num_target_layers >= 1,
                 "num_target_layers", c.num_target_layers, "must be an int >= 1")
    if c.mask_token_id is not None:
        _require(is_int(c.mask_token_id) and 0 <= c.mask_token_id < c.vocab_size,
                 key + "mask_token_id", c.mask_token_id,
                 f"must be an int in [0, vocab_size = {c.vocab_size})")
    _require(isinstance(c.mask_token, str) and bool(c.mask_token), key + "mask_token",
             c.mask_token, "must be a non-empty string")
    _check_conv(c)
    _check_selector(c)
    _require(_is_positive(c.output_multiplier), key + "output_multiplier",
             c.output_multiplier, "must be a number > 0")
    if c.final_logit_softcapping is not None:
        _require(_is_positive(c.final_logit_softcapping), key + "final_logit_softcapping",
                 c.final_logit_softcapping, "must be a number > 0 (or null / <= 0 to disable)")


def _check_conv(c: DrafterConfig) -> None:
    key = "dflash_config."
    for name in ("conv_kernel_size", "conv_group_size"):
        value = getattr(c, name)
        _require(is_int(value) and value >= 0, key + name, value, "must be an int >= 0")
    _require(bool(c.conv_kernel_size) == bool(c.conv_group_size), key + "conv_kernel_size",
             c.conv_kernel_size,
             f"and conv_group_size = {c.conv_group_size} must be set together (both > 0 or both 0)")
    if c.has_conv:
        _require(c.hidden_size % c.conv_group_size == 0, key + "conv_group_size",
                 c.conv_group_size, f"must divide hidden_size = {c.hidden_size}")


def _check_selector(c: DrafterConfig) -> None:
    key = "dflash_config."
    for name in ("selector_rank", "selector_top_k"):
        value = getattr(c, name)
        _require(is_int(value) and value >= 0, key + name, value, "must be an int >= 0")
    _require(bool(c.selector_rank) == bool(c.selector_top_k), key + "selector_rank",
             c.selector_rank,
             f"and selector_top_k = {c.selector_top_k} must be set together (both > 0 or both 0)")
    if c.version == 2:
        _require(c.has_selector, key + "selector_rank", c.selector_rank,
                 "must be > 0 for DFlash2DraftModel (the candidate selector is required)")
    else:
        # The v1 architecture has no selector weights; a non-zero rank means the
        # checkpoint and its `architectures` disagree.
        _require(not c.has_selector, key + "selector_rank", c.selector_rank,
                 "must be 0 for DFlashDraftModel (v1 has no candidate selector)")
    _require(c.selector_top_k <= c.vocab_size, key + "selector_top_k", c.selector_top_k,
             f"must be <= vocab_size = {c.vocab_size}")


def _check_target_layer_ids(ids: tuple, num_target_layers: int | None) -> None:
    key = "dflash_config.target_layer_ids"
    _require(len(ids) > 0, key, list(ids), "must be a non-empty list of ints")
    for i, layer in enumerate(ids):
        _require(is_int(layer) and layer >= 0, f"{key}[{i}]", layer, "must be an int >= 0")
        if num_target_layers is not None:
            # Id k is the state after target layer k; SGLang captures it at the
            # input of layer k+1, so the last layer's output cannot be tapped.
            _require(layer < num_target_layers - 1, f"{key}[{i}]", layer,
                     f"is out of range for a target with {num_target_layers} layers "
                     f"(ids must be < {num_target_layers - 1}: the state after layer k is "
                     "captured at the input of layer k+1)")


def _is_positive(value: Any) -> bool:
    return is_finite(value) and value > 0


# ---------------------------------------------------------------------------
# Target layer choice (same numbers as sglang's build_target_layer_ids)
# ---------------------------------------------------------------------------


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default taps: `[L // 2]` for one draft layer, else evenly from 1 to L - 3.

    Python's `round` (half to even) is used on purpose: it is what upstream
    uses, so the ids, and hence `fc`'s meaning, match sglang exactly.
    """
    if num_target_layers < 1 or num_draft_layers < 1:
        raise _fail(f"cannot derive target_layer_ids for {num_target_layers} target layers "
                    f"and {num_draft_layers} draft layers (both must be >= 1)")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise _fail(f"cannot derive target_layer_ids: a target with {num_target_layers} "
                    "layers has fewer than 4 (set dflash_config.target_layer_ids)")
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1))
            for i in range(num_draft_layers)]


# ---------------------------------------------------------------------------
# Parsing a config.json dict
# ---------------------------------------------------------------------------


class _Reader:
    """Typed access to the three places a key may live, naming it on failure."""

    def __init__(self, hf_config: dict):
        if not isinstance(hf_config, dict):
            raise _fail(f"expected a dict, got {type(hf_config).__name__}")
        self.top = hf_config
        self.text = self._section(hf_config, "text_config", default=hf_config)
        self.dflash = self._section(hf_config, "dflash_config", default={})

    @staticmethod
    def _section(src: dict, key: str, default: dict) -> dict:
        value = src.get(key)
        if value is None:
            return default
        if not isinstance(value, dict):
            raise _fail(f"{key} = {value!r} must be an object")
        return value

    def text_key(self, key: str, default: Any = _MISSING) -> tuple[str, Any]:
        name = key if self.text is self.top else f"text_config.{key}"
        if key in self.text and self.text[key] is not None:
            return name, self.text[key]
        if default is _MISSING:
            raise _fail(f"{name} is required but missing")
        return name, default

    def text_or_top_key(self, key: str, default: Any = None) -> tuple[str, Any]:
        """`text_config.<key>`, falling back to the top level (sglang's dflash_utils)."""
        name, value = self.text_key(key, default=None)
        if value is None and self.text is not self.top and self.top.get(key) is not None:
            return key, self.top[key]
        return name, (default if value is None else value)

    def dflash_key(self, key: str, default: Any, top: bool = False) -> tuple[str, Any]:
        """`dflash_config.<key>`, falling back to the top level when `top`."""
        if self.dflash.get(key) is not None:
            return f"dflash_config.{key}", self.dflash[key]
        if top and self.top.get(key) is not None:
            return key, self.top[key]
        return f"dflash_config.{key}", default


def _as_int(name: str, value: Any) -> int:
    _require(is_int(value), name, value, "must be an int (not a bool or float)")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    _require(is_finite(value), name, value, "must be a finite number")
    return float(value)


def _parse_version(r: _Reader) -> int:
    arch = r.top.get("architectures")
    ok = isinstance(arch, list) and all(isinstance(a, str) for a in arch)
    _require(ok, "architectures", arch, "must be a list of strings")
    known = [a for a in arch if a in ARCHITECTURE_VERSIONS]
    _require(len(known) == 1, "architectures", arch,
             f"must name exactly one of {sorted(ARCHITECTURE_VERSIONS)}")
    return ARCHITECTURE_VERSIONS[known[0]]


def _parse_rope_theta(r: _Reader) -> float:
    """`rope_theta`, or transformers 5's `rope_parameters.rope_theta`."""
    for key in ("rope_scaling", "rope_parameters"):
        name, params = r.text_key(key, default=None)
        if params is None:
            continue
        _require(isinstance(params, dict), name, params, "must be an object")
        kind = params.get("rope_type", params.get("type", "default"))
        _require(kind == "default", f"{name}.rope_type", kind,
                 "is not supported (only plain RoPE)")
        if "rope_theta" in params and "rope_theta" not in r.text:
            return _as_float(f"{name}.rope_theta", params["rope_theta"])
    return _as_float(*r.text_key("rope_theta", default=10000.0))


def _reject_unsupported(r: _Reader) -> None:
    """Refuse config features whose semantics this drafter does not implement."""
    name, act = r.text_key("hidden_act", default="silu")
    _require(act == "silu", name, act, 'is not supported (only "silu")')
    name, bias = r.text_key("attention_bias", default=False)
    _require(bias is False, name, bias, "must be false (biased projections are not supported)")
    name, factor = r.text_key("partial_rotary_factor", default=1.0)
    _require(factor == 1.0, name, factor, "must be 1.0 (partial RoPE is not supported)")
    for key in ("use_gemma_norm", "has_embed_tokens", "has_lm_head"):
        name, flag = r.text_key(key, default=False)
        _require(flag is False, name, flag, "must be false (not supported)")
    for key in ("projector_type", "attention_value_scale"):
        name, value = r.dflash_key(key, default=None)
        _require(value is None, name, value, "is not supported")
    name, sink = r.dflash_key("attention_sink_bias", default=False)
    _require(sink is False, name, sink, "must be false (attention sinks are not supported)")


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _parse_attention_types(r: _Reader, num_layers: int):
    """Per-layer (causal, window) as sglang 0.5.23 resolves them (module docstring).

    Returns:
        layer_causal: tuple[bool, ...]; layer_window: tuple[int | None, ...].
    """
    causal_name, is_causal = r.text_key("is_causal", default=None)
    _require(is_causal is None or isinstance(is_causal, bool), causal_name, is_causal,
             "must be a bool")
    types_name, types = r.text_or_top_key("layer_types")
    if types is None:
        _require(is_causal is not True, causal_name, is_causal,
                 "needs an explicit layer_types list (sglang 0.5.23 ignores is_causal when "
                 "layer_types is absent, while transformers-filled layer_types honour it)")
        name, swa = r.text_key("use_sliding_window", default=False)
        _require(swa is False, name, swa,
                 "needs an explicit layer_types list (transformers would derive sliding "
                 "layers from max_window_layers)")
        return (False,) * num_layers, (None,) * num_layers
    _require(isinstance(types, list) and len(types) == num_layers, types_name, types,
             f"must be a list with one entry per draft layer (num_hidden_layers = {num_layers})")
    for i, kind in enumerate(types):
        _require(kind in _LAYER_TYPES, f"{types_name}[{i}]", kind,
                 f"is not a supported layer type (one of {list(_LAYER_TYPES)})")
    window = None
    if "sliding_attention" in types:
        _require(is_causal is not False, causal_name, is_causal,
                 "is not supported with sliding_attention layers (a non-causal sliding "
                 "window means different masks on different sglang attention backends)")
        name, size = r.text_or_top_key("sliding_window")
        if size is None:
            raise _fail(f"sliding_window is required when {types_name} has "
                        "sliding_attention layers")
        size = _as_int(name, size)
        _require(size >= 1, name, size, "must be an int >= 1")
        window = size - 1  # HF windows include the query token; sglang stores window_left
    full_causal = bool(is_causal)
    return (tuple(full_causal if t == "full_attention" else True for t in types),
            tuple(None if t == "full_attention" else window for t in types))


def _parse_layer_ids(r: _Reader, num_target_layers: int | None,
                     num_draft_layers: int) -> tuple[int, ...]:
    name, ids = r.dflash_key("target_layer_ids", default=None, top=True)
    if ids is None:
        if num_target_layers is None:
            raise _fail("dflash_config.target_layer_ids is missing and the target depth is "
                        "unknown (give num_target_layers or target_num_layers)")
        return tuple(build_target_layer_ids(num_target_layers, num_draft_layers))
    _require(isinstance(ids, (list, tuple)) and len(ids) > 0, name, ids,
             "must be a non-empty list of ints")
    return tuple(_as_int(f"{name}[{i}]", v) for i, v in enumerate(ids))


def _resolve_target_layers(r: _Reader, target_num_layers: int | None) -> int | None:
    name, declared = r.dflash_key("num_target_layers", default=None, top=True)
    if declared is not None:
        declared = _as_int(name, declared)
        if target_num_layers is not None:
            _require(declared == target_num_layers, name, declared,
                     f"disagrees with the target, which has {target_num_layers} layers")
    return target_num_layers if target_num_layers is not None else declared


def _check_against_target(cfg: DrafterConfig, hidden: int | None, vocab: int | None) -> None:
    if hidden is not None:
        _require(cfg.hidden_size == hidden, "hidden_size", cfg.hidden_size,
                 f"must equal the target's hidden_size = {hidden}")
    if vocab is not None:
        _require(cfg.vocab_size == vocab, "vocab_size", cfg.vocab_size,
                 f"must equal the target's vocab_size = {vocab}")


def _parse_softcap(r: _Reader) -> float | None:
    name, cap = r.dflash_key("final_logit_softcapping", default=None)
    if cap is None:
        return None
    cap = _as_float(name, cap)
    return cap if cap > 0 else None  # sglang: <= 0 disables the softcap


def parse_drafter_config(
    hf_config: dict,
    *,
    target_hidden_size: int | None = None,
    target_vocab_size: int | None = None,
    target_num_layers: int | None = None,
) -> DrafterConfig:
    """Parse and validate a drafter `config.json` dict.

    Args:
        hf_config: the decoded JSON. Backbone keys are read from `text_config`
            when present, else from the top level; DFlash keys from
            `dflash_config` (some with a top-level fallback, as in sglang).
        target_hidden_size / target_vocab_size / target_num_layers: the
            target's values when known; the drafter must agree with them.

    Returns:
        DrafterConfig. Raises ValueError naming the key on any violation.
    """
    r = _Reader(hf_config)
    ints = {k: _as_int(*r.text_key(k)) for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "vocab_size")}
    heads = ints["num_attention_heads"]
    _require(heads >= 1, "num_attention_heads", heads, "must be >= 1")
    kv_heads = _as_int(*r.text_key("num_key_value_heads", default=heads))
    name, head_dim = r.text_key("head_dim", default=None)
    if head_dim is None:
        _require(ints["hidden_size"] % heads == 0, "hidden_size", ints["hidden_size"],
                 f"must be divisible by num_attention_heads = {heads} when head_dim is absent")
        head_dim = ints["hidden_size"] // heads
    head_dim = _as_int(name, head_dim)
    _reject_unsupported(r)
    layer_causal, layer_window = _parse_attention_types(r, ints["num_hidden_layers"])
    num_target_layers = _resolve_target_layers(r, target_num_layers)
    cfg = DrafterConfig(
        version=_parse_version(r),
        **ints,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_as_float(*r.text_key("rms_norm_eps", default=1e-6)),
        rope_theta=_parse_rope_theta(r),
        max_position_embeddings=_as_int(*r.text_key("max_position_embeddings", default=32768)),
        block_size=_as_int(*r.dflash_key("block_size", DEFAULT_BLOCK_SIZE, top=True)),
        target_layer_ids=_parse_layer_ids(r, num_target_layers, ints["num_hidden_layers"]),
        num_target_layers=num_target_layers,
        mask_token_id=_optional_int(*r.dflash_key("mask_token_id", None, top=True)),
        mask_token=r.dflash_key("mask_token", DEFAULT_MASK_TOKEN, top=True)[1],
        conv_kernel_size=_as_int(*r.dflash_key("conv_kernel_size", 0)),
        conv_group_size=_as_int(*r.dflash_key("conv_group_size", 0)),
        selector_rank=_as_int(*r.dflash_key("selector_rank", 0)),
        selector_top_k=_as_int(*r.dflash_key("selector_top_k", 0)),
        output_multiplier=_as_float(*r.dflash_key("output_multiplier", 1.0)),
        final_logit_softcapping=_parse_softcap(r),
        layer_causal=layer_causal,
        layer_window=layer_window,
    )
    _check_against_target(cfg, target_hidden_size, target_vocab_size)
    return cfg


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else _as_int(name, value)
