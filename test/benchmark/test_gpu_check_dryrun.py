"""benchmark/gpu_check.py --dry-run: the prepared GPU script runs end to end on
CPU at tiny sizes and writes its JSON report. With triton importable the dry
run sets TRITON_INTERPRET=1, so the parity and kernel-timing code that a GPU
run uses also runs here (kernels in the interpreter); CUDA graphs and CUDA
events are replaced by eager calls and perf_counter."""

import importlib.util
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmark", "gpu_check.py")


def test_gpu_check_dry_run(tmp_path):
    has_triton = importlib.util.find_spec("triton") is not None
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET")}
    if has_triton:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ALL CHECKS PASS" in proc.stdout and "KERNEL-LEVEL" in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["env"]["backend"] == "torch"  # CPU tensors: the dispatch picks the twins
    assert all(r["ok"] for r in report["parity"] + report["graph"])
    if has_triton:
        checks = [r["check"] for r in report["parity"]]
        assert any(c.startswith("walk") for c in checks), checks
        assert any(c.startswith("rejection") for c in checks), checks
        assert all(r["written"] for r in report["parity"])
        assert {r["op"] for r in report["kernel_timings"]} == {"walk", "rejection"}
    assert [r["ok"] for r in report["graph"]] == [True] * 4  # two drafters: own step, static step
    assert sum(r["check"].startswith("static draft step") for r in report["graph"]) == 2
    assert {r["drafter"] for r in report["timings"]} == {"dflash1-2L", "dflash2-2L"}
    for row in report["timings"]:
        assert row["draft_step_ms"] > 0 and row["verify_ms"] > 0 and row["decode_ms"] > 0
        assert row["break_even_commit_len"] > 0
