"""The bundled demo pair: `python -m sglang_dflash.demo --print-paths` prints
two directories that our strict loader accepts as a matching pair, small
enough to ship inside the package."""

import json
import os
import subprocess
import sys

from sglang_dflash.checkpoint import load_drafter
from sglang_dflash.demo import demo_pair


def _size_mb(directory: str) -> float:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(directory)
               for f in files) / 2**20


def test_print_paths_prints_target_then_drafter():
    out = subprocess.run([sys.executable, "-m", "sglang_dflash.demo", "--print-paths"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == list(demo_pair())


def test_demo_pair_loads_strictly_and_fits_the_package():
    target, drafter_dir = demo_pair()
    cfg = json.load(open(os.path.join(target, "config.json")))
    drafter = load_drafter(drafter_dir, target_hidden_size=cfg["hidden_size"],
                           target_vocab_size=cfg["vocab_size"],
                           target_num_layers=cfg["num_hidden_layers"])
    assert drafter.cfg.version == 2  # DFlash 2, block 8, K 16 (the published setup)
    assert drafter.cfg.block_size == 8
    assert drafter.cfg.selector_top_k == 16
    assert os.path.exists(os.path.join(target, "tokenizer.json"))
    assert _size_mb(target) + _size_mb(drafter_dir) < 30
