"""Our drafter as an SGLang model class: after the plugin registers it,
SGLang's ModelRegistry resolves the published architecture names
(`DFlashDraftModel`, `DFlash2DraftModel`) to our classes; a saved checkpoint
loads through the model-loader interface (`Cls(config)`, `load_weights`) with
outputs identical to `load_drafter`, and a checkpoint missing a weight is
refused naming it (upstream leaves it at its initial value)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from harness import PATHS, TARGET
from sglang_dflash.demo import demo_pair

HERE = os.path.dirname(os.path.abspath(__file__))


# name -> (drafter, the target it drafts for, the architecture SGLang resolves, DFlash version)
CASES = {
    "drafter-trained": (PATHS["drafter-trained"], TARGET, "DFlashDraftModel", 1),
    "dflash2-random": (PATHS["dflash2-random"], TARGET, "DFlash2DraftModel", 2),
    "demo": (*demo_pair()[::-1], "DFlash2DraftModel", 2),  # written by `sglang-dflash train`
    # SGLang's Laguna drafter layout
    "swa-drafter-laguna": (PATHS["swa-drafter-laguna"], PATHS["swa-target"], "DFlashLagunaForCausalLM", 1),
}


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """Every case and a DFlash 2 checkpoint missing one weight, checked in one
    subprocess (its start-up, importing SGLang, is most of the time):
    ({drafter dir: result}, the missing weight's checkpoint, its name)."""
    dst = tmp_path_factory.mktemp("missing") / "drafter"
    shutil.copytree(PATHS["dflash2-random"], dst)
    weights = load_file(str(dst / "model.safetensors"))
    victim = next(k for k in weights if "selector" in k or "codebook" in k)
    del weights[victim]
    save_file(weights, str(dst / "model.safetensors"))
    args = [arg for drafter, target, _, _ in CASES.values() for arg in (drafter, target)] + [str(dst), TARGET]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "model_class_check.py"), *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), str(dst), victim


@pytest.mark.parametrize("name", list(CASES))
def test_registry_resolves_our_class_and_loads_identically(checks, name):
    drafter, _, arch, version = CASES[name]
    out = checks[0][drafter]
    assert out["arch"] == arch and out["module"] == "sglang_dflash.adapter.models.dflash_draft"
    assert out["version"] == version
    assert out["identical"] is True


def test_missing_weight_is_refused_by_name(checks):
    results, broken, victim = checks
    out = results[broken]
    assert "error" in out and victim.removeprefix("model.") in out["error"]
