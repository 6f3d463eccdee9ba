"""Helpers shared by the integration tests: model paths, prompts, engine and
server processes. Everything runs the real SGLang engine / HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import requests

from sglang_dflash.cli import CPU_ENGINE_DEFAULTS
from sglang_dflash.demo import tiny_paths
from sglang_dflash.tools.prompts import mixed_chat_prompts

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmark"))
from common import free_port  # noqa: E402  (one port picker for benchmarks and tests)

# The losslessness tests pin speculation always on (every step verifies the
# full block: the most multi-token accept and commit paths). The default,
# adaptive, is exercised by test_concurrency_ramp.py, which sets its own.
os.environ.setdefault("SGLANG_DFLASH_POLICY", '{"mode": "on"}')
PATHS = tiny_paths()
TARGET = PATHS["target"]

# fp32 everywhere: greedy identity is then exact up to rare argmax near-ties.
ENGINE_DEFAULTS = {
    **CPU_ENGINE_DEFAULTS,
    "model_path": TARGET,
    "dtype": "float32",
    "max_total_tokens": 32768,
    "log_level": "warning",
    "random_seed": 0,
}


def chat_prompts(n: int) -> list[str]:
    """n real prompts (GSM8K, HumanEval, MT-Bench round-robin) with the target's chat template."""
    return mixed_chat_prompts(TARGET, n)


def rewrite_checkpoint(src: str, dst, transform) -> str:
    """A copy of the checkpoint directory `src` at `dst` with each tensor of its
    model.safetensors replaced by transform(name, tensor)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = os.path.join(dst, "model.safetensors")
    save_file({k: transform(k, v) for k, v in load_file(weights).items()}, weights)
    return str(dst)


def dflash_args(drafter: str) -> dict:
    return dict(speculative_algorithm="DFLASH", speculative_draft_model_path=PATHS[drafter])


def output_ids(run: dict) -> list[list[int]]:
    """Each request's output token ids in one run of `run_engine`, in request order."""
    return [r["output_ids"] for r in run["results"]]


def run_engine(engine_kwargs: dict, runs: list[dict], timeout: int = 2400, with_state: bool = False):
    """Start one engine in a subprocess, execute `runs`, return {name: run}
    (and the server's dflash state after the runs, with `with_state`)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        json.dump({"engine": {**ENGINE_DEFAULTS, **engine_kwargs}, "runs": runs}, open(spec_path, "w"))
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "engine_run.py"), spec_path, out_path],
            capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"engine run failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
        out = json.load(open(out_path))
        by_name = {run["name"]: run for run in out["runs"]}
        return (by_name, out["dflash"]) if with_state else by_name


class Server:
    """`sglang-dflash serve ...` (the documented CPU way) as a subprocess."""

    def __init__(self, args: list[str], timeout: int = 300, log_level: str = "warning"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "sglang_dflash.cli", "serve", *args,
               "--port", str(self.port), "--host", "127.0.0.1", "--log-level", log_level,
               "--max-total-tokens", "32768", "--random-seed", "0"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait(timeout)

    def _wait(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.output()[-6000:]}")
            try:
                if requests.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"server did not start in {timeout}s:\n{self.output()[-6000:]}")

    def output(self) -> str:
        self.log.flush()
        return open(self.log.name).read()

    def stop(self):
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
