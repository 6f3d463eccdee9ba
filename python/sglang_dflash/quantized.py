"""FP8 drafter checkpoints, dequantized at load.

A drafter checkpoint may store its matrices in FP8 (float8_e4m3fn or
float8_e5m2) with a float scale per tensor, per output row, per group of input
columns or per block, in the two layouts quantization tools write:

* transformers' FP8 (`quantization_config.quant_method: "fp8"`): a block scale
  `<name>.weight_scale_inv` of shape [ceil(rows / r), ceil(cols / c)] for
  `weight_block_size: [r, c]`, or one `<name>.weight_scale` without a block
  size (the "inv" is historical: both multiply the FP8 values);
* llm-compressor's compressed-tensors (`quant_method: "compressed-tensors"`,
  format "float-quantized", 8-bit float weights): `<name>.weight_scale` per
  tensor, row, group (`group_size`) or block (`block_structure`).

The drafter is small beside its target, so it is served dequantized in the
server's dtype: each weight becomes fp8 * scale, the matrix a quantized matmul
multiplies by. Activation scales (`input_scale`, ...) are dropped, so drafts may
differ slightly from a quantized kernel's; the served output never depends on
drafts. Integer and 4-bit formats (AWQ, GPTQ, packed int, NVFP4, ...) are
refused with the reason. Plain torch, no SGLang.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .checks import is_int

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
WEIGHT_SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
# Scales of activations or of the KV cache: meaningless once weights are dequantized.
ACTIVATION_SCALE_SUFFIXES = (".input_scale", ".output_scale", ".k_scale", ".v_scale")
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_CT_FLOAT_FORMATS = ("float-quantized", "naive-quantized")


@dataclass(frozen=True)
class Fp8Scheme:
    method: str                      # "fp8" | "compressed-tensors"
    block: tuple[int, int] | None    # [rows, cols] per scale, when the config fixes it


def checkpoint_quantization(config: dict) -> Fp8Scheme | None:
    """The FP8 scheme a drafter's config.json declares, or None when unquantized.

    Raises ValueError naming the key for any other quantization method.
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ValueError(f"quantization_config must be an object, got {type(quant).__name__}")
    method = quant.get("quant_method")
    if method == "fp8":
        return Fp8Scheme("fp8", _block(quant.get("weight_block_size"), "quantization_config.weight_block_size"))
    if method == "compressed-tensors":
        return Fp8Scheme("compressed-tensors", _compressed_tensors_block(quant))
    raise ValueError(f"quantization_config.quant_method = {method!r} is not supported: a quantized drafter "
                     "must store FP8 weights (quant_method 'fp8', or 'compressed-tensors' float-quantized); "
                     "use the unquantized drafter checkpoint")


def _block(value, key: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(is_int(v) and v > 0 for v in value)):
        raise ValueError(f"{key} = {value!r} must be two positive ints [rows, cols]")
    return int(value[0]), int(value[1])


def _compressed_tensors_block(quant: dict) -> tuple[int, int] | None:
    fmt = quant.get("format")
    if fmt not in _CT_FLOAT_FORMATS:
        raise ValueError(f"quantization_config.format = {fmt!r} is not supported for a compressed-tensors "
                         f"drafter (only FP8 weights: {list(_CT_FLOAT_FORMATS)})")
    blocks = set()
    for name, group in (quant.get("config_groups") or {}).items():
        weights = (group or {}).get("weights") or {}
        key = f"quantization_config.config_groups.{name}.weights"
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(f"{key}: type {weights.get('type')!r} with num_bits {weights.get('num_bits')!r} "
                             "is not supported (only 8-bit float weights)")
        if weights.get("strategy") == "block":
            blocks.add(_block(weights.get("block_structure"), key + ".block_structure"))
    if len(blocks) > 1:
        raise ValueError(f"quantization_config.config_groups use different block structures {sorted(blocks)}")
    return blocks.pop() if blocks else None


def dequantize_state(state: dict[str, torch.Tensor], scheme: Fp8Scheme | None) -> dict[str, torch.Tensor]:
    """`state` with each FP8 weight replaced by fp8 * its scale (float32) and
    the scales dropped. Unquantized tensors pass through unchanged.

    Raises ValueError for an FP8 tensor without a scale (or in a checkpoint
    that declares no FP8 scheme), a scale without an FP8 weight, or a scale
    whose shape fits neither the weight nor the declared block.
    """
    fp8 = sorted(name for name, t in state.items() if t.dtype in FP8_DTYPES)
    if fp8 and scheme is None:
        raise ValueError(f"FP8 tensors {fp8[:4]} but config.json declares no quantization_config")
    scales = {name: t for name, t in state.items() if name.endswith(WEIGHT_SCALE_SUFFIXES)}
    out = {name: t for name, t in state.items()
           if name not in scales and not name.endswith(ACTIVATION_SCALE_SUFFIXES)}
    used = set()
    for name in fp8:
        if not name.endswith(".weight"):
            raise ValueError(f"FP8 tensor {name} is not a weight")
        base = name.removesuffix(".weight")
        found = [base + suffix for suffix in WEIGHT_SCALE_SUFFIXES if base + suffix in scales]
        if len(found) != 1:
            raise ValueError(f"FP8 weight {name} needs exactly one of {[base + s for s in WEIGHT_SCALE_SUFFIXES]}, "
                             f"found {found}")
        used.add(found[0])
        out[name] = dequantize(state[name], scales[found[0]], scheme.block, name)
    orphans = sorted(set(scales) - used)
    if orphans:
        raise ValueError(f"weight scales {orphans} belong to no FP8 weight")
    return out


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
               name: str = "weight") -> torch.Tensor:
    """fp8 [rows, cols] * scale expanded to [rows, cols] (float32). A scale is
    one value, one per row ([rows] or [rows, 1]), or one per block ([a, b]:
    blocks of `block`, the last ones cut at the edge, or rows / a by cols / b)."""
    values = weight.to(torch.float32)
    scale = scale.to(torch.float32)
    if scale.numel() == 1:
        return values * scale.reshape(())
    if weight.dim() != 2:
        raise ValueError(f"{name}: a {weight.dim()}-d FP8 tensor needs one scale, got shape {list(scale.shape)}")
    rows, cols = weight.shape
    if scale.dim() == 1:
        scale = scale[:, None]
    if scale.dim() != 2:
        raise ValueError(f"{name}: scale of shape {list(scale.shape)}")
    return values * _expand(scale, rows, cols, block, name)


def _expand(scale: torch.Tensor, rows: int, cols: int, block, name: str) -> torch.Tensor:
    a, b = scale.shape
    if block is not None and (a, b) == (math.ceil(rows / block[0]), math.ceil(cols / block[1])):
        r, c = block
    elif rows % a == 0 and cols % b == 0:
        r, c = rows // a, cols // b
    else:
        fits = "" if block is None else f" nor blocks of {list(block)}"
        raise ValueError(f"{name} [{rows}, {cols}]: scale of shape [{a}, {b}] neither divides it{fits}")
    return scale.repeat_interleave(r, 0)[:rows].repeat_interleave(c, 1)[:, :cols]


def quantize(weight: torch.Tensor, block: tuple[int, int] | None,
             dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, scale) for a [rows, cols] matrix: one scale per block of
    `block` (edge blocks cut), or one per row when `block` is None; each
    block's largest magnitude maps to the format's largest value. The inverse
    of `dequantize` up to FP8 rounding; for writing FP8 checkpoints."""
    rows, cols = weight.shape
    r, c = block if block is not None else (1, cols)
    a, b = math.ceil(rows / r), math.ceil(cols / c)
    padded = torch.zeros(a * r, b * c, dtype=torch.float32)
    padded[:rows, :cols] = weight.to(torch.float32)
    peak = padded.reshape(a, r, b, c).abs().amax(dim=(1, 3))
    scale = torch.where(peak > 0, peak / _FP8_MAX[dtype], torch.ones_like(peak))
    scaled = weight.to(torch.float32) / _expand(scale, rows, cols, (r, c), "weight")
    return scaled.to(dtype), scale


def write_fp8_copy(src: str | Path, dst: str | Path, layout: str = "fp8",
                   block: tuple[int, int] | None = (128, 128)) -> str:
    """An FP8 copy of the drafter checkpoint directory `src` (one
    model.safetensors) at `dst`: every matrix named `*.weight` in FP8 with its
    scale, as `layout` writes it ("fp8": transformers' `weight_scale_inv` per
    block, `weight_block_size`; "compressed-tensors": `weight_scale` per block
    or, with `block` None, per row), plus a unit `input_scale` (a static
    activation scale, which loading drops). Vectors and the selector's
    codebooks stay as they are. Returns `dst`."""
    if layout == "fp8":
        if block is None:
            raise ValueError("layout 'fp8' writes block scales: give a block")
        quant_config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
        scale_name = ".weight_scale_inv"
    elif layout == "compressed-tensors":
        weights = {"type": "float", "num_bits": 8, "strategy": "channel" if block is None else "block"}
        if block is not None:
            weights["block_structure"] = list(block)
        quant_config = {"quant_method": "compressed-tensors", "format": "float-quantized",
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
        scale_name = ".weight_scale"
    else:
        raise ValueError(f"layout {layout!r}: 'fp8' or 'compressed-tensors'")
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    out = {}
    for name, w in load_file(str(src / "model.safetensors")).items():
        if w.dim() == 2 and name.endswith(".weight"):
            base = name.removesuffix(".weight")
            out[name], out[base + scale_name] = quantize(w, block)
            out[base + ".input_scale"] = torch.ones(1)
        else:
            out[name] = w
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config}, indent=2))
    return str(dst)
