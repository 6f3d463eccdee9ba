"""Strict save / load of drafters in the published HF layout.

A checkpoint directory holds `config.json` and one or more `*.safetensors`
files whose tensor names are the published ones (sglang-0.5.23 §8), optionally
prefixed with `model.`. Unlike sglang's loader, which silently ignores unknown
names and leaves missing conv / selector weights at their init, `load_drafter`
refuses any checkpoint whose names, shapes or values do not cover the model
exactly, and never zero-fills.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import DrafterConfig, parse_drafter_config
from .model import DFlashDrafter

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
_ALIAS_PREFIX = "model."


class _CheckpointError(ValueError):
    pass


def _error(path, message: str) -> ValueError:
    return ValueError(f"invalid DFlash drafter checkpoint at {path}: {message}")


def save_drafter(model: DFlashDrafter, cfg_dict: dict, out_dir: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` (float tensors as stored).

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
    return out


def _comparable(cfg: DrafterConfig) -> dict:
    """Config fields that shape the weights or the math (num_target_layers is
    only known once a target is given, so it is left out)."""
    fields = dict(cfg.__dict__)
    fields.pop("num_target_layers")
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

    Raises:
        ValueError("invalid DFlash drafter checkpoint at <path>: ...") naming
        missing / unexpected weights, wrong shapes, non-finite values, a missing
        config or weight file, or the config key at fault.
    """
    root = Path(path)
    try:
        cfg = parse_drafter_config(
            _read_config(root), target_hidden_size=target_hidden_size,
            target_vocab_size=target_vocab_size, target_num_layers=target_num_layers)
        model = DFlashDrafter(cfg)
        state = _read_weights(root)
        _check_coverage(model, state)
    except (_CheckpointError, ValueError) as exc:
        raise _error(root, str(exc)) from None
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def load_state_strict(model: DFlashDrafter, weights, *, origin: str) -> None:
    """Load `(name, tensor)` pairs (names as published, `model.` alias allowed)
    into `model`, refusing any set that does not cover it exactly (the same
    checks as `load_drafter`); `origin` names the caller in the error."""
    state: dict[str, torch.Tensor] = {}
    try:
        for raw, tensor in weights:
            name = raw.removeprefix(_ALIAS_PREFIX)
            if name in state:
                raise _CheckpointError(f"weight {name!r} appears more than once (again as {raw!r})")
            state[name] = tensor
        _check_coverage(model, state)
    except _CheckpointError as exc:
        raise ValueError(f"invalid DFlash drafter weights for {origin}: {exc}") from None
    model.load_state_dict(state, strict=True)


def _read_config(root: Path) -> dict:
    config_path = root / CONFIG_NAME
    if not config_path.is_file():
        raise _CheckpointError(f"{CONFIG_NAME} not found")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise _CheckpointError(f"{CONFIG_NAME} is not valid JSON ({exc})") from None


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file, with the `model.` alias stripped."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise _CheckpointError("no *.safetensors weight files found")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for raw in f.keys():
                name = raw.removeprefix(_ALIAS_PREFIX)
                if name in state:
                    raise _CheckpointError(f"weight {name!r} appears more than once "
                                           f"(again as {raw!r} in {file.name})")
                state[name] = f.get_tensor(raw)
    return state


def _check_coverage(model: DFlashDrafter, state: dict[str, torch.Tensor]) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing weights {missing}")
    if unexpected:
        problems.append(f"unexpected weights {unexpected}")
    for name in sorted(set(expected) & set(state)):
        got = tuple(state[name].shape)
        if got != expected[name]:
            problems.append(f"weight {name} has shape {list(got)}, expected {list(expected[name])}")
        elif not state[name].is_floating_point():
            problems.append(f"weight {name} has dtype {state[name].dtype}, expected a float dtype")
        elif not bool(torch.isfinite(state[name]).all()):
            bad = int((~torch.isfinite(state[name])).sum())
            problems.append(f"weight {name} has {bad} non-finite values")
    if problems:
        raise _CheckpointError("; ".join(problems))


def drafter_param_count(model: DFlashDrafter) -> int:
    """Total parameters; a quick cross-check against published sizes."""
    return sum(math.prod(p.shape) for p in model.parameters())
