"""A broken drafter checkpoint stops `python -m sglang.launch_server` at start-up
with a message naming the problem (upstream would zero-fill and serve).

Uses the plain documented CPU command (the `sglang-dflash cpu-env` exports)."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from harness import PATHS, TARGET, launch_to_failure, run_together


def _broken_copy(tmp_path, edit_config=None, drop_weight=None, base="drafter-random"):
    dst = tmp_path / "drafter"
    shutil.copytree(PATHS[base], dst)
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if drop_weight:
        weights = load_file(str(dst / "model.safetensors"))
        del weights[drop_weight]
        save_file(weights, str(dst / "model.safetensors"))
    return str(dst)


CASES = {
    "missing_weight": (dict(drop_weight="fc.weight"), "fc.weight"),
    "wrong_hidden_size": (dict(edit_config=lambda c: c.update(hidden_size=c["hidden_size"] * 2)), "hidden_size"),
    "vocab_mismatch": (dict(edit_config=lambda c: c.update(vocab_size=c["vocab_size"] + 7)), "vocab"),
    # DFlash 2 checkpoints
    "v2_codebook_missing": (
        dict(base="dflash2-random", drop_weight="candidate_selector.successor_codebook"),
        "candidate_selector.successor_codebook",
    ),
    "v2_top_k_above_vocab": (
        dict(base="dflash2-random", edit_config=lambda c: c["dflash_config"].update(selector_top_k=10**6)),
        "selector_top_k",
    ),
    "v2_group_not_dividing_hidden": (
        dict(base="dflash2-random", edit_config=lambda c: c["dflash_config"].update(conv_group_size=7)),
        "conv_group_size",
    ),
    # A quantized drafter other than FP8 (FP8 is dequantized at load)
    "awq_quantized": (
        dict(edit_config=lambda c: c.update(quantization_config={"quant_method": "awq", "bits": 4})),
        "quantization_config.quant_method = 'awq' is not supported",
    ),
}


STATE_SPACE = "state_space_target"


def _state_space_target(tmp_path) -> str:
    """The tiny target declaring Jamba-style `attn_layer_indices` (layers 0 and 2 state-space)."""
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["attn_layer_indices"] = [1, 3]
    (target / "config.json").write_text(json.dumps(cfg))
    return str(target)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every case's launch (run_together: two at a time), by case name."""
    calls = {}
    for case, (kwargs, _) in CASES.items():
        drafter = _broken_copy(tmp_path_factory.mktemp(case), **kwargs)
        calls[case] = lambda drafter=drafter: launch_to_failure(drafter)
    target = _state_space_target(tmp_path_factory.mktemp(STATE_SPACE))
    calls[STATE_SPACE] = lambda: launch_to_failure(PATHS["drafter-random"], target=target)
    return run_together(calls)


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_drafter_fails_startup(launches, case):
    proc, needle = launches[case], CASES[case][1]
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "invalid DFlash drafter" in output or "drafter config" in output, output[-3000:]
    assert needle in output, output[-3000:]


def test_state_space_target_is_refused_naming_the_reason(launches):
    """A target declaring state-space layers the worker cannot commit (here
    Jamba-style `attn_layer_indices`): start-up stops with the reason instead
    of serving."""
    proc = launches[STATE_SPACE]
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "cannot serve the target" in output and "attn_layer_indices" in output, output[-3000:]
