"""benchmark/baseline.py --from-json: BASELINE.md and its plots rendered from a small
synthetic grid.json (the run itself is exercised by
test/integration/test_benchmark_harness.py through grid.py --tiny)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import baseline  # noqa: E402

pytest.importorskip("matplotlib")

CONFIGS = ["plain", "dflash-on", "dflash-adaptive", "dflash-off", "ngram"]
WORKLOADS = ["math", "code", "chat"]
CONCURRENCY = [1, 8]
# tok/s relative to plain; ngram did not start (a state the report must show).
SPEED = {"plain": 1.0, "dflash-on": 2.0, "dflash-adaptive": 1.96, "dflash-off": 0.9}


def _cells():
    cells = []
    for w in WORKLOADS:
        for c in CONCURRENCY:
            for rep in range(2):
                plain = 100.0 * c * (1 + 0.1 * rep)
                for name, speed in SPEED.items():
                    cells.append({"config": name, "workload": w, "concurrency": c, "rep": rep,
                                  "completed": 16, "output_throughput": plain * speed,
                                  "median_tpot_ms": 10.0 / speed,
                                  "accept_hist": [5, 3, 2] if name.startswith("dflash-o") else []})
    return cells


def _report():
    statuses = {n: {"description": f"{n} description", "command": f"sglang-dflash serve {n}",
                    "state": "ok", "startup_s": 30.0} for n in CONFIGS}
    statuses["ngram"].update(state="failed", reason="server exited | during start-up")
    settings = {"configs": CONFIGS, "workloads": WORKLOADS, "concurrency": CONCURRENCY,
                "repeats": 2, "max_new_tokens": 128, "requests": None, "min_requests": 16,
                "requests_per_slot": 2, "warmup_requests": 8, "temperature": 0.0, "top_p": 1.0,
                "allow_eos": False, "block_size": None, "max_running_requests": 64,
                "max_total_tokens": 65536, "server_args": None, "schedule": "interleaved",
                "restart_each_rep": False, "seed": 0, "target": "/x/target", "drafter": "/x/drafter",
                "unique_prompts": {w: 50 for w in WORKLOADS},
                "excluded_prompts": {w: 0 for w in WORKLOADS}}
    meta = {"mode": "full", "command": "python benchmark/baseline.py --concurrency 1,8 --repeats 2",
            "date": "2026-12-04 10:00:00 UTC", "wall_s": 3600.0,
            "load_average": {"before": [0.1, 0.1, 0.1], "after": [2.0, 2.0, 2.0]},
            "machine": {"nproc": 2, "cpu_model": "Test CPU 9000", "ram_gib": 16.0, "gpu": None},
            "versions": {"sglang": "0.5.23", "torch": "t", "transformers": "t",
                         "sglang-dflash": "0.1.0", "git_commit": "abc1234", "git_dirty": True},
            "settings": settings}
    return {"meta": meta, "configs": statuses, "summary": None, "cells": _cells(),
            "bench_serving_results": []}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    grid_json = root / "grid.json"
    grid_json.write_text(json.dumps(_report()))
    md, plots = root / "BASELINE.md", root / "baseline"
    plots.mkdir()
    (plots / "stale_plot.png").write_bytes(b"old")
    sim = root / "sim"
    sim.mkdir()
    (sim / "sim.json").write_text(json.dumps(_sim()))
    (sim / "speedup.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    assert baseline.main(["--from-json", str(grid_json), "--md", str(md), "--plots", str(plots),
                          "--sim", str(sim)]) == 0
    return md.read_text(), plots


def _sim():
    """A two-cell simulate.py result: one cell meets the goal, one does not."""
    def cell(w, c, on, off, adaptive):
        return {"workload": w, "clients": c, "modes": {
            "plain": {"tokens_per_s": 100.0}, "on": {"tokens_per_s": on},
            "off": {"tokens_per_s": off}, "adaptive": {"tokens_per_s": adaptive}}}
    return {"label": "SIMULATION (device model; not a measurement)", "target": "t", "block_size": 8,
            "scenarios": [{"name": "calibrated at math c1", "fixed_overhead_s": 0.005,
                           "cells": [cell("math", 1, 300.0, 100.0, 298.0),
                                     cell("chat", 64, 90.0, 100.0, 98.0)]}]}


def test_simulation_section_is_labelled_and_judged(rendered):
    md, _ = rendered
    section = md[md.index("## Simulation (not a measurement)"):]
    assert "SIMULATION" in section and "fixed overhead 5.00 ms" in section
    assert "| math | 1 | 3.00 | 1.000 | 2.980 | 0.993 | yes |" in section
    assert "| chat | 64 | 0.90 | 1.000 | 0.980 | 0.980 | no |" in section  # below plain
    assert "Goal met in 1 of 2 simulated cells." in section


def test_header_names_command_commit_host_and_date(rendered):
    md, _ = rendered
    assert md.startswith("# Benchmark baseline\n")
    assert "python benchmark/baseline.py --concurrency 1,8 --repeats 2" in md
    assert "`abc1234` (dirty tree)" in md
    assert "Test CPU 9000, 2 cores" in md and "2026-12-04 10:00:00 UTC" in md


def test_one_table_per_workload_with_ratios_to_plain(rendered):
    md, _ = rendered
    for w in WORKLOADS:
        assert f"### {w} (" in md
    assert md.count("| c | plain | dflash-on | dflash-adaptive | dflash-off | ngram |") == 3
    # c = 8: plain 800 and 880 tok/s over the two repetitions; on is 2x within each.
    assert "| 8 | 840.0 | 1680.0 (2.00x) | 1646.4 (1.96x) | 756.0 (0.90x) | n/a |" in md


def test_criteria_and_ngram_limits_are_stated(rendered):
    md, _ = rendered
    assert "## Adaptive policy criteria" in md
    assert "### `dflash-adaptive` against the adaptive policy's criteria" in md
    assert "**6 of 6 cells pass.**" in md
    assert "`ngram` on a host without CUDA" in md
    assert "| ngram | ngram description | failed: server exited \\| during start-up |" in md


def test_plots_are_few_small_and_linked(rendered):
    md, plots = rendered
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert pngs == sorted([f"speedup_{w}.png" for w in WORKLOADS] + ["simulation.png"])
    assert len(pngs) <= 6 and sum((plots / p).stat().st_size for p in pngs) <= 2 * 2**20
    for p in pngs:
        assert f"](baseline/{p})" in md
    assert len(md.encode()) <= 40 * 1024


def test_grid_arguments_of_the_default_run():
    opts = baseline.parse_args([])
    argv = baseline.grid_argv(opts)
    assert argv[argv.index("--configs") + 1] == "plain,dflash-on,dflash-adaptive,dflash-off,ngram"
    assert argv[argv.index("--concurrency") + 1] == "1,4,8,16,32,64"
    assert argv[argv.index("--repeats") + 1] == "3"
    assert argv[argv.index("--workloads") + 1] == "math,code,chat"
    assert argv[argv.index("--out") + 1].endswith(os.path.join("benchmark", "results", "baseline"))
    assert "--allow-eos" in argv  # natural output lengths unless --fixed-length
    assert "--allow-eos" not in baseline.grid_argv(baseline.parse_args(["--fixed-length"]))
