"""Helpers shared by the integration tests: model paths, prompts, engine and
server processes. Everything runs the real SGLang engine / HTTP server."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import requests
import torch

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


def noised_copy(src: str, dst, scale: float, gen: torch.Generator) -> str:
    """A copy of the checkpoint `src` with `scale` x its own std of noise drawn
    from `gen` added to each matrix (vectors, e.g. norms, kept)."""
    return rewrite_checkpoint(src, dst, lambda k, v: v + scale * v.std() * torch.randn(v.shape, generator=gen)
                              if v.dim() > 1 else v)


def redrawn_copy(src: str, dst, gen: torch.Generator) -> str:
    """A copy of the checkpoint `src` with each matrix redrawn from `gen` at its
    own scale (vectors kept): same shapes, none of the trained weights."""
    return rewrite_checkpoint(src, dst, lambda k, v: torch.randn(v.shape, generator=gen) * v.std()
                              if v.dim() > 1 else v)


def dflash_args(drafter: str) -> dict:
    return dict(speculative_algorithm="DFLASH", speculative_draft_model_path=PATHS[drafter])


def output_ids(run: dict) -> list[list[int]]:
    """Each request's output token ids in one run of `run_engine`, in request order."""
    return [r["output_ids"] for r in run["results"]]


@functools.lru_cache(maxsize=1)
def _reference_model(model_path: str):
    """The transformers float32 model at `model_path`, loaded once for a file's
    consecutive checks of the same target."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


def not_transformers_greedy(model_path: str, prompts: list[list[int]], served: list[list[int]]) -> dict:
    """{prompt index: positions} where a served token is not transformers'
    greedy choice (float32), teacher-forced on the served tokens: each position
    is judged on the served prefix, so one divergence shows once, not as a
    cascade. Empty when plain serving matches the reference."""
    model = _reference_model(model_path)
    wrong = {}
    for i, (ids, got) in enumerate(zip(prompts, served)):
        with torch.no_grad():
            want = model(torch.tensor([ids + got])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
        positions = [k for k, (w, g) in enumerate(zip(want, got)) if w != g]
        if positions:
            wrong[i] = positions
    return wrong


def hidden_state_rows(hidden) -> list[list[float]]:
    """meta_info["hidden_states"] as a list of rows: with return_hidden_states
    True a prefill's rows come as one list, then a row per decoded token; with
    "last" it is one row."""
    if hidden and isinstance(hidden[0], float):
        return [hidden]
    rows = []
    for item in hidden:
        rows.extend(item if item and isinstance(item[0], list) else [item])
    return rows


def max_row_difference(got: list[list[float]], want: list[list[float]]) -> float:
    """Largest elementwise difference of two equally shaped lists of rows."""
    return max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))


def assert_same_hidden_states(want: dict, got: dict, asks: list, label: str, tol: float = 1e-3) -> None:
    """Two runs' returned hidden states (return_hidden_states per prompt:
    True, "last" or False) agree row for row within `tol` (a verify computes a
    block of rows at once, so float noise, not identity); a prompt that asked
    none got none."""
    for i, (a, b) in enumerate(zip(want["results"], got["results"], strict=True)):
        if not asks[i]:
            assert b["meta_info"]["hidden_states"] is None, (label, i)
            continue
        expected = hidden_state_rows(a["meta_info"]["hidden_states"])
        rows = hidden_state_rows(b["meta_info"]["hidden_states"])
        assert len(rows) == len(expected) and len(expected) >= (1 if asks[i] == "last" else 2), (label, i)
        assert max_row_difference(rows, expected) < tol, (label, i)


def run_engine(engine_kwargs: dict, runs: list[dict], timeout: int = 2400, with_state: bool = False,
               env: dict | None = None):
    """Start one engine in a subprocess, execute `runs`, return {name: run}
    (and the server's dflash state after the runs, with `with_state`)."""
    return run_engines([Job(engine_kwargs, runs, with_state, env)], timeout)[0]


@dataclass
class Job:
    """One engine of `run_engines`: its sgl.Engine kwargs (over ENGINE_DEFAULTS),
    the runs it executes, and environment variables set for it alone."""

    engine: dict
    runs: list[dict]
    with_state: bool = False
    env: dict | None = None


# An idle CPU engine holds about 3 GB (three processes, each with torch and
# SGLang imported); this many at once stays well inside a 24 GB host.
MAX_LIVE_ENGINES = 3


def run_engines(jobs: list[Job], timeout: int = 2400) -> list:
    """Run each job's engine as `run_engine` does, started ahead of their turn
    (up to MAX_LIVE_ENGINES alive at once) and run one at a time, in order.

    An engine's start-up (its processes, model load, pools) keeps about
    one of the host's cores busy, so starting engines together saves wall time.
    Runs never overlap each other (an engine waits, idle, until released); with
    up to MAX_LIVE_ENGINES jobs none overlaps a start-up either, so what a run
    times is as with `run_engine`. Beyond that, later engines start while
    earlier ones run: for tests of outputs, not of timing."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        deadline = time.time() + timeout

        def start(i):
            job = jobs[i]
            spec, out, err = (os.path.join(tmp, f"{name}{i}") for name in ("spec", "out", "err"))
            with open(spec, "w") as f:
                json.dump({"engine": {**ENGINE_DEFAULTS, **job.engine}, "runs": job.runs, "gate": True}, f)
            open(err, "w").close()
            engine = _engine_process(spec, out, err, {**os.environ, **(job.env or {})})
            stack.callback(engine.reap)
            return engine, out

        engines = [start(i) for i in range(min(len(jobs), MAX_LIVE_ENGINES))]
        for engine, _ in engines:  # the first window all started before any runs
            engine.wait_ready(deadline)
        results = []
        for i, job in enumerate(jobs):
            engine, out = engines[i]
            if i >= MAX_LIVE_ENGINES:
                engine.wait_ready(deadline)
            engine.finish(deadline)
            if len(engines) < len(jobs):
                engines.append(start(len(engines)))
            with open(out) as f:
                result = json.load(f)
            by_name = {run["name"]: run for run in result["runs"]}
            results.append((by_name, result["dflash"]) if job.with_state else by_name)
        return results


def _forking() -> bool:
    """Whether engines and servers start from the fork server: where the host
    has no CUDA device (a fork must not inherit a CUDA context) and
    ENGINE_START_METHOD is not "spawn"."""
    from sglang_dflash import cpu_runtime

    return os.environ.get("ENGINE_START_METHOD", "fork") == "fork" and not cpu_runtime.cuda_available()


def _engine_process(spec: str, out: str, err: str, env: dict):
    """engine_run on `spec`, gated: forked from the fork server (`_forking`),
    else a fresh interpreter."""
    return _ForkedEngine(spec, out, err, env) if _forking() else _SpawnedEngine(spec, out, err, env)


@functools.lru_cache(maxsize=1)
def _fork_server():
    """multiprocessing's fork server, which imports `engine_imports` (SGLang)
    once when the first engine starts; every engine is then a fork of it."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["engine_imports"])
    return context


class _ForkedEngine:
    """An engine_run process forked from the fork server, gated over a pipe."""

    def __init__(self, spec: str, out: str, err: str, env: dict):
        import engine_run

        context = _fork_server()
        self.err = err
        self.conn, theirs = context.Pipe()
        # Not a daemon: an engine starts processes of its own.
        self.proc = context.Process(target=engine_run.forked, args=(spec, out, env, err, theirs))
        self.proc.start()
        theirs.close()

    def wait_ready(self, deadline: float):
        from multiprocessing.connection import wait

        while time.time() < deadline:
            if wait([self.conn, self.proc.sentinel], timeout=1.0):
                try:
                    if self.conn.recv() == "ready":
                        return
                except EOFError:  # exited during start-up
                    pass
                self.proc.join()
                raise RuntimeError(f"engine run failed ({self.proc.exitcode}):\n{_tail(self.err)}")
        raise RuntimeError(f"engine did not start in time:\n{_tail(self.err)}")

    def finish(self, deadline: float):
        """Release the runs and wait for the process to end."""
        self.conn.send("go")
        self.proc.join(timeout=max(1, deadline - time.time()))
        if self.proc.exitcode is None:
            raise RuntimeError(f"engine run timed out:\n{_tail(self.err)}")
        if self.proc.exitcode != 0:
            raise RuntimeError(f"engine run failed ({self.proc.exitcode}):\n{_tail(self.err)}")

    def reap(self):
        """Stop an engine that is still waiting (a failed sibling or a timeout)."""
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class _SpawnedEngine:
    """`python engine_run.py` as a fresh interpreter, gated over stdin / stdout."""

    def __init__(self, spec: str, out: str, err: str, env: dict):
        self.err = err
        with open(err, "w") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "engine_run.py"), spec, out],
                                         env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)

    def wait_ready(self, deadline: float):
        """Wait for the line "ready" on the process's stdout."""
        import select

        while time.time() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:  # exited during start-up
                    self.proc.wait()
                    raise RuntimeError(f"engine run failed ({self.proc.returncode}):\n{_tail(self.err)}")
        raise RuntimeError(f"engine did not start in time:\n{_tail(self.err)}")

    def finish(self, deadline: float):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        try:
            code = self.proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"engine run timed out:\n{_tail(self.err)}") from None
        if code != 0:
            raise RuntimeError(f"engine run failed ({code}):\n{_tail(self.err)}")

    def reap(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_together(calls: dict, workers: int = 2) -> dict:
    """{key: call()} for zero-argument calls run `workers` at a time: for
    launches that fail during start-up, which mostly import (about one core
    each), so two together take about the time of one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        futures = {key: pool.submit(call) for key, call in calls.items()}
        return {key: future.result() for key, future in futures.items()}


def launch_to_failure(drafter: str, target: str = TARGET, extra=(), env=None) -> subprocess.CompletedProcess:
    """`python -m sglang.launch_server` with DFLASH on this host (CPU flags where
    there is no GPU), for a launch expected to stop during start-up: waits for
    it to exit and returns it, its output captured. env: the environment
    (default: this process's)."""
    from sglang_dflash import cpu_runtime

    env = dict(os.environ if env is None else env)
    if not cpu_runtime.cuda_available():
        env = cpu_runtime.cpu_env(env)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", target,
           "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter,
           "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
           "--port", str(free_port()), "--max-total-tokens", "4096", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _tail(path: str, n: int = 6000) -> str:
    return open(path).read()[-n:]


class Server:
    """`sglang-dflash serve ...` (the documented CPU way): with `spawn`, as a
    subprocess, exactly as a user starts it; otherwise the same arguments and
    environment (`cli.launch_server_setup`) run as `python -m
    sglang.launch_server` in a process forked from the fork server, its
    scheduler and detokenizer forked too (`engine_run.forked_server`): a
    third of the start-up time, for tests of what a server serves. What a
    fork can hide (a spawned child that would not load our plugin or CPU
    runtime) is what the spawned servers (test_server.py) and
    `launch_to_failure` keep covering. Spawned wherever engines are
    (`_engine_process`: CUDA, ENGINE_START_METHOD=spawn)."""

    def __init__(self, args: list[str], timeout: int = 300, log_level: str = "warning",
                 env: dict | None = None, wait: bool = True, spawn: bool = False):
        from sglang_dflash.cli import launch_server_setup

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        args = [*args, "--port", str(self.port), "--host", "127.0.0.1", "--log-level", log_level,
                "--max-total-tokens", "32768", "--random-seed", "0"]
        env = {**os.environ, **(env or {})}
        if spawn or not _forking():
            self.proc = subprocess.Popen([sys.executable, "-m", "sglang_dflash.cli", "serve", *args],
                                         stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=env)
        else:
            self.proc = _ForkedServer(*launch_server_setup(args, env), self.log.name)
        if wait:
            self.wait(timeout)

    def wait(self, timeout: int = 300):
        """Until the server answers /health_generate (it is stopped if it does not in time)."""
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
        stop_servers(self)


def stop_servers(*servers: Server) -> None:
    """SIGTERM to every server's process group at once, then wait for each (a
    server takes a few seconds to shut down; SIGKILL after 30)."""
    import signal

    running = [s for s in servers if s.proc.poll() is None]
    for server in running:
        _kill_group(server.proc.pid, signal.SIGTERM)
    deadline = time.time() + 30
    for server in running:
        try:
            server.proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            _kill_group(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


def _kill_group(pid: int, sig: int) -> None:
    """Signal the server's process group (its session: the server and its
    children), or the process alone before a forked one has made its session."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class _ForkedServer:
    """`engine_run.forked_server` forked from the fork server, with what
    `Server` uses of a Popen: pid, poll, wait, returncode."""

    def __init__(self, argv: list[str], env: dict, log_path: str):
        import engine_run

        self._proc = _fork_server().Process(target=engine_run.forked_server, args=(argv, env, log_path))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self):
        return self._proc.exitcode

    def poll(self):
        return self._proc.exitcode

    def wait(self, timeout: float | None = None):
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("forked server", timeout)
        return self._proc.exitcode


def start_servers(*configs: list[str] | tuple[list[str], dict], spawn: bool = False) -> list[Server]:
    """Servers started together, each config a list of args or (args, env);
    returned once every one serves. Start-up keeps about one core busy, so
    starting them together saves wall time; an idle server sleeps (the CPU
    defaults' sleep_on_idle), so one serving requests has the host to itself.
    If any fails to start, all are stopped. spawn: as `Server`'s."""
    servers = []
    try:
        for config in configs:
            args, env = config if isinstance(config, tuple) else (config, None)
            servers.append(Server(args, env=env, wait=False, spawn=spawn))
        for server in servers:
            server.wait()
    except BaseException:
        stop_servers(*servers)
        raise
    return servers


def stream_choices(url: str, body: dict) -> list[dict]:
    """The choices of every chunk of a streamed OpenAI response (`body` sent
    with "stream": true to `url`), in order."""
    choices = []
    with requests.post(url, json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                break
            choices += json.loads(data).get("choices", [])
    return choices


class Streams:
    """One streaming /generate per request body, each in a thread that keeps
    its last chunk; `wait_decoding` returns once every one has streamed a few
    chunks, so a pause then lands mid-decode."""

    def __init__(self, server, bodies: list[dict]):
        self.last = [None] * len(bodies)
        self.started = [threading.Event() for _ in bodies]
        self.threads = [threading.Thread(target=self._run, args=(server, i, body))
                        for i, body in enumerate(bodies)]
        for t in self.threads:
            t.start()

    def _run(self, server, i, body):
        with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True,
                           timeout=600) as r:
            chunks = 0
            for line in r.iter_lines():
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    self.last[i] = json.loads(line[5:])
                    chunks += 1
                    if chunks == 3:
                        self.started[i].set()
        self.started[i].set()

    def wait_decoding(self):
        for event in self.started:
            assert event.wait(600)
        assert all(t.is_alive() for t in self.threads), "a request finished before the pause"

    def join(self):
        for t in self.threads:
            t.join(timeout=600)
        return self.last
