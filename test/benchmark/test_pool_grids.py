"""benchmark/pool_grids.py: runs of one grid pooled into one report, ratios
kept within a repetition, runs of different grids refused."""

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import grid_report  # noqa: E402
import pool_grids  # noqa: E402


def _run(tok_s, commit, repeats):
    """A grid.json-like report of math c1; tok_s: {config: [tok/s per repetition]}."""
    cells = [{"workload": "math", "concurrency": 1, "config": name, "rep": rep, "completed": 8,
              "output_throughput": v} for name, reps in tok_s.items() for rep, v in enumerate(reps)]
    meta = {"mode": "full", "section": "s", "command": f"python benchmark/grid.py --repeats {repeats}",
            "date": "2026-12-03", "wall_s": 60.0, "load_average": None,
            "machine": {"nproc": 2, "cpu_model": "cpu", "ram_gib": 23.5, "gpu": None},
            "versions": {"sglang": "0.5.23", "torch": "t", "transformers": "t", "sglang-dflash": "0.1.0",
                         "git_commit": commit, "git_dirty": False},
            "settings": {"configs": list(tok_s), "workloads": ["math"], "concurrency": [1],
                         "repeats": repeats, "temperature": 0.0}}
    return {"meta": meta, "configs": {}, "summary": None, "cells": cells, "bench_serving_results": []}


def test_repetitions_are_renumbered_and_ratios_stay_within_one():
    # Run 2's host is twice as fast: its pairs keep their ratio of 0.9, and a
    # pairing across runs (plain of one with adaptive of the other) would not.
    a = _run({"plain": [100, 100], "dflash-adaptive": [90, 90]}, "aaa", 2)
    b = _run({"plain": [200, 200, 200], "dflash-adaptive": [180, 180, 180]}, "bbb", 3)
    pooled = pool_grids.pool([a, b])
    assert sorted(c["rep"] for c in pooled["cells"] if c["config"] == "plain") == [0, 1, 2, 3, 4]
    assert pooled["meta"]["settings"]["repeats"] == 5
    assert pooled["meta"]["versions"]["git_commit"] == "aaa + bbb"
    assert [s["repeats"] for s in pooled["meta"]["pooled_from"]] == [2, 3]
    by = {(c["config"], c["rep"]): c["output_throughput"] for c in pooled["cells"]}
    assert all(by["dflash-adaptive", r] / by["plain", r] == pytest.approx(0.9) for r in range(5))
    note = "\n".join(grid_report.pooled_note(pooled["meta"]))
    assert "from 2 runs" in note and "git aaa, 2 repetition(s)" in note and "git bbb, 3" in note
    assert grid_report.pooled_note(a["meta"]) == []


def test_runs_of_different_grids_are_refused():
    a = _run({"plain": [100]}, "aaa", 1)
    b = copy.deepcopy(a)
    b["meta"]["settings"]["temperature"] = 1.0
    with pytest.raises(SystemExit, match="differ in temperature"):
        pool_grids.pool([a, b])
    c = copy.deepcopy(a)
    c["meta"]["machine"]["nproc"] = 16
    with pytest.raises(SystemExit, match="different hosts"):
        pool_grids.pool([a, c])
    with pytest.raises(SystemExit, match="at least two"):
        pool_grids.pool([a])
