"""Helpers shared by the benchmark scripts (grid.py and its report, baseline.py,
step_analysis.py, off_path.py).

* `Server`: one `sglang-dflash serve ...` process (the documented way to serve,
  CPU defaults added on a host without CUDA), its process tree, peak memory
  (VmHWM, resettable through /proc/<pid>/clear_refs) and sampled RSS.
* machine / version facts for the reports;
* small statistics helpers (median and spread, histograms).

Stdlib (+ requests) only at import time: the unit tests import this module.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmark", "results")
MIB = 1024 * 1024


# ---------------------------------------------------------------------------
# Machine and versions
# ---------------------------------------------------------------------------


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def machine_info() -> dict:
    """nproc, CPU model, RAM, GPU (if any), OS: what the report header shows."""
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram_kib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram_kib = int(line.split()[1])
                    break
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count()
    gpu = None
    if cuda_available():
        import torch

        gpu = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "nproc": nproc,
        "cpu_model": cpu_model or platform.processor() or "unknown",
        "ram_gib": round(ram_kib / 1024 / 1024, 1) if ram_kib else None,
        "gpu": gpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("sglang", "torch", "transformers", "sglang-dflash"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["git_commit"] = _git(["rev-parse", "--short", "HEAD"])
    status = _git(["status", "--porcelain", "--untracked-files=no"])
    out["git_dirty"] = bool(status) if status is not None else None
    return out


def _git(args: list[str]) -> str | None:
    """Read-only git query (never changes the repository)."""
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def mem_available_mib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def spread(values: Iterable[float | None]) -> dict | None:
    """{"median", "min", "max", "n"} over the finite values, or None if there are none."""
    vals = [float(v) for v in values if v is not None and v == v]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def add_hist(acc: list[int], hist: list[int]) -> None:
    """acc += hist, elementwise, growing acc as needed."""
    acc += [0] * (len(hist) - len(acc))
    for k, v in enumerate(hist):
        acc[k] += v


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_spread(s: dict | None, digits: int = 2) -> str:
    """"median [min-max]" (or just the value for a single repetition)."""
    if not s:
        return "n/a"
    if s["n"] == 1 or s["min"] == s["max"]:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


# ---------------------------------------------------------------------------
# Processes and memory
# ---------------------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    """root and all its descendants (from /proc/<pid>/stat ppid links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_kib(pids: Sequence[int], key: str) -> int:
    """Sum of a /proc/<pid>/status field (VmHWM, VmRSS) over the processes."""
    return sum(_status_kib(pid, key) for pid in pids)


def reset_peak_rss(pids: Sequence[int]) -> bool:
    """Reset VmHWM of each process (`echo 5 > /proc/<pid>/clear_refs`).
    Returns False if any reset was refused (then VmHWM is the lifetime peak)."""
    ok = True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok


class RssSampler:
    """Samples the summed VmRSS of a process tree in a thread; keeps the max."""

    def __init__(self, root: int, interval: float = 0.25):
        self.root, self.interval = root, interval
        self.max_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        pids = process_tree(self.root)
        last_tree = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last_tree > 5:
                pids, last_tree = process_tree(self.root), time.monotonic()
            self.max_kib = max(self.max_kib, tree_kib(pids, "VmRSS"))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


class ServerStartError(RuntimeError):
    def __init__(self, message: str, log_tail: str):
        super().__init__(message)
        self.log_tail = log_tail


_next_port = [21000 + (os.getpid() * 37) % 6000]


def free_port() -> int:
    """A free port below the ephemeral range; consecutive calls are 20 apart
    (SGLang derives internal ports from the server port)."""
    for _ in range(2000):
        port = _next_port[0]
        _next_port[0] = 21000 + (port - 21000 + 20) % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM it when the benchmark process dies
    (Linux PR_SET_PDEATHSIG), so a killed benchmark leaves no server behind
    (SGLang's launcher takes its scheduler and detokenizer down on SIGTERM)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Server:
    """`sglang-dflash serve ARGS` (python -m sglang_dflash.cli serve) in its own
    process group; `stop()` ends the whole group."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None, log_path: str):
        self.name, self.args, self.log_path = name, list(args), log_path
        self.extra_env = dict(env or {})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def command(self) -> list[str]:
        return ["sglang-dflash", "serve", *self.args]

    def launch(self) -> None:
        env = {**os.environ, **self.extra_env}
        cmd = [sys.executable, "-m", "sglang_dflash.cli", "serve", *self.args,
               "--port", str(self.port), "--host", "127.0.0.1"]
        self._log = open(self.log_path, "w")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=_term_with_parent)

    def wait_healthy(self, timeout: float = 600) -> None:
        """Until GET /health_generate answers 200; ServerStartError (with the log
        tail) if the process exits or the timeout passes."""
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"server exited with status {self.proc.returncode} during start-up")
            try:
                if requests.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    self.startup_s = time.monotonic() - self._t0
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self._fail(f"server did not become healthy in {timeout:.0f}s")

    def start(self, timeout: float = 600) -> None:
        self.launch()
        self.wait_healthy(timeout)

    def _fail(self, message: str):
        self.stop()
        raise ServerStartError(message, self.log_tail())

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid) if self.alive() else []

    def server_info(self) -> dict:
        import requests

        # /server_info (SGLang 0.5.23; /get_server_info is its deprecated alias).
        resp = requests.get(self.url + "/server_info", timeout=60)
        if resp.status_code == 404:
            resp = requests.get(self.url + "/get_server_info", timeout=60)
        return resp.json()

    def flush_cache(self) -> None:
        import requests

        requests.post(self.url + "/flush_cache", timeout=120)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        # Children that outlived the leader (same process group).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if getattr(self, "_log", None):
            self._log.close()


def first_error_line(log_tail: str) -> str:
    """The most telling line of a failed start-up log: the last exception line."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln) and not ln.startswith("File "):
            return ln[:400]
    return lines[-1][:400] if lines else "(empty log)"


def write_json(path: str, obj, compact: bool = False) -> None:
    with open(path, "w") as f:
        if compact:
            json.dump(obj, f, separators=(",", ":"))
        else:
            json.dump(obj, f, indent=1)
        f.write("\n")


def command_line(script: str, argv=None) -> str:
    """The command as typed from the repository root: `script` (repo-relative)
    with `argv`, or, for argv None, this process's own command line."""
    if argv is None:
        return "python " + shlex.join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO),
                                       *sys.argv[1:]])
    return "python " + shlex.join([script, *argv])


def repo_relative(text: str) -> str:
    """Paths inside the repository shown relative to its root (commands run from there)."""
    return text.replace(REPO + os.sep, "")
