"""benchmark/step_analysis.py on the bundled tiny pair (CPU, no SGLang), plus the
small helpers of benchmark/common.py it and benchmark/grid.py share."""

import itertools
import json
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmark"))

import common  # noqa: E402
import step_analysis  # noqa: E402
from sglang_dflash.demo import tiny_paths  # noqa: E402

PATHS = tiny_paths()


@pytest.fixture(scope="module")
def v1_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "steps.json"
    argv = ["--target", PATHS["target"], "--drafter", PATHS["drafter-trained"], "--workloads", "math,chat",
            "--prompts", "1", "--max-new-tokens", "16", "--ctx-len", "16", "--iters", "2", "--warmup", "1",
            "--out", str(out)]
    assert step_analysis.main(argv) == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_v1_outputs_are_consistent(v1_result):
    r, md = v1_result
    S = r["drafter"]["block_size"] - 1
    o = r["overall"]
    assert o["steps"] > 0 and sum(o["acceptance_hist"]) == o["steps"]
    assert len(o["acceptance_hist"]) == S + 1
    al = sum((a + 1) * n for a, n in enumerate(o["acceptance_hist"])) / o["steps"]
    assert o["mean_acceptance_length"] == pytest.approx(al)
    assert 1.0 <= o["mean_acceptance_length"] <= S + 1
    # The trained tiny drafter does better than chance.
    assert o["mean_acceptance_length"] > 1.2
    # Greedy verification is lossless: the served drafts scored against the
    # target's greedy continuation give exactly the loop's accept lengths.
    assert o["verify_consistent_with_greedy_truth"]
    paths = o["path_acceptance_length"]
    assert paths["served"] == pytest.approx(o["mean_acceptance_length"])
    assert paths["argmax"] == pytest.approx(paths["served"])  # v1 drafts are the argmax
    assert paths["oracle"] >= paths["served"]
    for j in range(S):
        assert 0 <= o["recall_at_1"][j] <= o["recall_at_k"][j] <= 1
        assert 0 <= o["accept_at_least"][j] <= 1
    # P(accept >= j) is non-increasing in j.
    assert all(a >= b for a, b in zip(o["accept_at_least"], o["accept_at_least"][1:]))
    assert set(r["by_workload"]) == {"math", "chat"}
    t = r["timing"]
    assert t["verify_ms"] > 0 and t["draft_step_ms"] > 0
    assert t["draft_fraction_of_verify"] == pytest.approx(t["draft_step_ms"] / t["verify_ms"])
    # The same report as Markdown beside the JSON.
    assert md.startswith("## Step analysis") and "| workload | steps | AL |" in md


def test_dflash2_selector_paths(tmp_path):
    out = tmp_path / "v2.json"
    argv = ["--target", PATHS["target"], "--drafter", PATHS["dflash2-random"], "--workloads", "code",
            "--prompts", "1", "--max-new-tokens", "12", "--no-timing", "--out", str(out)]
    assert step_analysis.main(argv) == 0
    r = json.loads(out.read_text())
    assert r["drafter"]["version"] == 2 and r["drafter"]["has_selector"]
    assert r["k"] == r["drafter"]["selector_top_k"]
    assert r["paths"] == ["served", "argmax", "viterbi", "oracle"]
    o = r["overall"]
    assert o["verify_consistent_with_greedy_truth"]
    p = o["path_acceptance_length"]
    assert p["oracle"] >= max(p["served"], p["argmax"], p["viterbi"])
    assert 0 <= o["selector_equals_oracle_rate"] <= 1
    assert "timing" not in r


def test_viterbi_is_the_best_path():
    gen = torch.Generator().manual_seed(0)
    for S, K in ((1, 3), (3, 4), (4, 2)):
        scores = torch.randn(S, K, K, generator=gen)
        scores[0] = scores[0, 0]  # slot 0: every row is the anchor's

        def total(path, scores=scores, S=S):
            return float(scores[0, 0, path[0]] + sum(scores[e, path[e - 1], path[e]] for e in range(1, S)))

        best = max(itertools.product(range(K), repeat=S), key=total)
        assert total(step_analysis.viterbi(scores)) == pytest.approx(total(best))


def test_spread_and_format():
    assert common.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert common.spread([None]) is None
    assert common.fmt_spread(common.spread([1.0, 2.0, 4.0])) == "2.00 [1.00-4.00]"
    assert common.fmt_spread(common.spread([1.5])) == "1.50"
