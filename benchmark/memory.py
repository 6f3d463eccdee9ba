"""Peak memory of plain decoding against DFLASH (issue #35, item 2).

    python benchmark/memory.py                          # batch 1, 16, 48; 2048-token prompts
    python benchmark/memory.py --batch-sizes 1,4 --prompt-tokens 256 --new-tokens 8   # quick look
    python benchmark/memory.py --from-json benchmark/results/memory/memory.json      # re-render
    python benchmark/memory.py --code-from-head --update-baseline   # as recorded in BASELINE.md

`--code-from-head` serves the package as committed (a `git archive HEAD` copy
first on the servers' PYTHONPATH) when the working tree holds others' edits;
`--update-baseline` rewrites only the Memory section of benchmark/BASELINE.md.

The criterion: at every batch size, the DFLASH server's peak RSS is at most
(plain's peak + the drafter's weight bytes + the drafter context pool the
worker logs at start-up) x 1.10.

* Models (made once, cached in `--models`, default results/memory/models):
  a random-weight Qwen3 target with Qwen's 151,936-token vocabulary, small
  elsewhere (hidden 256, 4 layers, 4 / 2 heads of 64, FFN 768, untied head,
  max positions 4096; 80M parameters, 78% of them the embedding and the head)
  so that it runs on 2 cores, and a random DFlash 2 drafter for it (1 layer,
  block 8, taps [1, 2], selector rank 16 / top-K 16) made with the package's
  own `DFlashDrafter` and `save_drafter`; the worker's strict loader checks it
  at start-up. Float32: the CPU engine's tested dtype (`sglang-dflash serve`
  runs a float32 checkpoint in float32; every CPU number in this repository is
  float32), and the logits, the vocabulary-sized tensors this benchmark is
  about, are float32 in either dtype. No tokenizer of that size exists here:
  the servers run with --skip-tokenizer-init and take token ids (the demo
  tokenizer's files sit next to the target only because SGLang reads them at
  start-up).
* One fresh `sglang-dflash serve` per mode (benchmark/common.py's `Server`),
  one after the other: plain (no speculation), then DFLASH with the drafter
  and the policy always on (`SGLANG_DFLASH_POLICY={"mode": "on"}`, the test
  harness's default too), so the drafter drafts and the target verifies the
  whole block at every decode step, the most memory a step takes.
* Per batch size b: flush the cache, reset VmHWM of the server's process tree
  (/proc/<pid>/clear_refs), send b concurrent /generate requests of
  `--prompt-tokens` random token ids (distinct per request and batch, so no
  prefix is shared) with `--new-tokens` new tokens (greedy, ignore_eos), and
  read the tree's summed VmHWM (also the max of the sampled summed VmRSS).
  Batches run in increasing size on the same server, so pages touched by an
  earlier batch (KV pool rows, allocator caches) stay resident: the peak at b
  is the process's peak up to and including that batch, as a server's would be.
* Drafter bytes: the tensor bytes in the drafter's safetensors files (its
  header's offsets). Pool bytes: slots x bytes per slot from the worker's log
  line "drafter context pool N slots x S B = ... MiB".

Writes `--out`/memory.json (settings, machine, versions, per mode and batch:
peaks, per-process peaks, idle RSS before each batch, request timings) and
memory.md (the table). Stdlib only at import time (the unit tests import it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
from common import MIB, RESULTS_DIR, Server, ServerStartError, write_json  # noqa: E402

DEFAULT_OUT = os.path.join(RESULTS_DIR, "memory")
BASELINE_MD = os.path.join(HERE, "BASELINE.md")
SLACK = 0.10
POLICY_ON = '{"mode": "on"}'
DEMO_TARGET = os.path.join(common.REPO, "python", "sglang_dflash", "assets", "demo", "target")

# The synthetic pair. Qwen3's vocabulary; everything else small enough for 2 cores.
DIMS = dict(vocab=151_936, hidden=256, inter=768, layers=4, heads=4, kv_heads=2, head_dim=64,
            max_pos=4096, rope_theta=1_000_000.0, eos=2, pad=0,
            draft_layers=1, block=8, target_layer_ids=[1, 2], conv_kernel=2, conv_group=16,
            selector_rank=16, selector_top_k=16, mask_token_id=3, dtype="float32", seed=0)

_POOL_RE = re.compile(r"drafter context pool (\d+) slots x (\d+) B = ([0-9.]+) MiB"
                      r"(?: \(SGLang's KV budget counts (\S+) B/token for it\))?")
_RUNNING_RE = re.compile(r"Decode batch[^,]*, #running-req: (\d+)")


def log(msg: str) -> None:
    print(f"[memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------
# Pure parts (unit-tested)
# ---------------------------------------------------------------------------


def parse_context_pool(text: str) -> dict | None:
    """The worker's start-up line about the drafter context pool, parsed:
    {"slots", "bytes_per_slot", "bytes", "logged_mib", "budget_counted"} (the
    last line if it appears more than once), or None if the log has none."""
    matches = list(_POOL_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    slots, per_slot = int(m.group(1)), int(m.group(2))
    counted = m.group(4)
    return {"slots": slots, "bytes_per_slot": per_slot, "bytes": slots * per_slot,
            "logged_mib": float(m.group(3)),
            "budget_counted": int(counted) if counted and counted.isdigit() else None}


def max_running_requests(text: str) -> int | None:
    """The largest `#running-req` of SGLang's "Decode batch" log lines in `text`."""
    values = [int(v) for v in _RUNNING_RE.findall(text)]
    return max(values) if values else None


def safetensors_tensor_bytes(path: str) -> int:
    """Bytes of the tensor data in one safetensors file, from its header
    (8-byte little-endian header length, then a JSON of name -> data_offsets)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(int(v["data_offsets"][1]) - int(v["data_offsets"][0])
               for k, v in header.items() if k != "__metadata__")


def drafter_weight_bytes(drafter_dir: str) -> int:
    """Tensor bytes of every *.safetensors file in the drafter's directory,
    plus mask_embedding.pt's file size if there is one (a few KiB at most)."""
    total = 0
    for name in sorted(os.listdir(drafter_dir)):
        path = os.path.join(drafter_dir, name)
        if name.endswith(".safetensors"):
            total += safetensors_tensor_bytes(path)
        elif name == "mask_embedding.pt":
            total += os.path.getsize(path)
    return total


def check_bound(plain_peak_bytes: float, dflash_peak_bytes: float, drafter_bytes: float,
                pool_bytes: float, slack: float = SLACK) -> dict:
    """dflash peak <= (plain peak + drafter weights + context pool) x (1 + slack)."""
    bound = (plain_peak_bytes + drafter_bytes + pool_bytes) * (1.0 + slack)
    return {"bound_bytes": bound, "ok": dflash_peak_bytes <= bound,
            "excess_bytes": dflash_peak_bytes - bound,
            "dflash_minus_plain_bytes": dflash_peak_bytes - plain_peak_bytes}


def kv_tokens_needed(max_batch: int, prompt_tokens: int, new_tokens: int, block: int) -> int:
    """--max-total-tokens for max_batch requests at once: prompt + new tokens +
    two blocks of verify headroom each, x 1.25, rounded up to 1024."""
    need = max_batch * (prompt_tokens + new_tokens + 2 * block) * 1.25
    return int(math.ceil(need / 1024) * 1024)


def make_prompts(count: int, length: int, vocab: int, seed: int, avoid=(0, 1, 2, 3)) -> list:
    """`count` lists of `length` random token ids in [0, vocab), none in `avoid`
    (pad / eos / mask ids of the synthetic pair); deterministic in `seed`."""
    rng = random.Random(seed)
    avoid = set(avoid)
    out = []
    for _ in range(count):
        ids = []
        while len(ids) < length:
            t = rng.randrange(vocab)
            if t not in avoid:
                ids.append(t)
        out.append(ids)
    return out


def summarize(result: dict) -> list[dict]:
    """One row per batch size measured by both modes: peaks, the bound, ok."""
    drafter, pool = result.get("drafter_bytes"), (result.get("context_pool") or {}).get("bytes")
    modes = result.get("modes", {})
    plain = {c["batch"]: c for c in modes.get("plain", {}).get("cells", []) if "peak_kib" in c}
    dflash = {c["batch"]: c for c in modes.get("dflash", {}).get("cells", []) if "peak_kib" in c}
    rows = []
    for b in sorted(set(plain) & set(dflash)):
        p, d = plain[b]["peak_kib"] * 1024, dflash[b]["peak_kib"] * 1024
        row = {"batch": b, "plain_peak_mib": p / MIB, "dflash_peak_mib": d / MIB,
               "drafter_mib": (drafter or 0) / MIB, "pool_mib": (pool or 0) / MIB}
        if drafter is not None and pool is not None:
            chk = check_bound(p, d, drafter, pool, result.get("slack", SLACK))
            row.update(bound_mib=chk["bound_bytes"] / MIB, ok=chk["ok"],
                       dflash_minus_plain_mib=chk["dflash_minus_plain_bytes"] / MIB,
                       excess_mib=chk["excess_bytes"] / MIB)
        else:
            row.update(bound_mib=None, ok=None, dflash_minus_plain_mib=(d - p) / MIB,
                       excess_mib=None)
        rows.append(row)
    return rows


def render_table(rows: list[dict]) -> str:
    head = ("| batch | plain peak MiB | DFLASH peak MiB | DFLASH - plain MiB | drafter MiB "
            "| pool MiB | bound MiB | ok |\n|---|---|---|---|---|---|---|---|\n")

    def f(v):
        return "n/a" if v is None else f"{v:.0f}"

    body = "".join(
        f"| {r['batch']} | {f(r['plain_peak_mib'])} | {f(r['dflash_peak_mib'])} | "
        f"{f(r['dflash_minus_plain_mib'])} | {r['drafter_mib']:.1f} | {r['pool_mib']:.1f} | "
        f"{f(r['bound_mib'])} | {'n/a' if r['ok'] is None else ('yes' if r['ok'] else 'NO')} |\n"
        for r in rows)
    return head + body


BASELINE_HEADING = "## Memory"


def replace_section(text: str, heading: str, section: str) -> str:
    """`text` with its `heading` section (from that line to the next `## ` line
    or the end) replaced by `section`, or `section` appended when it has none;
    every other line is kept as it was."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == heading), None)
    body = section.rstrip("\n") + "\n"
    if start is None:
        return text.rstrip("\n") + "\n\n" + body
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    rest = "".join(lines[end:])
    return "".join(lines[:start]) + body + ("\n" + rest if rest else "")


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def ensure_models(root: str, rebuild: bool = False) -> tuple[str, str]:
    """The synthetic pair under `root` (target/, drafter/), made unless a
    previous run left one with the same DIMS (stamp: dims.json)."""
    target_dir, drafter_dir = os.path.join(root, "target"), os.path.join(root, "drafter")
    stamp = os.path.join(root, "dims.json")
    if not rebuild and os.path.isfile(stamp):
        with open(stamp) as f:
            if json.load(f) == DIMS:
                log(f"reusing the synthetic pair in {common.repo_relative(root)}")
                return target_dir, drafter_dir
    if os.path.isdir(root):
        shutil.rmtree(root)
    t0 = time.monotonic()
    _make_target(target_dir)
    _make_drafter(drafter_dir)
    write_json(stamp, DIMS)
    log(f"made the synthetic pair in {common.repo_relative(root)} in {time.monotonic() - t0:.0f}s")
    return target_dir, drafter_dir


def _make_target(out: str) -> None:
    import torch

    from sglang_dflash.tools.random_target import Qwen3Shape, write_random_qwen3

    d = DIMS
    shape = Qwen3Shape(vocab=d["vocab"], hidden=d["hidden"], layers=d["layers"], heads=d["heads"],
                       kv_heads=d["kv_heads"], head_dim=d["head_dim"], inter=d["inter"],
                       max_pos=d["max_pos"], rope_theta=d["rope_theta"], eos=d["eos"], pad=d["pad"])
    os.makedirs(out)
    # Embedding and head scaled up so the random logits are not all near-ties.
    write_random_qwen3(out, shape, seed=d["seed"], dtype=getattr(torch, d["dtype"]), embed_std=0.1,
                       head_std=0.2, tokenizer_from=DEMO_TARGET)


def drafter_config() -> dict:
    d = DIMS
    return {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "attention_bias": False,
        "block_size": d["block"], "head_dim": d["head_dim"], "hidden_act": "silu",
        "hidden_size": d["hidden"], "intermediate_size": d["inter"],
        "max_position_embeddings": d["max_pos"], "num_attention_heads": d["heads"],
        "num_hidden_layers": d["draft_layers"], "num_key_value_heads": d["kv_heads"],
        "num_target_layers": d["layers"], "rms_norm_eps": 1e-6, "rope_theta": d["rope_theta"],
        "tie_word_embeddings": False, "torch_dtype": d["dtype"], "vocab_size": d["vocab"],
        "dflash_config": {
            "block_size": d["block"], "target_layer_ids": list(d["target_layer_ids"]),
            "mask_token": "<|MASK|>", "mask_token_id": d["mask_token_id"],
            "conv_kernel_size": d["conv_kernel"], "conv_group_size": d["conv_group"],
            "selector_rank": d["selector_rank"], "selector_top_k": d["selector_top_k"],
        },
    }


def _make_drafter(out: str) -> None:
    from sglang_dflash.checkpoint import save_drafter
    from sglang_dflash.tools.tiny_models import build_random_drafter

    cfg = drafter_config()
    save_drafter(build_random_drafter(cfg, DIMS["seed"] + 1), cfg, out)


# ---------------------------------------------------------------------------
# Servers and batches
# ---------------------------------------------------------------------------


def server_args(mode: str, target: str, drafter: str, opts) -> tuple[list[str], dict]:
    args = ["--model-path", target, "--skip-tokenizer-init",
            "--max-running-requests", str(max(opts.batch_sizes)),
            "--max-total-tokens", str(opts.max_total_tokens),
            "--random-seed", "0", "--log-level", "info", "--decode-log-interval", "4"]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [opts.code_dir, os.environ.get("PYTHONPATH")]))}
    if not env["PYTHONPATH"]:
        env = {}
    if mode == "dflash":
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
        env["SGLANG_DFLASH_POLICY"] = POLICY_ON
    return args, env


def export_head(out: str) -> tuple[str, str]:
    """`git archive HEAD python/` unpacked into OUT/code (replaced); returns
    (the python dir to put first on PYTHONPATH, the short commit)."""
    import subprocess
    import tarfile
    import io

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=common.REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    data = subprocess.run(["git", "archive", "--format=tar", "HEAD", "python"], cwd=common.REPO,
                          check=True, capture_output=True).stdout
    dest = os.path.join(out, "code")
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return os.path.join(dest, "python"), commit


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def per_process(pids) -> list[dict]:
    return [{"pid": pid, "name": _proc_name(pid),
             "vmhwm_mib": common.tree_kib([pid], "VmHWM") / 1024,
             "vmrss_mib": common.tree_kib([pid], "VmRSS") / 1024} for pid in pids]


def _generate(url: str, ids: list, new_tokens: int, timeout: float) -> dict:
    import requests

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                                                  "ignore_eos": True}}
    t0 = time.monotonic()
    resp = requests.post(url + "/generate", json=body, timeout=timeout)
    resp.raise_for_status()
    meta = resp.json().get("meta_info", {})
    return {"latency_s": time.monotonic() - t0, "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens": meta.get("prompt_tokens"), "spec_verify_ct": meta.get("spec_verify_ct")}


def run_batch(srv: Server, batch: int, prompts: list, opts) -> dict:
    srv.flush_cache()
    time.sleep(1.0)
    pids = srv.pids()
    idle_kib = common.tree_kib(pids, "VmRSS")
    reset = common.reset_peak_rss(pids)
    with open(srv.log_path, errors="replace") as f:
        log_offset = len(f.read())
    results, errors = [None] * batch, []

    def one(i):
        try:
            results[i] = _generate(srv.url, prompts[i], opts.new_tokens, opts.request_timeout)
        except Exception as exc:  # noqa: BLE001  recorded, the cell then fails
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    t0 = time.monotonic()
    with common.RssSampler(srv.proc.pid) as sampler:
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(batch)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.monotonic() - t0
    pids = srv.pids()
    cell = {"batch": batch, "wall_s": round(wall, 1), "idle_rss_before_mib": idle_kib / 1024,
            "peak_rss_reset": reset, "errors": errors}
    if errors or not srv.alive():
        cell["server_alive"] = srv.alive()
        cell["log_tail"] = srv.log_tail(3000)
        return cell
    with open(srv.log_path, errors="replace") as f:
        batch_log = f.read()[log_offset:]
    done = [r for r in results if r]
    tokens = sum(r["completion_tokens"] or 0 for r in done)
    verify = sum(r["spec_verify_ct"] or 0 for r in done)
    cell.update({
        "peak_kib": common.tree_kib(pids, "VmHWM"),
        "sampled_max_rss_kib": sampler.max_kib,
        "processes": per_process(pids),
        "completion_tokens": tokens,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in done),
        "max_latency_s": round(max(r["latency_s"] for r in done), 1),
        "max_running_req_logged": max_running_requests(batch_log),
        "committed_per_verify": round(tokens / verify, 3) if verify else None,
    })
    return cell


def run_mode(mode: str, target: str, drafter: str, opts, out: str) -> dict:
    args, env = server_args(mode, target, drafter, opts)
    log_path = os.path.join(out, "logs", f"server_{mode}.log")
    srv = Server(mode, args, env, log_path)
    rec = {"command": common.repo_relative(" ".join(f"{k}='{v}'" for k, v in env.items())
                                           + (" " if env else "") + " ".join(srv.command)),
           "cells": []}
    log(f"{mode}: starting {rec['command']}")
    try:
        srv.start(timeout=opts.start_timeout)
    except ServerStartError as exc:
        rec.update(state="failed", reason=f"{exc}: {common.first_error_line(exc.log_tail)}",
                   log_tail=exc.log_tail[-3000:])
        log(f"{mode}: FAILED to start: {rec['reason']}")
        return rec
    try:
        rec["startup_s"] = round(srv.startup_s, 1)
        rec["idle_after_start_mib"] = common.tree_kib(srv.pids(), "VmRSS") / 1024
        rec["lifetime_peak_at_start_mib"] = common.tree_kib(srv.pids(), "VmHWM") / 1024
        rec["processes_at_start"] = per_process(srv.pids())
        log(f"{mode}: healthy in {srv.startup_s:.0f}s, tree RSS "
            f"{rec['idle_after_start_mib']:.0f} MiB (start-up peak {rec['lifetime_peak_at_start_mib']:.0f})")
        for k, b in enumerate(opts.batch_sizes):
            prompts = make_prompts(b, opts.prompt_tokens, DIMS["vocab"], seed=1000 * (k + 1))
            log(f"{mode}: batch {b}: {b} x {opts.prompt_tokens} prompt tokens, "
                f"{opts.new_tokens} new tokens each ...")
            cell = run_batch(srv, b, prompts, opts)
            rec["cells"].append(cell)
            if "peak_kib" in cell:
                log(f"{mode}: batch {b}: peak {cell['peak_kib'] / 1024:.0f} MiB (sampled max "
                    f"{cell['sampled_max_rss_kib'] / 1024:.0f}, idle before "
                    f"{cell['idle_rss_before_mib']:.0f}), {cell['wall_s']:.0f}s, running-req logged "
                    f"{cell['max_running_req_logged']}, committed/verify {cell['committed_per_verify']}")
            else:
                log(f"{mode}: batch {b}: ERROR {cell['errors'][:1]}")
                if not srv.alive():
                    break
        rec["state"] = "ok"
    finally:
        srv.stop()
        with open(log_path, errors="replace") as f:
            text = f.read()
        rec["context_pool"] = parse_context_pool(text)
    return rec


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _describe(result: dict) -> list[str]:
    s, m, v = result["settings"], result["machine"], result["versions"]
    pool = result.get("context_pool") or {}
    wall = f" (wall time {result['wall_s'] / 60:.0f} min)" if result.get("wall_s") else ""
    load = result.get("load_avg_start")
    return [
        f"* Git commit: `{v.get('git_commit')}`" + (
            f", package served from a {result['code']}" if result.get("code", "").startswith("git")
            else " (dirty tree)" if v.get("git_dirty") else "") + ".",
        f"* Host: {m['cpu_model']}, {m['nproc']} cores (`nproc`), {m['ram_gib']} GiB RAM, "
        f"{'GPU ' + ', '.join(m['gpu']) if m.get('gpu') else 'no GPU (SGLang CPU engine)'}"
        + (f"; load average {load[0]:.1f} at the start (other work on the same cores)"
           if load else "") + ".",
        f"* Date: {result['date']}{wall}.",
        "* Versions: " + ", ".join(f"{k} {v.get(k)}" for k in ("sglang", "torch", "transformers",
                                                                  "sglang-dflash")) + ".",
        f"* Models: a synthetic pair made by the script (random weights, {DIMS['dtype']}): "
        f"Qwen3 target, vocab {DIMS['vocab']}, hidden {DIMS['hidden']}, {DIMS['layers']} layers, "
        f"{DIMS['heads']} / {DIMS['kv_heads']} heads of {DIMS['head_dim']}, untied head; DFlash 2 "
        f"drafter, {DIMS['draft_layers']} layer, block {DIMS['block']}, selector rank "
        f"{DIMS['selector_rank']} / top-K {DIMS['selector_top_k']}.",
        f"* Load: per batch size b, b concurrent `/generate` requests of {s['prompt_tokens']} random "
        f"prompt token ids (no shared prefix), {s['new_tokens']} new tokens each (greedy, "
        f"ignore_eos), on one server per mode (`--skip-tokenizer-init --max-running-requests "
        f"{max(s['batch_sizes'])} --max-total-tokens {s['max_total_tokens']}`); DFLASH with "
        f"`SGLANG_DFLASH_POLICY='{POLICY_ON}'` (the full block drafted and verified every step).",
        "* Peak: VmHWM summed over the server's process tree (launcher, scheduler, detokenizer), "
        "reset before each batch; batches run in increasing size on one server, so each peak "
        "includes what earlier batches left resident. Pages shared between processes count in each.",
        f"* Bound: (plain peak + drafter weights + context pool) x {1 + result.get('slack', SLACK):.2f}; "
        f"drafter weights = tensor bytes of its safetensors ({(result.get('drafter_bytes') or 0) / MIB:.1f} "
        f"MiB), context pool = the worker's start-up log line ({pool.get('slots')} slots x "
        f"{pool.get('bytes_per_slot')} B = {(pool.get('bytes') or 0) / MIB:.1f} MiB).",
    ]


def concurrency_note(result: dict) -> str | None:
    """Where a server ran fewer requests at once than the batch (its "Decode
    batch" log lines' largest #running-req), e.g. when KV admission held some back."""
    short = [f"{mode} {c['batch']} -> {c['max_running_req_logged']}"
             for mode, rec in result["modes"].items() for c in rec.get("cells", [])
             if c.get("max_running_req_logged") is not None and c["max_running_req_logged"] < c["batch"]]
    if not short:
        return None
    return ("Requests decoding at once below the batch size (largest `#running-req` in the server's "
            "decode log; the rest were admitted after the first ones finished): " + ", ".join(short) + ".")


def baseline_section(result: dict) -> str:
    """The `## Memory` section of benchmark/BASELINE.md."""
    rows = summarize(result)
    verdict = ("n/a" if not rows or any(r["ok"] is None for r in rows)
               else "met at every batch size" if all(r["ok"] for r in rows)
               else "NOT met at batch " + ", ".join(str(r["batch"]) for r in rows if not r["ok"]))
    lines = [BASELINE_HEADING, "",
             "Peak RSS of plain decoding against the DFLASH worker (issue #35: DFLASH's peak at most "
             "plain's + the drafter's weights + its context pool + 10%). Generated by "
             "`benchmark/memory.py --update-baseline`, which replaces only this section; the run's "
             "`memory.json` / `memory.md` are in `benchmark/results/memory/` (not tracked).", "",
             "```bash", result["command"], "```", "", *_describe(result), "",
             render_table(rows).rstrip("\n"), "", f"Bound {verdict}."]
    note = concurrency_note(result)
    if note:
        lines += ["", note]
    for mode, rec in result["modes"].items():
        if rec.get("state") != "ok":
            lines.append(f"* {mode}: {rec.get('state')}: {rec.get('reason')}")
    return "\n".join(lines) + "\n"


def render_md(result: dict) -> str:
    """memory.md: the table and how it was measured."""
    rows = summarize(result)
    lines = ["# Peak memory: plain vs DFLASH", "", f"Command: `{result['command']}`", "",
             *_describe(result), "", render_table(rows)]
    if concurrency_note(result):
        lines.append(concurrency_note(result))
    for mode, rec in result["modes"].items():
        if rec.get("state") != "ok":
            lines.append(f"* {mode}: {rec.get('state')}: {rec.get('reason')}")
    return "\n".join(lines) + "\n"


def update_baseline(result: dict, md_path: str = BASELINE_MD) -> None:
    with open(md_path) as f:
        text = f.read()
    with open(md_path, "w") as f:
        f.write(replace_section(text, BASELINE_HEADING, baseline_section(result)))
    log(f"updated the {BASELINE_HEADING[3:]} section of {common.repo_relative(md_path)}")


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--models", default=None, help="cache of the synthetic pair (default OUT/models)")
    p.add_argument("--rebuild-models", action="store_true")
    p.add_argument("--batch-sizes", default="1,16,48")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--modes", default="plain,dflash")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="default: what the largest batch needs (kv_tokens_needed)")
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--request-timeout", type=float, default=1800)
    p.add_argument("--code-from-head", action="store_true",
                   help="serve the package as committed (git archive HEAD python/ into OUT/code, "
                        "first on the servers' PYTHONPATH), not the working tree's edits")
    p.add_argument("--from-json", default=None, help="re-render memory.md from a memory.json")
    p.add_argument("--update-baseline", action="store_true",
                   help="also write the Memory section of benchmark/BASELINE.md (only that section)")
    opts = p.parse_args(argv)
    opts.batch_sizes = [int(b) for b in opts.batch_sizes.split(",")]
    opts.modes = opts.modes.split(",")
    if opts.max_total_tokens is None:
        opts.max_total_tokens = max(16384, kv_tokens_needed(max(opts.batch_sizes), opts.prompt_tokens,
                                                            opts.new_tokens, DIMS["block"]))
    return opts


def main(argv=None) -> int:
    opts = _parse_args(argv)
    if opts.from_json:
        with open(opts.from_json) as f:
            result = json.load(f)
        md = os.path.join(os.path.dirname(opts.from_json), "memory.md")
        with open(md, "w") as f:
            f.write(render_md(result))
        print(render_md(result))
        if opts.update_baseline:
            update_baseline(result)
        return 0
    out = opts.out
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    t0 = time.monotonic()
    opts.code_dir, code = None, "the working tree"
    if opts.code_from_head:
        opts.code_dir, commit = export_head(out)
        code = f"git archive of HEAD ({commit})"
        log(f"serving the package from {code} in {common.repo_relative(opts.code_dir)}")
    target, drafter = ensure_models(opts.models or os.path.join(out, "models"), opts.rebuild_models)
    result = {"date": common.now_iso(), "command": common.command_line("benchmark/memory.py"),
              "machine": common.machine_info(), "versions": common.versions(),
              "load_avg_start": os.getloadavg(), "dims": DIMS, "slack": SLACK,
              "settings": {"batch_sizes": opts.batch_sizes, "prompt_tokens": opts.prompt_tokens,
                           "new_tokens": opts.new_tokens, "max_total_tokens": opts.max_total_tokens,
                           "policy": POLICY_ON},
              "code": code, "drafter_bytes": drafter_weight_bytes(drafter), "modes": {}}
    log(f"drafter weights {result['drafter_bytes'] / MIB:.1f} MiB; --max-total-tokens "
        f"{opts.max_total_tokens}")
    path = os.path.join(out, "memory.json")
    for mode in opts.modes:
        result["modes"][mode] = run_mode(mode, target, drafter, opts, out)
        if mode == "dflash":
            result["context_pool"] = result["modes"][mode].get("context_pool")
            log(f"context pool from the log: {result['context_pool']}")
        write_json(path, result)
    result["load_avg_end"] = os.getloadavg()
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["rows"] = summarize(result)
    write_json(path, result)
    md = render_md(result)
    with open(os.path.join(out, "memory.md"), "w") as f:
        f.write(md)
    print(md, flush=True)
    log(f"wrote {common.repo_relative(path)} and memory.md in {result['wall_s']:.0f}s")
    if opts.update_baseline:
        update_baseline(result)
    rows = result["rows"]
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
