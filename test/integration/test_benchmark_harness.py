"""benchmark/grid.py --tiny end to end: real servers (`sglang-dflash serve`, plain
and DFLASH with policy "on"), load from sglang.bench_serving, and the JSON /
Markdown / PNG reports."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmark", "grid.py"), "--tiny", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    with open(out / "grid.json") as f:
        return out, json.load(f), proc.stdout


def test_configs_started_and_cells_ran(tiny_run):
    _, report, _ = tiny_run
    assert set(report["configs"]) == {"plain", "dflash-on"}
    for name, st in report["configs"].items():
        assert st["state"] == "ok", (name, st)
        assert st["server"]["max_running_requests"] >= 64
    assert report["configs"]["dflash-on"]["plugin_dflash_block"] is True
    cells = report["cells"]
    assert {c["config"] for c in cells} == {"plain", "dflash-on"}
    for c in cells:
        assert "error" not in c, c.get("error")
        assert c["completed"] == c["num_prompts"] and c["failed_requests"] == 0
        assert c["output_throughput"] > 0
        assert c["total_output_tokens"] == c["num_prompts"] * report["meta"]["settings"]["max_new_tokens"]
        for key in ("median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "median_ttft_ms", "p99_ttft_ms"):
            assert c[key] > 0, key
        assert c["median_tpot_ms"] <= c["p90_tpot_ms"] <= c["p99_tpot_ms"]
        assert c["peak_rss_mib"] > 100
        assert c["bench_serving_command"].startswith("python -m sglang.bench_serving --backend sglang")


def test_acceptance_and_on_ratio(tiny_run):
    _, report, _ = tiny_run
    by_cfg = {c["config"]: c for c in report["cells"]}
    spec, plain = by_cfg["dflash-on"], by_cfg["plain"]
    assert spec["acceptance_length"] >= 1.0
    assert spec["acceptance_length_per_request"] >= 1.0
    block = report["configs"]["dflash-on"]["block_size"]
    assert spec["acceptance_length"] <= block
    assert spec["verify_steps"] > 0 and len(spec["accept_hist"]) <= block
    assert all(r["spec_verify_ct"] > 0 for r in spec["requests"])
    assert spec["spec_on_ratio"] == pytest.approx(1.0)  # policy "on" speculates every step
    assert plain["acceptance_length"] is None and plain.get("spec_on_ratio") is None
    # Ratios against plain decoding, within the repetition.
    row = next(r for r in report["summary"] if r["config"] == "dflash-on")
    expected = spec["output_throughput"] / plain["output_throughput"]
    assert row["speedup_throughput"]["median"] == pytest.approx(expected)
    assert row["speedup_tpot"]["median"] > 0


def test_reports_written(tiny_run):
    out, report, stdout = tiny_run
    md = (out / "grid.md").read_text()
    assert "| c | config | out tok/s |" in md and "| 4 | dflash-on |" in md
    assert report["meta"]["machine"]["nproc"] >= 1 and report["meta"]["versions"]["sglang"]
    for name in ("speedup_math.png", "throughput_math.png", "accept_hist_math.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
        assert f"]({name})" in md
    assert report["bench_serving_results"] and all("server_info" not in r for r in report["bench_serving_results"])
    # --tiny with --out writes only under --out.
    assert "updated" not in stdout
