"""Drafter configuration: parse and validate a DFlash / DFlash 2 `config.json`.

`parse_drafter_config` reads the dict a published drafter ships (the keys of
sglang 0.5.23's `parse_dflash_draft_config` plus the Qwen3 backbone keys) and
returns a frozen `DrafterConfig`. Every key read is validated; a failure raises
`ValueError` naming the key, the value and the rule, e.g.

    drafter config: dflash_config.target_layer_ids[2] = 9 is out of range for a
    target with 4 layers

Keys are read with the meaning sglang 0.5.23 gives them once transformers has
built its config object:

* Per-layer attention (`models/dflash.py` `_get_dflash_layer_attention_params`):
  a `"full_attention"` layer is non-causal unless `is_causal` is true; a
  `"sliding_attention"` layer is causal unless `is_causal` is false, with the
  window w = `sliding_window - 1`. A causal window shows a query at q the keys
  in [q - w, q]; a non-causal one the keys in [q - w, q + w] (FlashAttention's
  two-sided `window_size = (w, w)` and the z-lab reference; FlashInfer bounds
  only the left side, which is the same whenever w >= block_size - 1, as in
  every published drafter). With no `layer_types` at all every layer is
  non-causal, except that Qwen2 / Qwen3 configs (`model_type` qwen2 / qwen3) get
  the `layer_types` transformers fills in from `use_sliding_window` and
  `max_window_layers`. Those config classes also drop `sliding_window` unless
  `use_sliding_window` is true, and sglang then refuses sliding layers; so do we.
* RoPE: `rope_parameters` (transformers 5, with `rope_theta` inside) or the
  legacy `rope_scaling` + `rope_theta`; the scaling types sglang's `get_rope`
  implements for a plain rotary head (linear, dynamic, yarn, llama3) are
  parsed into `RopeScaling` with sglang's defaults for absent keys.
* `num_target_layers` that disagrees with the target only warns (sglang
  captures by the runtime target's depth), and `target_layer_ids` may reach
  L - 1 (sglang's `resolve_target_layer_ids` bound).
* No `mask_token_id`: parsing passes; `resolve_mask_token_id` finds it from
  the target tokenizer at start-up.
* `DFlashLagunaForCausalLM` (sglang's Laguna drafter, a DFlash v1 layout):
  `gating` (True / "per-head" default, "per-element", False / null /
  "disabled", as sglang's `normalize_gating`) sets a softplus gate on each
  layer's attention output (`g_proj`), and the architecture adds one RMSNorm
  per context feature before `fc` and each layer's input norm on the context
  before its K/V (`laguna_context`).

Features this package does not implement (Gemma norms, attention sinks,
Domino projectors, drafter embeddings, partial / M-RoPE, other drafter
architectures) are rejected explicitly rather than ignored, and so are the
two attention combinations whose upstream meaning depends on the config
class: `is_causal: true` or `use_sliding_window: true` without `layer_types`
in a non-Qwen config.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_dflash.checks import is_finite, is_int

logger = logging.getLogger(__name__)

LAGUNA_ARCHITECTURE = "DFlashLagunaForCausalLM"
# sglang's `normalize_gating` values of a Laguna drafter's `gating` key -> our gate.
_GATING = {True: "per-head", "per-head": "per-head", "per-element": "per-element",
           False: None, None: None, "disabled": None}
GATES = ("per-head", "per-element")
ARCHITECTURE_VERSIONS = {
    "DFlashDraftModel": 1,
    "DFlash2DraftModel": 2,
    # Empty subclasses of DFlash2DraftModel in sglang 0.5.23 (same weights,
    # config keys and forward); nothing else in sglang keys on these names.
    "DFlash2BeamDraftModel": 2,
    "MiniMaxDFlash2DraftModel": 2,
    # sglang's Laguna drafter: v1 plus attention gates and context norms (see gating).
    LAGUNA_ARCHITECTURE: 1,
}
# Drafter classes sglang 0.5.23 registers (models/dflash.py EntryClass) whose
# weights or semantics differ from DFlash / DFlash 2.
UNSUPPORTED_ARCHITECTURES = {
    "MuseGlimmerAssistantModel": "its config class implies is_causal = false and no vocab_size, "
                                 "and its target layer ids are renumbered for Muse targets",
}
DEFAULT_BLOCK_SIZE = 16  # sglang's default when the checkpoint names none
DEFAULT_MASK_TOKEN = "<|MASK|>"
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")
DTYPES = ("float32", "float16", "bfloat16")
_PREFIX = "drafter config: "

_MISSING = object()


def _fail(message: str) -> ValueError:
    return ValueError(_PREFIX + message)


@dataclass(frozen=True)
class RopeScaling:
    """A non-default RoPE frequency rule (model.py turns it into cos / sin).

    Defaults are sglang 0.5.23's `get_rope` defaults for keys a config leaves
    out. `original_max_position_embeddings` is resolved at parse time (sglang
    uses `max_position_embeddings` when the key is absent).
    """

    rope_type: str  # one of ROPE_TYPES
    factor: float = 1.0
    alpha: float | None = None  # dynamic: the NTK-alpha variant (factor unused)
    original_max_position_embeddings: int = 0  # yarn, llama3
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    extrapolation_factor: float = 1.0  # yarn
    attn_factor: float = 1.0  # yarn: multiplies the magnitude scale
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: round the correction range outwards

    def __post_init__(self) -> None:
        key = "rope_parameters."
        _require(self.rope_type in ROPE_TYPES, key + "rope_type", self.rope_type,
                 f"is not supported (one of {['default', *ROPE_TYPES]})")
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                     "attn_factor"):
            _require(_is_positive(getattr(self, name)), key + name, getattr(self, name),
                     "must be a number > 0")
        _require(is_finite(self.extrapolation_factor), key + "extrapolation_factor",
                 self.extrapolation_factor, "must be a finite number")
        for name in ("alpha", "mscale", "mscale_all_dim"):
            value = getattr(self, name)
            _require(value is None or _is_positive(value), key + name, value,
                     "must be a number > 0")
        _require(isinstance(self.truncate, bool), key + "truncate", self.truncate, "must be a bool")
        if self.rope_type in ("yarn", "llama3"):
            orig = self.original_max_position_embeddings
            _require(is_int(orig) and orig >= 1, key + "original_max_position_embeddings", orig,
                     "must be an int >= 1")


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
    mask_token_id: int | None = None  # None: resolve_mask_token_id at start-up
    mask_token: str = DEFAULT_MASK_TOKEN
    conv_kernel_size: int = 0  # taps; 0 = no grouped convolution
    conv_group_size: int = 0  # channels per conv coefficient group
    selector_rank: int = 0  # r; 0 = no candidate selector
    selector_top_k: int = 0  # K
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # Per draft layer: causal mask (k_pos <= q_pos) and window w (None =
    # unbounded; RadixAttention's sliding_window_size = sliding_window - 1):
    # keys with k_pos >= q_pos - w, and also k_pos <= q_pos + w when the layer is
    # non-causal. None fills in all-non-causal, unwindowed layers.
    layer_causal: tuple[bool, ...] | None = None
    layer_window: tuple[int | None, ...] | None = None
    rope_scaling: RopeScaling | None = None  # None = plain RoPE at rope_theta
    attention_bias: bool = False  # q/k/v/o projections carry biases
    dtype: str | None = None  # the checkpoint's declared dtype (one of DTYPES)
    # Laguna drafters: attention output * softplus(g_proj(x)), one gate per head
    # or per element (None = no gate); context features normalized per target
    # layer before fc, and by each layer's input norm before its K/V.
    attention_gate: str | None = None
    laguna_context: bool = False

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
    _require(c.rope_scaling is None or isinstance(c.rope_scaling, RopeScaling), "rope_scaling",
             c.rope_scaling, "must be None or a RopeScaling")
    _require(isinstance(c.attention_bias, bool), "attention_bias", c.attention_bias,
             "must be a bool")
    _require(c.dtype is None or c.dtype in DTYPES, "dtype", c.dtype, f"must be one of {DTYPES}")
    _require(c.attention_gate is None or c.attention_gate in GATES, "gating", c.attention_gate,
             f"must be None or one of {GATES}")
    _require(isinstance(c.laguna_context, bool), "laguna_context", c.laguna_context, "must be a bool")


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
        _require(w is None or (is_int(w) and w >= 0), f"layer_window[{i}]", w,
                 "must be None or an int >= 0 (sliding_window - 1)")


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
            _require(layer < num_target_layers, f"{key}[{i}]", layer,
                     f"is out of range for a target with {num_target_layers} layers "
                     f"(ids must be < {num_target_layers})")
    # SGLang captures each target layer once: a repeated id yields fewer features than fc expects.
    _require(len(set(ids)) == len(ids), key, list(ids), "must not repeat a layer")


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

    def text_name(self, key: str) -> str:
        return key if self.text is self.top else f"text_config.{key}"

    def text_key(self, key: str, default: Any = _MISSING) -> tuple[str, Any]:
        name = self.text_name(key)
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

    def model_type(self) -> Any:
        """The backbone's model_type (the text section's, else the top level's)."""
        if self.text is not self.top:
            return self.text.get("model_type")
        return self.top.get("model_type")


def _as_int(name: str, value: Any) -> int:
    _require(is_int(value), name, value, "must be an int (not a bool or float)")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    _require(is_finite(value), name, value, "must be a finite number")
    return float(value)


def _as_bool(name: str, value: Any) -> bool:
    _require(isinstance(value, bool), name, value, "must be a bool")
    return value


def _parse_architecture(r: _Reader) -> str:
    arch = r.top.get("architectures")
    ok = isinstance(arch, list) and all(isinstance(a, str) for a in arch)
    _require(ok, "architectures", arch, "must be a list of strings")
    for name in arch:
        if name in UNSUPPORTED_ARCHITECTURES:
            raise _fail(f"architectures = {arch!r}: {name} is a drafter SGLang 0.5.23 loads but "
                        f"sglang-dflash does not support ({UNSUPPORTED_ARCHITECTURES[name]}); "
                        "set SGLANG_DFLASH_UPSTREAM=1 to use SGLang's own DFLASH worker")
    known = [a for a in arch if a in ARCHITECTURE_VERSIONS]
    _require(len(known) == 1, "architectures", arch,
             f"must name exactly one of {sorted(ARCHITECTURE_VERSIONS)}")
    return known[0]


def _parse_gating(r: _Reader, architecture: str) -> str | None:
    """A Laguna drafter's attention gate (sglang: `getattr(config, "gating", True)`);
    other architectures have none, and a `gating` key there is refused rather
    than ignored (sglang's DFlashDraftModel builds no gate)."""
    name, value = r.text_key("gating", default=True if architecture == LAGUNA_ARCHITECTURE else None)
    if architecture != LAGUNA_ARCHITECTURE:
        _require(value is None, name, value, f"is a {LAGUNA_ARCHITECTURE} key; this drafter has no "
                 "attention gate")
        return None
    _require(isinstance(value, (bool, str, type(None))) and value in _GATING, name, value,
             "must be true, false, null, \"per-head\", \"per-element\" or \"disabled\"")
    return _GATING[value]


# ---- RoPE ------------------------------------------------------------------------

# Keys that change sglang's rotary embedding in ways this drafter does not
# implement (M-RoPE, Fourier RoPE, a narrower rotary width) or that transformers
# and sglang read differently (`attention_factor`: transformers uses it, sglang
# ignores it).
_ROPE_REFUSED_KEYS = ("mrope_section", "mrope_interleaved", "use_fope", "video_rope",
                      "rope_dim", "partial_rotary_factor", "attention_factor")
_ROPE_NUMBER_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor", "alpha"),
    "yarn": ("factor", "beta_fast", "beta_slow", "extrapolation_factor", "attn_factor",
             "mscale", "mscale_all_dim"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


def _rope_dict(r: _Reader) -> tuple[str, dict] | None:
    """The rope dict transformers 5 builds: `rope_parameters`, else `rope_scaling`."""
    found = []
    for key in ("rope_parameters", "rope_scaling"):
        name, value = r.text_key(key, default=None)
        if value is not None:
            _require(isinstance(value, dict), name, value, "must be an object")
            found.append((name, value))
    if len(found) == 2:
        (p_name, params), (s_name, scaling) = found
        same = all(params.get(k) == v for k, v in scaling.items()
                   if k not in ("rope_theta", "type", "rope_type"))
        _require(same and _rope_kind(p_name, params) == _rope_kind(s_name, scaling), s_name,
                 scaling, f"disagrees with {p_name} = {params!r} (give one of them)")
    return found[0] if found else None


def _rope_kind(name: str, params: dict) -> str:
    kind = params.get("rope_type", params.get("type"))
    if kind is None:
        _require(set(params) <= {"rope_theta"}, name, params, "needs a rope_type")
        return "default"
    return kind


def _parse_rope(r: _Reader, head_dim: int, max_positions: int):
    """(rope_theta, RopeScaling | None) as sglang's `get_rope_config` / `get_rope` read them.

    `rope_parameters.rope_theta` wins over a top-level `rope_theta` (sglang
    reads the dict first); plain RoPE is `rope_type: "default"` or no dict.
    """
    found = _rope_dict(r)
    theta_name, theta = r.text_key("rope_theta", default=10000.0)
    if found is None:
        return _as_float(theta_name, theta), None
    name, params = found
    if params.get("rope_theta") is not None:
        theta_name, theta = f"{name}.rope_theta", params["rope_theta"]
    theta = _as_float(theta_name, theta)
    for key in _ROPE_REFUSED_KEYS:
        value = params.get(key)
        harmless = value is None or value is False or (
            key == "partial_rotary_factor" and value == 1.0) or (
            key == "rope_dim" and value == head_dim)
        _require(harmless, f"{name}.{key}", value, "is not supported by sglang-dflash")
    kind = _rope_kind(name, params)
    if kind == "default":
        return theta, None
    _require(kind in ROPE_TYPES, f"{name}.rope_type", kind,
             f"is not supported (one of {['default', *ROPE_TYPES]})")
    return theta, _rope_scaling(name, params, kind, max_positions)


def _rope_scaling(name: str, params: dict, kind: str, max_positions: int) -> RopeScaling:
    values: dict[str, Any] = {}
    for key in _ROPE_NUMBER_KEYS[kind]:
        if params.get(key) is not None:
            values[key] = _as_float(f"{name}.{key}", params[key])
    if not (kind == "dynamic" and "alpha" in values):
        _require("factor" in values, f"{name}.factor", params.get("factor"),
                 f"is required for rope_type {kind!r}")
    if kind in ("yarn", "llama3"):
        key = "original_max_position_embeddings"
        orig = params.get(key)
        values[key] = max_positions if orig is None else _as_int(f"{name}.{key}", orig)
    if kind == "yarn" and params.get("truncate") is not None:
        values["truncate"] = _as_bool(f"{name}.truncate", params["truncate"])
    try:
        return RopeScaling(rope_type=kind, **values)
    except ValueError as exc:
        raise _fail(str(exc).removeprefix(_PREFIX).replace("rope_parameters.", name + ".")) \
            from None


# ---- everything else -------------------------------------------------------------


def _reject_unsupported(r: _Reader) -> None:
    """Refuse config features whose semantics this drafter does not implement."""
    name, act = r.text_key("hidden_act", default="silu")
    _require(act == "silu", name, act, 'is not supported (only "silu")')
    name, factor = r.text_key("partial_rotary_factor", default=1.0)
    _require(factor == 1.0, name, factor, "must be 1.0 (partial RoPE is not supported)")
    for key in ("rope_is_neox_style", "is_neox_style"):
        name, neox = r.text_key(key, default=True)
        _require(neox is True, name, neox, "must be true (only rotate-halves RoPE is supported)")
    for key in ("use_gemma_norm", "has_embed_tokens", "has_lm_head"):
        name, flag = r.text_key(key, default=False)
        _require(flag is False, name, flag, "must be false (not supported)")
    for key in ("projector_type", "attention_value_scale"):
        name, value = r.dflash_key(key, default=None)
        _require(value is None, name, value, "is not supported")
    name, sink = r.dflash_key("attention_sink_bias", default=False)
    _require(sink is False, name, sink, "must be false (attention sinks are not supported)")


_LAYER_TYPES = ("full_attention", "sliding_attention")
# Config classes whose __post_init__ drops `sliding_window` unless
# `use_sliding_window` is true and fills `layer_types` from `max_window_layers`
# (transformers' Qwen2Config / Qwen3Config; their defaults below).
_QWEN_WINDOW_MODEL_TYPES = ("qwen2", "qwen3")
_QWEN_DEFAULT_SLIDING_WINDOW = 4096
_QWEN_DEFAULT_MAX_WINDOW_LAYERS = 28


def _window_size(r: _Reader) -> tuple[str, int | None, str]:
    """(key name, sliding_window as the config class keeps it, why it is None)."""
    name, size = r.text_or_top_key("sliding_window")
    if r.model_type() not in _QWEN_WINDOW_MODEL_TYPES:
        return name, (None if size is None else _as_int(name, size)), ""
    swa_name, swa = r.text_key("use_sliding_window", default=False)
    if not _as_bool(swa_name, swa):
        state = f"= {swa!r}" if "use_sliding_window" in r.text else "is absent"
        return name, None, (f" ({swa_name} {state}: a {r.model_type()!r} config keeps "
                            "sliding_window only when use_sliding_window is true)")
    if "sliding_window" not in r.text and "sliding_window" not in r.top:
        return name, _QWEN_DEFAULT_SLIDING_WINDOW, ""
    return name, (None if size is None else _as_int(name, size)), ""


def _layer_types(r: _Reader, num_layers: int, window: int | None):
    """(key name, layer_types list or None) as sglang sees them."""
    types_name, types = r.text_or_top_key("layer_types")
    if types is not None or r.model_type() not in _QWEN_WINDOW_MODEL_TYPES:
        return types_name, types
    name, first = r.text_key("max_window_layers", default=_QWEN_DEFAULT_MAX_WINDOW_LAYERS)
    first = _as_int(name, first)
    derived = ["sliding_attention" if window is not None and i >= first else "full_attention"
               for i in range(num_layers)]
    return f"{types_name} (derived from max_window_layers = {first})", derived


def _parse_attention_types(r: _Reader, num_layers: int):
    """Per-layer (causal, window) as sglang 0.5.23 resolves them (module docstring).

    Returns:
        layer_causal: tuple[bool, ...]; layer_window: tuple[int | None, ...].
    """
    causal_name, is_causal = r.text_key("is_causal", default=None)
    _require(is_causal is None or isinstance(is_causal, bool), causal_name, is_causal,
             "must be a bool")
    window_name, size, dropped = _window_size(r)
    types_name, types = _layer_types(r, num_layers, size)
    if types is None:
        _refuse_ambiguous_without_layer_types(r, causal_name, is_causal)
        return (False,) * num_layers, (None,) * num_layers
    _require(isinstance(types, list) and len(types) == num_layers, types_name, types,
             f"must be a list with one entry per draft layer (num_hidden_layers = {num_layers})")
    for i, kind in enumerate(types):
        _require(kind in _LAYER_TYPES, f"{types_name}[{i}]", kind,
                 f"is not a supported layer type (one of {list(_LAYER_TYPES)})")
    window = None
    if "sliding_attention" in types:
        if size is None:
            raise _fail(f"{window_name} is required when {types_name} has sliding_attention "
                        f"layers{dropped}")
        _require(size >= 1, window_name, size, "must be an int >= 1")
        window = size - 1  # HF windows include the query token; sglang stores window_left
    return (tuple((t == "sliding_attention") if is_causal is None else is_causal for t in types),
            tuple(None if t == "full_attention" else window for t in types))


def _refuse_ambiguous_without_layer_types(r: _Reader, causal_name: str, is_causal) -> None:
    """Non-Qwen config, no layer_types: sglang ignores these keys, the author may not."""
    _require(is_causal is not True, causal_name, is_causal,
             "needs an explicit layer_types list (sglang 0.5.23 ignores is_causal when "
             "layer_types is absent, while a config class that fills layer_types honours it)")
    name, swa = r.text_key("use_sliding_window", default=False)
    _require(swa is False, name, swa,
             "needs an explicit layer_types list (sglang 0.5.23 ignores it without layer_types)")


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
    """The target depth ids are checked against: the runtime target's when known.

    A drafter trained for another depth only warns, as in sglang
    (`spec_aux_hidden_state.py` `_resolve_dflash_aux_hidden_state`).
    """
    name, declared = r.dflash_key("num_target_layers", default=None, top=True)
    if declared is not None:
        declared = _as_int(name, declared)
        if target_num_layers is not None and declared != target_num_layers:
            logger.warning("drafter config: %s = %d differs from the target's %d layers; "
                           "using the target's depth", name, declared, target_num_layers)
    return target_num_layers if target_num_layers is not None else declared


def _warn_last_layer_tap(cfg: DrafterConfig) -> None:
    """SGLang targets capture layer k's output at layer k+1's input; most never
    capture after their last layer, so a tap of it yields too few features."""
    last = cfg.num_target_layers
    if last is not None and last - 1 in cfg.target_layer_ids:
        logger.warning("drafter config: dflash_config.target_layer_ids %s taps the target's last "
                       "layer (%d); only target models that capture after their last layer "
                       "provide it", list(cfg.target_layer_ids), last - 1)


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


def _parse_dtype(r: _Reader) -> str | None:
    """`dtype` (transformers 5), else the older `torch_dtype`."""
    for key in ("dtype", "torch_dtype"):
        name, value = r.text_or_top_key(key)
        if value is not None:
            _require(value in DTYPES, name, value, f"must be one of {list(DTYPES)}")
            return value
    return None


def serving_dtype(cfg: DrafterConfig, server_dtype: str) -> str:
    """The drafter's compute dtype as sglang picks a model's (`--dtype`):
    an explicit value wins; "auto" takes the declared dtype, with float32 (or
    none declared) served as float16 (`configs/model_config.py`
    `_get_and_verify_dtype`)."""
    if server_dtype != "auto":
        return server_dtype
    return "float16" if cfg.dtype in (None, "float32") else cfg.dtype


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
            target's values when known; the drafter must agree with the first
            two, and its layer ids must fit the third.

    Returns:
        DrafterConfig. Raises ValueError naming the key on any violation.
    """
    r = _Reader(hf_config)
    architecture = _parse_architecture(r)
    version = ARCHITECTURE_VERSIONS[architecture]
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
    max_positions = _as_int(*r.text_key("max_position_embeddings", default=32768))
    rope_theta, rope_scaling = _parse_rope(r, head_dim, max_positions)
    layer_causal, layer_window = _parse_attention_types(r, ints["num_hidden_layers"])
    num_target_layers = _resolve_target_layers(r, target_num_layers)
    cfg = DrafterConfig(
        version=version,
        **ints,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_as_float(*r.text_key("rms_norm_eps", default=1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=max_positions,
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
        rope_scaling=rope_scaling,
        attention_bias=_as_bool(*r.text_key("attention_bias", default=False)),
        dtype=_parse_dtype(r),
        attention_gate=_parse_gating(r, architecture),
        laguna_context=architecture == LAGUNA_ARCHITECTURE,
    )
    _check_against_target(cfg, target_hidden_size, target_vocab_size)
    _warn_last_layer_tap(cfg)
    return cfg


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else _as_int(name, value)


# ---------------------------------------------------------------------------
# Mask token id from the target tokenizer
# ---------------------------------------------------------------------------


def resolve_mask_token_id(cfg: DrafterConfig, tokenizer_or_vocab: Any,
                          target_vocab_size: int) -> int:
    """The block's mask token id, found the way sglang 0.5.23's worker finds it.

    Order (`dflash_worker_v2.py` `_resolve_mask_token_id`): the config's
    `mask_token_id` (refused if the tokenizer maps `mask_token` to another id),
    then the tokenizer's own `mask_token` when it is the drafter's `mask_token`,
    then a vocabulary lookup of `mask_token`. Unlike upstream, a token the
    tokenizer lacks is never added: the drafter must name an existing id.

    Args:
        cfg: the parsed drafter config.
        tokenizer_or_vocab: the target tokenizer (`get_vocab()`, optionally
            `mask_token` / `mask_token_id`), a {token: id} mapping, or None.
        target_vocab_size: rows of the target embedding; the id must be below.

    Raises:
        ValueError naming the key when no id is found or it is out of range.
    """
    vocab = _vocab_of(tokenizer_or_vocab)
    token = cfg.mask_token
    if cfg.mask_token_id is not None:
        found = None if vocab is None else vocab.get(token)
        _require(found is None or int(found) == cfg.mask_token_id, "dflash_config.mask_token_id",
                 cfg.mask_token_id, f"conflicts with the tokenizer, which maps mask_token "
                 f"{token!r} to {found}")
        return _check_mask_id("dflash_config.mask_token_id", cfg.mask_token_id, target_vocab_size)
    if tokenizer_or_vocab is None:
        raise _fail("dflash_config.mask_token_id is not set and there is no tokenizer to look "
                    f"mask_token {token!r} up in (set mask_token_id, or do not skip the "
                    "tokenizer)")
    resolved = None
    if getattr(tokenizer_or_vocab, "mask_token", None) == token:
        resolved = getattr(tokenizer_or_vocab, "mask_token_id", None)
    if resolved is None and vocab is not None:
        resolved = vocab.get(token)
    if resolved is None:
        raise _fail(f"dflash_config.mask_token_id is not set and the target tokenizer has no "
                    f"token {token!r} (neither its mask_token nor in its vocabulary); "
                    f"sglang-dflash does not add tokens{_added_id_hint(tokenizer_or_vocab)}: set "
                    "dflash_config.mask_token_id to the id the drafter was trained with")
    return _check_mask_id(f"mask_token {token!r}", int(resolved), target_vocab_size)


def _vocab_of(tokenizer_or_vocab: Any) -> Mapping | None:
    if tokenizer_or_vocab is None:
        return None
    if isinstance(tokenizer_or_vocab, Mapping):
        return tokenizer_or_vocab
    get_vocab = getattr(tokenizer_or_vocab, "get_vocab", None)
    if not callable(get_vocab):
        raise _fail(f"cannot read a vocabulary from {type(tokenizer_or_vocab).__name__} "
                    "(expected a tokenizer with get_vocab() or a mapping)")
    return get_vocab()


def _added_id_hint(tokenizer: Any) -> str:
    """The id SGLang would give the token by adding it (the next free id)."""
    try:
        return f" (SGLang would add it as id {len(tokenizer)})" \
            if not isinstance(tokenizer, Mapping) else ""
    except TypeError:
        return ""


def _check_mask_id(name: str, mask_id: int, target_vocab_size: int) -> int:
    _require(is_int(mask_id) and 0 <= mask_id < target_vocab_size, name, mask_id,
             f"is outside the target vocabulary [0, {target_vocab_size}) (the target "
             "embedding is not resized)")
    return int(mask_id)
