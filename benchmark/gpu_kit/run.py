#!/usr/bin/env python
"""GPU kit: serve plain and DFLASH with SGLang 0.5.23 on the lent H200, in one call.

    python3 benchmark/gpu_kit/run.py              # on the device (CUDA): the full run
    python  benchmark/gpu_kit/run.py --dry-run    # here (no CUDA): CPU engine, tiny sizes

From the repo root. Steps, each recorded in $OUT/kit.json (rewritten after every
step, so a run cut off by its limit still returns what it finished):

1. setup: install benchmark/gpu_kit/wheels/*.whl offline into a --target dir
   (when sglang is not importable), register our plugin's entry point with a
   minimal dist-info (no pip build), put the IPython stub on the path if IPython
   is missing, and choose sgl_kernel: on CUDA the kit's overlay
   (benchmark/gpu_kit/overlay: our stand-in + torch versions of the CUDA ops),
   on CPU our stand-in through `sglang-dflash serve`'s CPU set-up.
2. overlay self-test (CUDA): each overlay op against a torch reference on
   CUDA tensors, and SGLang's own modules imported in one process.
3. models: the demo pair (assets/demo) and a random-weight Qwen3 target of
   ~1.7B parameters with a random DFlash 2 drafter, made on the device.
4. for each model, plain then DFLASH: start `sglang-dflash serve` (which runs
   `python -m sglang.launch_server`; on CUDA with --attention-backend triton
   --sampling-backend pytorch), greedy outputs of a few prompts, then
   closed-loop timing at concurrency 1 / 8 / 32 (fixed output lengths,
   ignore_eos), then stop. If a server fails to start with CUDA graphs, it is
   retried once with --disable-cuda-graph.
5. last, if time remains: the demo pair's DFLASH server with speculation off
   (every decode step a one-row verify replaying the graphs the worker
   captured for W = 0, adapter/one_row_verify.py), greedy outputs, then
   timing at c1 / c8 (against plain's cells: what an off step costs).
6. greedy identity (plain vs each DFLASH server, per prompt) and a table.

Writes kit.json, kit.md, servers.log (each server's log tail) and
sgl_kernel.log (the sgl_kernel names SGLang asked the overlay for) to $OUT
(else ./gpu_kit_out). Exit status 1 if a server never started, a timing cell
failed, or the demo pair's greedy outputs differ.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY_DIR = os.path.join(REPO, "python")
WHEELS = os.path.join(HERE, "wheels")
OVERLAY = os.path.join(HERE, "overlay")
STUBS = os.path.join(HERE, "stubs")
STANDIN = os.path.join(PY_DIR, "sglang_dflash", "cpu_runtime")
DEMO_TARGET = os.path.join(PY_DIR, "sglang_dflash", "assets", "demo", "target")
DEMO_DRAFTER = os.path.join(PY_DIR, "sglang_dflash", "assets", "demo", "drafter")

# A Qwen3-1.7B-shaped target (28 layers, hidden 2048, vocab 151,936: 2.0B
# parameters with the untied head) and a 5-layer DFlash 2 drafter for it.
BIG = dict(hidden=2048, inter=6144, layers=28, heads=16, kv_heads=8, head_dim=128,
           vocab=151_936, draft_layers=5, block=8, rank=256, top_k=16, max_pos=4096)
# The dry run's stand-in: vocab 5000 > the demo tokenizer's 4096, as the big
# pair's 151,936 is, so --skip-tokenizer-init with a larger model vocab runs here
# too. Taps [0, 2] as the demo pair: the default for 4 target layers and 2 draft
# layers is [1, 1], which the worker cannot serve (README, GPU_CHECK.md).
TINY = dict(hidden=64, inter=128, layers=4, heads=4, kv_heads=2, head_dim=16,
            vocab=5000, draft_layers=2, block=8, rank=8, top_k=16, max_pos=512,
            target_layer_ids=[0, 2])

GPU_PLAN = dict(concurrency=(1, 8, 32), requests_per_client=2, min_requests=4,
                new_tokens=dict(demo=256, big=256), identity_prompts=4, identity_tokens=96,
                start_timeout=300, request_timeout=180)
DRY_PLAN = dict(concurrency=(1, 4), requests_per_client=1, min_requests=2,
                new_tokens=dict(demo=24, big=16), identity_prompts=2, identity_tokens=16,
                start_timeout=900, request_timeout=600)

DEMO_QUESTIONS = [
    "What is 7 times 8?",
    "Write a python function that returns the sum of a list of numbers.",
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "Tell me about your favourite book.",
    "def fibonacci(n):",
    "A train travels 60 miles in 1.5 hours. What is its speed?",
]
CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"

T0 = time.time()


def log(msg: str) -> None:
    print(f"[kit {time.time() - T0:6.1f}s] {msg}", flush=True)


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


class Report:
    def __init__(self, out: str, dry: bool, budget_s: float):
        self.out, self.path = out, os.path.join(out, "kit.json")
        self.data = {"dry_run": dry, "budget_s": budget_s, "started": time.time(), "steps": [],
                     "servers": [], "cells": [], "identity": [], "errors": []}

    def step(self, name: str, **info) -> None:
        self.data["steps"].append({"step": name, "t": round(time.time() - T0, 1), **info})
        self.save()

    def error(self, where: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__))
        log(f"ERROR in {where}: {text.strip().splitlines()[-1] if text.strip() else text}")
        self.data["errors"].append({"where": where, "error": text[-4000:]})
        self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.time() - T0, 1)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------


def _importable(module: str, env: dict) -> bool:
    code = f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


def _entry_point_registered(env: dict) -> bool:
    code = ("import importlib.metadata as m,sys; sys.exit(0 if any(e.name=='sglang_dflash' for e in "
            "m.entry_points(group='sglang.srt.plugins')) else 1)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


def setup(args, report: Report) -> dict:
    """The environment every server (and the self-test) runs with."""
    env = dict(os.environ)
    on_cuda = not args.dry_run
    site = args.site
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    info: dict = {"cuda": on_cuda, "python": sys.version.split()[0]}

    install = args.install
    wheels = sorted(f for f in os.listdir(WHEELS) if f.endswith(".whl")) if os.path.isdir(WHEELS) else []
    if install == "auto":
        install = "yes" if wheels and not _importable("sglang", env) else "no"
    info["install"] = install
    if install == "yes":
        if not wheels:
            raise RuntimeError(f"--install yes but no wheels in {WHEELS} (run fetch_wheels.py)")
        t = time.time()
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--no-cache-dir", "--upgrade", "--target", site,
               *[os.path.join(WHEELS, w) for w in wheels]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("pip install of the kit's wheels failed:\n" + proc.stdout[-2000:]
                               + proc.stderr[-3000:])
        info["install_s"] = round(time.time() - t, 1)
        info["wheels"] = len(wheels)
        paths.append(site)

    # sgl_kernel first: the overlay on CUDA; on CPU `sglang-dflash serve` puts the
    # stand-in first itself (cpu_runtime.cpu_env), so the CPU path is the CLI's own.
    front = [OVERLAY] if on_cuda else []
    paths = front + [p for p in paths if p not in front] + [PY_DIR]
    env["PYTHONPATH"] = os.pathsep.join(paths)

    if not _entry_point_registered(env):
        dist = os.path.join(site, "sglang_dflash-0.1.0.dist-info")
        os.makedirs(dist, exist_ok=True)
        with open(os.path.join(dist, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: sglang-dflash\nVersion: 0.1.0\n")
        with open(os.path.join(dist, "entry_points.txt"), "w") as f:
            f.write("[sglang.srt.plugins]\nsglang_dflash = sglang_dflash.adapter.plugin:register\n")
        if site not in paths:
            paths.append(site)
            env["PYTHONPATH"] = os.pathsep.join(paths)
        info["entry_point"] = "written to " + dist
    else:
        info["entry_point"] = "installed"
    if not _importable("IPython", env):
        paths.append(STUBS)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        info["ipython"] = "stub"

    env.update({
        # The bundled Rust radix-tree core is built against torch 2.14's ABI: on
        # torch 2.11 it misreads tensor dtypes ("insert value must be an int64
        # tensor, got ComplexFloat"). The Python tree core is SGLang's fallback.
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
        "KIT_SGL_KERNEL_LOG": os.path.join(args.out, "sgl_kernel.log"),
    })
    if on_cuda:
        env.update({
            # engine.py asserts the `sglang-kernel` distribution's version on CUDA.
            "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
            # BaseFusedOp layers (RMSNorm, rotary, SiluAndMul...) run forward_native
            # instead of sgl_kernel AOT / JIT / flashinfer kernels.
            "SGLANG_FORCE_FUSED_OP_BACKEND": args.fused_op_backend,
            "SGLANG_JIT_CACHE_DIR": os.path.join(args.work, "jit"),
        })
        if args.fused_op_backend == "auto":
            env.pop("SGLANG_FORCE_FUSED_OP_BACKEND")
    info["PYTHONPATH"] = env["PYTHONPATH"]
    info["env"] = {k: env[k] for k in sorted(env) if k.startswith(("SGLANG_", "KIT_"))}
    report.data["setup"] = info
    report.step("setup", **{k: v for k, v in info.items() if k in ("install", "install_s", "ipython")})
    return env


def versions(env: dict) -> dict:
    code = ("import json,importlib.metadata as m\nout={}\n"
            "for n in ('torch','triton','transformers','sglang','xgrammar','pydantic','fastapi'):\n"
            "  try: out[n]=m.version(n)\n  except Exception as e: out[n]=None\n"
            "import torch\nout['cuda']=torch.version.cuda\n"
            "out['gpu']=torch.cuda.get_device_name() if torch.cuda.is_available() else None\n"
            "print(json.dumps(out))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception:
        return {"error": proc.stderr[-1000:]}


def selftest(env: dict, report: Report, dry: bool) -> bool:
    """Overlay ops against references on the run's device, and SGLang's modules
    imported in one process with the run's sys.path."""
    script = os.path.join(HERE, "selftest.py")
    cmd = [sys.executable, script] + (["--cpu"] if dry else [])
    sub_env = dict(env)
    if dry:  # import the overlay on CPU too: its ops are device-agnostic
        sub_env["PYTHONPATH"] = os.pathsep.join([OVERLAY, env["PYTHONPATH"]])
    proc = subprocess.run(cmd, env=sub_env, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    ok = proc.returncode == 0
    report.data["selftest"] = {"ok": ok, "stdout": lines[-40:], "stderr": proc.stderr[-3000:]}
    report.step("selftest", ok=ok)
    for line in lines[-25:]:
        log("  " + line)
    if not ok:
        log("selftest FAILED: " + (proc.stderr.strip().splitlines() or ["?"])[-1])
    return ok


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def make_random_pair(root: str, dims: dict, device: str) -> tuple[str, str]:
    """A random-weight Qwen3 target and a random DFlash 2 drafter for it, written
    as safetensors checkpoints under `root` (weights drawn on `device`)."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, PY_DIR)
    from sglang_dflash.config import build_target_layer_ids, parse_drafter_config
    from sglang_dflash.model import DFlashDrafter
    from sglang_dflash.tools.random_target import Qwen3Shape, write_random_qwen3

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    dname = "bfloat16" if device == "cuda" else "float32"
    gen = torch.Generator(device=device).manual_seed(0)
    target_dir, drafter_dir = os.path.join(root, "target"), os.path.join(root, "drafter")
    os.makedirs(target_dir, exist_ok=True)
    os.makedirs(drafter_dir, exist_ok=True)
    h, inter, hd = dims["hidden"], dims["inter"], dims["head_dim"]
    nh, nkv, vocab, L = dims["heads"], dims["kv_heads"], dims["vocab"], dims["layers"]

    target_shape = Qwen3Shape(vocab=vocab, hidden=h, layers=L, heads=nh, kv_heads=nkv, head_dim=hd,
                       inter=inter, max_pos=dims["max_pos"])
    # The demo tokenizer: servers of this pair run with --skip-tokenizer-init and
    # token ids, but SGLang still reads the tokenizer config at start-up.
    n_target = write_random_qwen3(target_dir, target_shape, seed=0, dtype=dtype, device=device,
                                  tokenizer_from=DEMO_TARGET)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    n_draft = dims["draft_layers"]
    drafter_cfg = {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "attention_bias": False,
        "block_size": dims["block"], "head_dim": hd, "hidden_act": "silu", "hidden_size": h,
        "intermediate_size": inter, "max_position_embeddings": dims["max_pos"],
        "num_attention_heads": nh, "num_hidden_layers": n_draft, "num_key_value_heads": nkv,
        "num_target_layers": L, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "torch_dtype": dname, "vocab_size": vocab,
        "dflash_config": {
            "block_size": dims["block"], "conv_group_size": 16, "conv_kernel_size": 2,
            "mask_token": "<|MASK|>", "mask_token_id": 3, "selector_rank": dims["rank"],
            "selector_top_k": dims["top_k"],
            "target_layer_ids": list(dims.get("target_layer_ids")
                                     or build_target_layer_ids(L, n_draft)),
        },
    }
    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), k) for k, v in
                  DFlashDrafter(parse_drafter_config(drafter_cfg)).state_dict().items()}
    dtensors = {}
    for name, (shape, _) in shapes.items():
        if name.endswith("norm.weight"):
            dtensors[name] = ones(shape[0]) + rnd(*shape, std=0.1)
        elif name.endswith("base_kernel"):
            dtensors[name] = rnd(*shape, std=0.2)
        elif "codebook" in name:
            dtensors[name] = rnd(*shape, std=0.5)
        else:
            dtensors[name] = rnd(*shape, std=(1.0 / shape[-1]) ** 0.5)
    save_file({k: v.contiguous().cpu() for k, v in dtensors.items()},
              os.path.join(drafter_dir, "model.safetensors"))
    with open(os.path.join(drafter_dir, "config.json"), "w") as f:
        json.dump(drafter_cfg, f, indent=2)
    n_drafter = sum(t.numel() for t in dtensors.values())
    log(f"random pair: target {n_target / 1e9:.2f}B params, drafter {n_drafter / 1e6:.0f}M "
        f"({dname}) in {root}")
    return target_dir, drafter_dir


# ---------------------------------------------------------------------------
# Servers and clients
# ---------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(port: int, method: str, path: str, body=None, timeout: float = 60.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {raw[:500]!r}")
        return json.loads(raw) if raw else None
    finally:
        conn.close()


class Server:
    def __init__(self, name: str, args: list[str], env: dict, log_dir: str):
        self.name, self.args, self.env = name, args, env
        self.port = _free_port()
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc = None

    def start(self, timeout: float) -> float:
        cmd = [sys.executable, "-m", "sglang_dflash.cli", "serve", *self.args,
               "--host", "127.0.0.1", "--port", str(self.port)]
        self.cmd = cmd
        t = time.time()
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        while time.time() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up")
            try:
                http_json(self.port, "GET", "/model_info", timeout=5)
                return time.time() - t
            except Exception:
                time.sleep(1.0)
        raise TimeoutError(f"server not ready after {timeout:.0f}s")

    def tail(self, n: int = 80) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [ln for ln in f.read().splitlines() if "server_args=" not in ln]
            return "\n".join(lines[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except Exception:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except Exception:
                pass
        finally:
            self.log_file.close()


def payload(prompt, new_tokens: int) -> dict:
    body = {"sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                                "ignore_eos": True}}
    if isinstance(prompt, str):
        body["text"] = prompt
    else:
        body["input_ids"] = prompt
    return body


def output_ids(reply: dict) -> list:
    if "output_ids" in reply:
        return list(reply["output_ids"])
    raise RuntimeError(f"reply has no output_ids: {str(reply)[:300]}")


def run_identity(port: int, prompts: list, new_tokens: int, timeout: float) -> list:
    return [output_ids(http_json(port, "POST", "/generate", payload(p, new_tokens), timeout))
            for p in prompts]


def run_cell(port: int, prompts: list, concurrency: int, n_requests: int, new_tokens: int,
             timeout: float) -> dict:
    """Closed loop: `concurrency` clients, each sends its next request when the
    previous one returns, until n_requests have been sent."""
    lock, results, errors = threading.Lock(), [], []
    counter = iter(range(n_requests))

    def client():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t = time.time()
            try:
                reply = http_json(port, "POST", "/generate",
                                  payload(prompts[i % len(prompts)], new_tokens), timeout)
                meta = reply.get("meta_info", {})
                with lock:
                    results.append({"latency": time.time() - t,
                                    "tokens": int(meta.get("completion_tokens", 0)),
                                    "verify_ct": meta.get("spec_verify_ct"),
                                    "accept_len": meta.get("spec_accept_length")})
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e)[:300])

    t0 = time.time()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - t0
    tokens = sum(r["tokens"] for r in results)
    verify = [r["verify_ct"] for r in results if r["verify_ct"]]
    cell = {"concurrency": concurrency, "requests": len(results), "errors": errors[:5],
            "wall_s": round(wall, 3), "tokens": tokens,
            "tok_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "mean_latency_s": round(statistics.mean(r["latency"] for r in results), 3) if results else None}
    if verify:
        # Committed tokens per verify step over all requests (bonus included).
        cell["accept_len"] = round(sum(r["tokens"] for r in results if r["verify_ct"]) / sum(verify), 3)
        cell["verify_steps"] = sum(verify)
    return cell


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def server_args(model: str, mode: str, paths: dict, dry: bool, cuda_graph: bool) -> list[str]:
    target, drafter = paths[model]
    args = ["--model-path", target, "--random-seed", "0", "--log-level", "info"]
    if model == "big":
        args += ["--skip-tokenizer-init"]  # token ids in and out: the vocab is not the tokenizer's
    if not dry:
        args += ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                 "--mem-fraction-static", "0.6", "--cuda-graph-max-bs-decode", "32",
                 # no prefill graphs: their capture (up to 4096 tokens) costs start-up time
                 "--cuda-graph-backend-prefill", "disabled",
                 "--dtype", "float32" if model == "demo" else "bfloat16"]
        if not cuda_graph:
            args += ["--disable-cuda-graph"]
    if mode.startswith("dflash"):
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
    return args


def prompts_for(model: str, n: int) -> list:
    if model == "demo":
        return [CHAT.format(q=q) for q in (DEMO_QUESTIONS * 4)[:max(n, len(DEMO_QUESTIONS))]]
    import random

    rng = random.Random(0)
    # Token ids of the demo tokenizer's range, lengths 32-96.
    return [[rng.randrange(10, 4000) for _ in range(rng.randrange(32, 97))] for _ in range(max(n, 6))]


def serve_and_measure(model, mode, paths, env, plan, args, report) -> dict | None:
    """One server: start (CUDA graphs, then without on failure), identity, cells.
    Mode dflash-off (speculation off: every decode step a one-row verify on
    the graphs captured for W = 0) times the first two concurrencies only."""
    name = f"{model}-{mode}"
    senv = dict(env)
    if mode == "dflash" and model == "big" and args.big_policy:
        senv["SGLANG_DFLASH_POLICY"] = args.big_policy
    if mode == "dflash-off":
        senv["SGLANG_DFLASH_POLICY"] = '{"mode": "off"}'
    attempts = [True, False] if not args.dry_run else [True]
    server, started = None, None
    for cuda_graph in attempts:
        if time.time() - T0 > args.budget_s - 60:
            report.error(name, "skipped: time budget")
            return None
        server = Server(name + ("" if cuda_graph else "-nograph"),
                        server_args(model, mode, paths, args.dry_run, cuda_graph), senv, args.logs)
        log(f"start {server.name}")
        entry = {"server": server.name, "model": model, "mode": mode, "cuda_graph": cuda_graph}
        try:
            started = server.start(plan["start_timeout"])
            entry.update(ok=True, start_s=round(started, 1), cmd=" ".join(server.cmd))
            report.data["servers"].append(entry)
            report.step("started " + server.name, start_s=round(started, 1))
            break
        except Exception as e:  # noqa: BLE001
            entry.update(ok=False, error=repr(e), log_tail=server.tail(120),
                         cmd=" ".join(getattr(server, "cmd", [])))
            report.data["servers"].append(entry)
            report.error(f"start {server.name}", f"{e!r}\n{server.tail(40)}")
            server.stop()
            _append_log(args, server)
            server = None
    if server is None:
        return None
    result = {"model": model, "mode": mode, "server": server.name}
    try:
        prompts = prompts_for(model, plan["identity_prompts"])
        t = time.time()
        result["identity_outputs"] = run_identity(server.port, prompts[:plan["identity_prompts"]],
                                                  plan["identity_tokens"], plan["request_timeout"])
        report.step(f"identity {name}", s=round(time.time() - t, 1))
        for c in plan["concurrency"] if mode != "dflash-off" else plan["concurrency"][:2]:
            remaining = args.budget_s - (time.time() - T0)
            if remaining < 45:
                report.error(f"{name} c{c}", "skipped: time budget")
                continue
            n = max(plan["min_requests"], plan["requests_per_client"] * c)
            try:
                cell = run_cell(server.port, prompts, c, n, plan["new_tokens"][model],
                                min(plan["request_timeout"], remaining - 15))
            except Exception as e:  # noqa: BLE001
                report.error(f"{name} c{c}", e)
                continue
            cell.update(model=model, mode=mode)
            report.data["cells"].append(cell)
            report.step(f"cell {name} c{c}", tok_per_s=cell["tok_per_s"])
            log(f"{name} c{c}: {cell['tok_per_s']} tok/s, {cell['requests']} req, "
                f"accept {cell.get('accept_len')}, errors {len(cell['errors'])}")
        if mode.startswith("dflash"):  # the worker's state: static draft step captured or not, policy
            info = http_json(server.port, "GET", "/get_server_info", timeout=30)
            state = (info.get("internal_states") or [{}])[0].get("dflash") or {}
            result["dflash_state"] = {k: state.get(k) for k in ("static_draft", "one_row_verify", "policy",
                                                                "steps")}
            report.step(f"state {name}", static_draft=state.get("static_draft"),
                        one_row_verify=state.get("one_row_verify"))
    except Exception as e:  # noqa: BLE001
        report.error(name, e)
    finally:
        server.stop()
        result["log_tail"] = server.tail(30)
        _append_log(args, server)
    return result


def _append_log(args, server: Server) -> None:
    with open(os.path.join(args.out, "servers.log"), "a") as f:
        f.write(f"===== {server.name}: {' '.join(getattr(server, 'cmd', []))}\n")
        f.write(server.tail(150) + "\n")


def compare(results: dict, report: Report) -> bool:
    ok = True
    for model, mode in (("demo", "dflash"), ("big", "dflash"), ("demo", "dflash-off")):
        plain, spec = results.get((model, "plain")), results.get((model, mode))
        if not plain or not spec or "identity_outputs" not in plain or "identity_outputs" not in spec:
            continue
        rows = []
        for i, (a, b) in enumerate(zip(plain["identity_outputs"], spec["identity_outputs"])):
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if first is None and len(a) != len(b):
                first = min(len(a), len(b))
            rows.append({"prompt": i, "identical": first is None, "first_diff": first,
                         "len": [len(a), len(b)]})
        same = all(r["identical"] for r in rows)
        report.data["identity"].append({"model": model, "mode": mode, "identical": same,
                                        "prompts": rows})
        log(f"greedy identity {model} {mode}: {'IDENTICAL' if same else 'DIFFERENT'} "
            f"({sum(r['identical'] for r in rows)}/{len(rows)} prompts)")
        if model == "demo" and not same:
            ok = False
    report.save()
    return ok


def write_markdown(report: Report) -> str:
    d = report.data
    lines = ["# GPU kit run", "",
             f"dry run: {d['dry_run']}; elapsed {d.get('elapsed_s')} s; versions: {d.get('versions')}", ""]
    lines += ["| server | start s | cuda graph | ok |", "|---|---|---|---|"]
    for s in d["servers"]:
        lines.append(f"| {s['server']} | {s.get('start_s', '-')} | {s['cuda_graph']} | {s['ok']} |")
    lines += ["", "| model | c | plain tok/s | DFLASH tok/s | speed-up | DFLASH accept len | off / plain |",
              "|---|---|---|---|---|---|---|"]
    cells = {(c["model"], c["mode"], c["concurrency"]): c for c in d["cells"]}
    for model in ("demo", "big"):
        for c in sorted({k[2] for k in cells if k[0] == model}):
            p, s = cells.get((model, "plain", c)), cells.get((model, "dflash", c))
            off = cells.get((model, "dflash-off", c))
            pt = p["tok_per_s"] if p else None
            st = s["tok_per_s"] if s else None
            sp = f"{st / pt:.2f}x" if pt and st else "-"
            op = f"{off['tok_per_s'] / pt:.2f}x" if pt and off and off["tok_per_s"] else "-"
            lines.append(f"| {model} | {c} | {pt or '-'} | {st or '-'} | {sp} | "
                         f"{(s or {}).get('accept_len', '-')} | {op} |")
    lines += [""]
    for ident in d["identity"]:
        lines.append(f"greedy identity {ident['model']} {ident['mode']}: {ident['identical']} "
                     f"({sum(r['identical'] for r in ident['prompts'])}/{len(ident['prompts'])})")
    if d["errors"]:
        lines += ["", "errors:"] + [f"- {e['where']}: {e['error'].strip().splitlines()[-1][:300]}"
                                    for e in d["errors"] if e["error"].strip()]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(report.out, "kit.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU engine, tiny sizes")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_kit_out")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gpu_kit"))
    parser.add_argument("--site", default=None, help="pip --target dir (default WORK/site)")
    parser.add_argument("--install", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting work after this many seconds (GPU 540, dry run 3000)")
    parser.add_argument("--models", default="demo,big")
    parser.add_argument("--fused-op-backend", default="torch",
                        help="SGLANG_FORCE_FUSED_OP_BACKEND on CUDA ('auto' leaves SGLang's choice)")
    parser.add_argument("--big-policy", default='{"mode": "on"}',
                        help="SGLANG_DFLASH_POLICY for the random pair (acceptance is meaningless "
                             "there; 'on' times always-on speculation); '' for the default")
    parser.add_argument("--skip-selftest", action="store_true")
    args = parser.parse_args(argv)
    if not args.dry_run and not cuda_available():
        print("no CUDA device: use --dry-run", file=sys.stderr)
        return 2
    args.budget_s = args.budget_s or (3000.0 if args.dry_run else 540.0)
    args.site = args.site or os.path.join(args.work, "site")
    args.logs = os.path.join(args.work, "logs")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.logs, exist_ok=True)
    for name in ("servers.log", "sgl_kernel.log"):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    report = Report(args.out, args.dry_run, args.budget_s)
    report.data["plan"] = plan
    failed = False
    try:
        env = setup(args, report)
        report.data["versions"] = versions(env)
        log(f"versions: {report.data['versions']}")
        if not args.skip_selftest and not selftest(env, report, args.dry_run):
            failed = True  # recorded; the servers still run: their logs say more
        paths = {"demo": (DEMO_TARGET, DEMO_DRAFTER)}
        models = [m for m in args.models.split(",") if m]
        if "big" in models:
            try:
                t = time.time()
                dims = TINY if args.dry_run else BIG
                code = (f"import sys; sys.path.insert(0, {HERE!r}); import run; "
                        f"print(run.make_random_pair({os.path.join(args.work, 'big')!r}, {dims!r}, "
                        f"{'cpu' if args.dry_run else 'cuda'!r}))")
                proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                      text=True, timeout=300)
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr[-3000:])
                print(proc.stdout.strip().splitlines()[0], flush=True)
                paths["big"] = (os.path.join(args.work, "big", "target"),
                                os.path.join(args.work, "big", "drafter"))
                report.step("random pair", s=round(time.time() - t, 1), dims=dims)
            except Exception as e:  # noqa: BLE001
                report.error("random pair", e)
                models.remove("big")
        results = {}
        for model in models:
            for mode in ("plain", "dflash"):
                r = serve_and_measure(model, mode, paths, env, plan, args, report)
                if r is None:
                    failed = True
                    continue
                results[(model, mode)] = r
                report.data.setdefault("runs", []).append(
                    {k: v for k, v in r.items() if k != "identity_outputs"})
        if "demo" in models:  # last: identity of the off path, if time remains
            r = serve_and_measure("demo", "dflash-off", paths, env, plan, args, report)
            if r is None:
                failed = True
            else:
                results[("demo", "dflash-off")] = r
        if not compare(results, report):
            failed = True
        expected = {(m, md, c) for m in models for md in ("plain", "dflash") for c in plan["concurrency"]}
        got = {(c["model"], c["mode"], c["concurrency"]) for c in report.data["cells"] if not c["errors"]}
        if expected - got:
            failed = True
            report.data["missing_cells"] = sorted(expected - got)
    except Exception as e:  # noqa: BLE001
        report.error("main", e)
        failed = True
    report.data["ok"] = not failed
    report.save()
    print(write_markdown(report))
    print("KIT RUN OK" if not failed else "KIT RUN INCOMPLETE (see kit.json errors)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
