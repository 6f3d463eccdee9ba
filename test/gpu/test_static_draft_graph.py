"""The static draft step captured in CUDA graphs: replay equals the eager body on
the same inputs (DFlash 2 and v1 drafters, several batch sizes per bucket,
new inputs between replays). Skipped without CUDA by test/conftest.py."""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "unit"))

import test_static_draft as shared  # noqa: E402
from sglang_dflash.static_draft import StaticDraftStep  # noqa: E402


@pytest.mark.parametrize("name", ["dflash2-random", "drafter-random"])
def test_replay_equals_eager(name):
    env = shared._setup(name, device="cuda")
    body = shared._body(env)
    step = StaticDraftStep(body, [1, 4, 8], env["block"] - 1, "cuda")
    with torch.no_grad():
        step.capture()
        assert step.captured
        for bs, seed in ((1, 0), (3, 1), (8, 2), (5, 3), (2, 4)):
            x = shared._inputs(env, bs, seed)
            got = step.run(x)
            want = body(x)
            shared._assert_same(got, want, exact=False)
