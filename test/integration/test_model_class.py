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

HERE = os.path.dirname(os.path.abspath(__file__))


def _check(drafter_dir, target_dir=TARGET) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "model_class_check.py"), drafter_dir, target_dir],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,arch,version", [
    ("drafter-trained", "DFlashDraftModel", 1),
    ("dflash2-random", "DFlash2DraftModel", 2),
    ("demo", "DFlash2DraftModel", 2),  # written by `sglang-dflash train`
    ("swa-drafter-laguna", "DFlashLagunaForCausalLM", 1),  # SGLang's Laguna drafter layout
])
def test_registry_resolves_our_class_and_loads_identically(name, arch, version):
    if name == "demo":
        from sglang_dflash.demo import demo_pair

        target, drafter = demo_pair()
        out = _check(drafter, target)
    elif name == "swa-drafter-laguna":
        out = _check(PATHS[name], PATHS["swa-target"])
    else:
        out = _check(PATHS[name])
    assert out["arch"] == arch and out["module"] == "sglang_dflash.adapter.models.dflash_draft"
    assert out["version"] == version
    assert out["identical"] is True


def test_missing_weight_is_refused_by_name(tmp_path):
    dst = tmp_path / "drafter"
    shutil.copytree(PATHS["dflash2-random"], dst)
    weights = load_file(str(dst / "model.safetensors"))
    victim = next(k for k in weights if "selector" in k or "codebook" in k)
    del weights[victim]
    save_file(weights, str(dst / "model.safetensors"))
    out = _check(str(dst))
    assert "error" in out and victim.removeprefix("model.") in out["error"]
