"""FP8 drafter checkpoints: dequantization against a per-element reference,
the loader on FP8 copies of a drafter in both layouts, and the refusals."""

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_dflash.checkpoint import load_drafter
from sglang_dflash.quantized import checkpoint_quantization, dequantize, dequantize_state, quantize, write_fp8_copy
from test_checkpoint import saved

E4M3 = torch.float8_e4m3fn


@pytest.fixture
def tiny_drafter_dir(tmp_path):
    """A random DFlash 2 drafter saved in the published layout."""
    return str(saved(tmp_path / "bf", version=2)[1])


def _reference(weight, scale, r, c):
    """weight * scale, element by element: row i, column j take scale[i // r, j // c]."""
    out = torch.empty(weight.shape)
    for i in range(weight.shape[0]):
        for j in range(weight.shape[1]):
            out[i, j] = float(weight[i, j].float()) * float(scale[i // r, j // c])
    return out


@pytest.mark.parametrize("block", [(4, 8), (3, 5), None], ids=["even", "edge-blocks", "per-row"])
def test_dequantize_matches_per_element_reference(block):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(10, 17, generator=gen) * torch.logspace(-2, 1, 10)[:, None]  # rows of different scales
    q, scale = quantize(w, block)
    r, c = block or (1, 17)
    assert tuple(scale.shape) == (math.ceil(10 / r), math.ceil(17 / c)) and q.dtype == E4M3
    got = dequantize(q, scale, block)
    assert torch.equal(got, _reference(q, scale, r, c))
    # e4m3 keeps 3 mantissa bits: within 1/16 of each value, plus the subnormal floor of its block
    floor = _reference(torch.ones(10, 17), scale, r, c) * 2.0 ** -9
    assert bool(((got - w).abs() <= w.abs() / 16 + floor).all())


def test_scale_shapes_per_tensor_per_row_and_groups():
    q = (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 8).to(E4M3)
    values = q.float()
    assert torch.equal(dequantize(q, torch.tensor([2.0]), None), values * 2)
    rows = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(dequantize(q, rows, None), values * rows[:, None])
    assert torch.equal(dequantize(q, rows[:, None], (128, 128)), values * rows[:, None])  # per row beside a block
    groups = torch.tensor([[1.0, 2.0, 3.0]] * 4)  # groups of 2 columns (compressed-tensors "group")
    assert torch.equal(dequantize(q, groups, None), values * groups.repeat_interleave(2, 1))
    with pytest.raises(ValueError, match="neither divides it nor blocks of"):
        dequantize(q, torch.ones(3, 3), (2, 2))


def test_configs():
    assert checkpoint_quantization({}) is None
    hf = checkpoint_quantization({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert hf.method == "fp8" and hf.block == (128, 128)
    ct = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"type": "float", "num_bits": 8, "strategy": "block", "block_structure": [64, 32]}}}}
    assert checkpoint_quantization({"quantization_config": ct}).block == (64, 32)
    refused = [({"quant_method": "awq", "bits": 4}, "'awq' is not supported"),
               ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "'modelopt' is not supported"),
               ({**ct, "format": "pack-quantized"}, "format = 'pack-quantized' is not supported"),
               ({**ct, "config_groups": {"g": {"weights": {"type": "int", "num_bits": 4}}}}, "type 'int'"),
               ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size")]
    for quant, message in refused:
        with pytest.raises(ValueError, match=message):
            checkpoint_quantization({"quantization_config": quant})


def test_state_refusals():
    q, s = quantize(torch.randn(4, 4), None)
    scheme = checkpoint_quantization({"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="declares no quantization_config"):
        dequantize_state({"a.weight": q, "a.weight_scale": s}, None)
    with pytest.raises(ValueError, match="needs exactly one of"):
        dequantize_state({"a.weight": q}, scheme)
    with pytest.raises(ValueError, match="belong to no FP8 weight"):
        dequantize_state({"a.weight": q, "a.weight_scale": s, "b.weight_scale_inv": s}, scheme)
    out = dequantize_state({"a.weight": q, "a.weight_scale": s, "a.input_scale": torch.ones(1),
                            "norm.weight": torch.ones(4)}, scheme)
    assert set(out) == {"a.weight", "norm.weight"} and out["a.weight"].dtype == torch.float32


# layout -> (block, the scale's name)
LAYOUTS = {"fp8": ((16, 32), ".weight_scale_inv"), "compressed-tensors": (None, ".weight_scale")}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_load_drafter_dequantizes(tiny_drafter_dir, tmp_path, layout):
    block, scale_name = LAYOUTS[layout]
    path = write_fp8_copy(tiny_drafter_dir, tmp_path / layout, layout, block)
    kwargs = dict(target_hidden_size=None, target_vocab_size=None, target_num_layers=None)
    got = load_drafter(path, **kwargs).state_dict()
    want = load_drafter(tiny_drafter_dir, **kwargs).state_dict()
    stored = load_file(f"{path}/model.safetensors")
    for name, w in want.items():
        if stored[name].dtype == E4M3:
            scale = stored[name.removesuffix(".weight") + scale_name]
            assert torch.equal(got[name], dequantize(stored[name], scale, block)), name
            assert torch.allclose(got[name], w, rtol=1 / 16, atol=float(scale.max()) * 2 ** -9), name
        else:
            assert torch.equal(got[name], w), name


def test_load_drafter_refuses_fp8_without_its_scale(tiny_drafter_dir, tmp_path):
    block, scale_name = LAYOUTS["fp8"]
    path = write_fp8_copy(tiny_drafter_dir, tmp_path / "broken", "fp8", block)
    weights = load_file(f"{path}/model.safetensors")
    dropped = next(name for name in weights if name.endswith(scale_name))
    save_file({k: v for k, v in weights.items() if k != dropped}, f"{path}/model.safetensors")
    with pytest.raises(ValueError, match=r"invalid DFlash drafter checkpoint at .*needs exactly one of"):
        load_drafter(path, target_hidden_size=None, target_vocab_size=None, target_num_layers=None)


def test_quantized_target_head_refused():
    from sglang_dflash.adapter.tensor_parallel import vocab_head

    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(torch.zeros(8, 4).to(E4M3), requires_grad=False)
    with pytest.raises(ValueError, match="LM head is stored as torch.float8_e4m3fn"):
        vocab_head(head, 8, None)
