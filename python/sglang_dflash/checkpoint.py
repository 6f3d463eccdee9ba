"""Save / load of drafters in the published HF layout.

A checkpoint directory holds `config.json` and one or more `*.safetensors`
files whose tensor names are the published ones (docs/design.md §9), optionally
prefixed with `model.`, and optionally `mask_embedding.pt` (a trained
embedding for the mask token). Every weight the model needs must be present,
with its shape, a float dtype and finite values; a checkpoint that misses one
is refused, naming it, and nothing is ever zero-filled (sglang's loader
silently leaves missing conv / selector weights at their init). Extra tensors
(HF rotary caches, a copy of the target's embedding or head) are ignored with
a warning, as sglang ignores them, except Domino projector weights, which
sglang refuses too. FP8 checkpoints (quantization_config) are dequantized on
reading (quantized.py); other quantized formats are refused.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .checks import is_int
from .config import DrafterConfig, parse_drafter_config
from .model import DFlashDrafter
from .quantized import FP8_DTYPES, checkpoint_quantization, dequantize_state

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
MASK_EMBEDDING_NAME = "mask_embedding.pt"
_ALIAS_PREFIX = "model."
# Names a native export uses for the context projection (sglang's load_weights aliases).
_NAME_ALIASES = {"encoder.fc.weight": "fc.weight",
                 "encoder.output_norm_enc.weight": "hidden_norm.weight"}
# Weights of a Domino projector: a checkpoint carrying them is not a plain drafter.
_REFUSED_PREFIXES = ("prefix_gru.", "embed_proj.")
_LOGGED_NAMES = 12  # ignored tensor names listed in the warning before "... and N more"


class _CheckpointError(ValueError):
    pass


def _error(path, message: str) -> ValueError:
    return ValueError(f"invalid DFlash drafter checkpoint at {path}: {message}")


def save_drafter(model: DFlashDrafter, cfg_dict: dict, out_dir: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` (float tensors as stored), and
    `mask_embedding.pt` when the model has one.

    `cfg_dict` must parse to the model's own config, so that what is saved is
    what `load_drafter` will rebuild. Output bytes are deterministic.
    """
    parsed = parse_drafter_config(cfg_dict)
    if _comparable(parsed) != _comparable(model.cfg):
        raise ValueError(f"save_drafter: cfg_dict parses to {parsed}, "
                         f"which differs from the model's config {model.cfg}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
    if model.mask_embedding is not None:
        torch.save({"embedding": model.mask_embedding.detach().cpu(),
                    "mask_token_id": int(model.mask_embedding_token_id)},
                   out / MASK_EMBEDDING_NAME)
    return out


def _comparable(cfg: DrafterConfig) -> dict:
    """Config fields that shape the weights or the math (num_target_layers is
    only known once a target is given, and the declared dtype is only a label)."""
    fields = dict(cfg.__dict__)
    fields.pop("num_target_layers")
    fields.pop("dtype")
    return fields


def load_drafter(
    path: str | Path,
    *,
    target_hidden_size: int | None,
    target_vocab_size: int | None,
    target_num_layers: int | None,
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    """Load a drafter, validating its config against the target and its weights
    against the model built from that config.

    `path` must be a local directory (hub.resolve_drafter_path turns a Hub id
    into one). A `mask_embedding.pt` beside the weights becomes
    `drafter.mask_embedding` [H] with `drafter.mask_embedding_token_id`.

    Raises:
        ValueError("invalid DFlash drafter checkpoint at <path>: ...") naming
        missing weights, wrong shapes, non-finite values, a missing config or
        weight file, a bad mask_embedding.pt, or the config key at fault.
    """
    root = Path(path)
    try:
        config = _read_config(root)
        cfg = parse_drafter_config(
            config, target_hidden_size=target_hidden_size,
            target_vocab_size=target_vocab_size, target_num_layers=target_num_layers)
        model = DFlashDrafter(cfg)
        state = dequantize_state(_read_weights(root), checkpoint_quantization(config))
        ignored = _check_coverage(model, state)
        mask = _read_mask_embedding(root, cfg)
    except (_CheckpointError, ValueError) as exc:
        raise _error(root, str(exc)) from None
    _log_ignored(str(root), ignored)
    model.load_state_dict(_without(state, ignored), strict=True)
    if mask is not None:
        model.mask_embedding, model.mask_embedding_token_id = mask
    return model.to(dtype).eval()


def load_state_strict(model: DFlashDrafter, weights, *, origin: str) -> None:
    """Load `(name, tensor)` pairs (names as published, `model.` alias allowed)
    into `model` with the same rules as `load_drafter` (missing refused, extras
    ignored with a warning); `origin` names the caller in messages."""
    state: dict[str, torch.Tensor] = {}
    try:
        for raw, tensor in weights:
            _add_weight(state, raw, tensor, where="")
        ignored = _check_coverage(model, state)
    except _CheckpointError as exc:
        raise ValueError(f"invalid DFlash drafter weights for {origin}: {exc}") from None
    _log_ignored(origin, ignored)
    model.load_state_dict(_without(state, ignored), strict=True)


def update_weights_in_place(model: DFlashDrafter, weights, *, origin: str, shared: bool) -> int:
    """A live weight update: copy `(name, tensor)` pairs into `model`'s own
    tensors in place (captured graphs and anything else holding them keep
    pointing at the same storage). Returns the number of tensors copied.

    Every pair is checked (shape, float dtype, finite values, no name twice)
    before any is copied, so a refused update leaves the drafter as it was.
    `shared` is an update whose tensors also go to the target (SGLang's weight
    selector "all"): only names exactly as published are the drafter's, and
    the rest (the target's `model.*` and `lm_head.*`) are left to the target.
    Otherwise (selector "draft") every tensor is the drafter's: the `model.`
    alias is allowed and a name the drafter lacks is refused.

    Raises:
        ValueError("drafter weight update from <origin> refused: ...").
    """
    own = model.state_dict()  # name -> tensor sharing the parameter's storage
    picked: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    try:
        for raw, tensor in weights:
            if shared:
                if raw in own:
                    _add_weight(picked, raw, tensor, where="")
                continue
            if _canonical_name(raw) in own:
                _add_weight(picked, raw, tensor, where="")
            else:
                unknown.append(raw)
    except _CheckpointError as exc:
        raise ValueError(f"drafter weight update from {origin} refused: {exc}") from None
    problems = [f"the drafter has no weights {sorted(unknown)}"] if unknown else []
    for name, tensor in picked.items():
        problems += _tensor_problems(name, tensor, tuple(own[name].shape))
    if problems:
        raise ValueError(f"drafter weight update from {origin} refused: " + "; ".join(problems))
    with torch.no_grad():
        for name, tensor in picked.items():
            own[name].copy_(tensor)
    return len(picked)


def mask_embedding_for(drafter: DFlashDrafter, mask_token_id: int) -> torch.Tensor | None:
    """The trained embedding to write over the target's row `mask_token_id`, or None.

    Raises ValueError when `mask_embedding.pt` was trained for another id (the
    id is only known for sure once resolved from the tokenizer; sglang refuses
    the same mismatch).
    """
    if drafter.mask_embedding is None:
        return None
    if drafter.mask_embedding_token_id != mask_token_id:
        raise ValueError(f"{MASK_EMBEDDING_NAME} was trained with mask_token_id = "
                         f"{drafter.mask_embedding_token_id}, but the resolved mask token id "
                         f"is {mask_token_id}; they must match")
    return drafter.mask_embedding


def _read_config(root: Path) -> dict:
    config_path = root / CONFIG_NAME
    if not config_path.is_file():
        raise _CheckpointError(f"{CONFIG_NAME} not found")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise _CheckpointError(f"{CONFIG_NAME} is not valid JSON ({exc})") from None


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file, under its canonical name."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise _CheckpointError("no *.safetensors weight files found")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for raw in f.keys():
                _add_weight(state, raw, f.get_tensor(raw), where=f" in {file.name}")
    return state


def _canonical_name(raw: str) -> str:
    """A tensor's published name: without the `model.` alias, native-export aliases resolved."""
    name = raw.removeprefix(_ALIAS_PREFIX)
    return _NAME_ALIASES.get(name, name)


def _add_weight(state: dict, raw: str, tensor: torch.Tensor, where: str) -> None:
    name = _canonical_name(raw)
    if name in state:
        raise _CheckpointError(f"weight {name!r} appears more than once (again as {raw!r}{where})")
    state[name] = tensor


def _check_coverage(model: DFlashDrafter, state: dict[str, torch.Tensor]) -> list[str]:
    """Refuse missing / mis-shaped / non-float / non-finite weights; return the
    names of extra tensors to ignore (listed in the error too when some weight
    is missing, since a misnamed weight shows up as one of each)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    refused = [n for n in unexpected if n.startswith(_REFUSED_PREFIXES)]
    problems = []
    if missing:
        problems.append(f"missing weights {missing}")
        if unexpected:
            problems.append(f"unexpected weights {unexpected}")
    elif refused:
        problems.append(f"Domino projector weights {refused} (not supported)")
    for name in sorted(set(expected) & set(state)):
        problems += _tensor_problems(name, state[name], expected[name])
    if problems:
        raise _CheckpointError("; ".join(problems))
    return unexpected


def _tensor_problems(name: str, tensor: torch.Tensor, shape: tuple) -> list[str]:
    got = tuple(tensor.shape)
    if got != shape:
        return [f"weight {name} has shape {list(got)}, expected {list(shape)}"]
    if not tensor.is_floating_point():
        return [f"weight {name} has dtype {tensor.dtype}, expected a float dtype"]
    if tensor.dtype in FP8_DTYPES:  # only a checkpoint's FP8 weights come with their scales
        return [f"weight {name} is {tensor.dtype} (FP8 weights load from a checkpoint with their scales)"]
    if not bool(torch.isfinite(tensor).all()):
        return [f"weight {name} has {int((~torch.isfinite(tensor)).sum())} non-finite values"]
    return []


def _log_ignored(origin: str, ignored: list[str]) -> None:
    if not ignored:
        return
    shown = ", ".join(ignored[:_LOGGED_NAMES])
    more = f" and {len(ignored) - _LOGGED_NAMES} more" if len(ignored) > _LOGGED_NAMES else ""
    logger.warning("DFlash drafter %s: ignoring %d tensors the drafter does not use: %s%s",
                   origin, len(ignored), shown, more)


def _without(state: dict, names: list[str]) -> dict:
    drop = set(names)
    return {k: v for k, v in state.items() if k not in drop}


def _read_mask_embedding(root: Path, cfg: DrafterConfig) -> tuple[torch.Tensor, int] | None:
    """`mask_embedding.pt` ({"embedding": [H], "mask_token_id": int}), or None.

    Read as sglang 0.5.23's worker reads it (`dflash_worker_v2.py`
    `_maybe_merge_trained_mask_embedding`); per-position embeddings are refused
    there and here.
    """
    path = root / MASK_EMBEDDING_NAME
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling failure: name the file, not the pickle internals
        raise _CheckpointError(f"{MASK_EMBEDDING_NAME} cannot be read ({exc})") from None
    if not isinstance(saved, dict) or not {"embedding", "mask_token_id"} <= set(saved):
        raise _CheckpointError(f"{MASK_EMBEDDING_NAME} must hold a dict with 'embedding' and "
                               "'mask_token_id'")
    if saved.get("per_position"):
        raise _CheckpointError(f"{MASK_EMBEDDING_NAME} has per_position = True "
                               "(per-position mask embeddings are not supported)")
    embedding = _mask_embedding_tensor(saved["embedding"], cfg.hidden_size)
    return embedding, _mask_embedding_id(saved["mask_token_id"], cfg)


def _mask_embedding_tensor(value, hidden_size: int) -> torch.Tensor:
    name = f"{MASK_EMBEDDING_NAME} embedding"
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise _CheckpointError(f"{name} must be a float tensor, got {type(value).__name__}")
    if tuple(value.shape) != (hidden_size,):
        raise _CheckpointError(f"{name} has shape {list(value.shape)}, expected [{hidden_size}]")
    if not bool(torch.isfinite(value).all()):
        raise _CheckpointError(f"{name} has non-finite values")
    return value.clone()


def _mask_embedding_id(value, cfg: DrafterConfig) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    name = f"{MASK_EMBEDDING_NAME} mask_token_id"
    if not is_int(value) or not 0 <= value < cfg.vocab_size:
        raise _CheckpointError(f"{name} = {value!r} must be an int in [0, {cfg.vocab_size})")
    if cfg.mask_token_id is not None and value != cfg.mask_token_id:
        raise _CheckpointError(f"{name} = {value} differs from dflash_config.mask_token_id = "
                               f"{cfg.mask_token_id}; they must match")
    return int(value)


def drafter_param_count(model: DFlashDrafter) -> int:
    """Total parameters; a quick cross-check against published sizes."""
    return sum(math.prod(p.shape) for p in model.parameters())
