#!/usr/bin/env python
"""Serving benchmark grid: plain decoding vs DFLASH (policies on / adaptive / off)
vs SGLang's n-gram speculation vs upstream's DFLASH worker, over concurrency and
workloads, with real servers and SGLang's own load generator.

    python benchmark/grid.py                 # the full grid (long: hours on a CPU host)
    python benchmark/grid.py --quick         # c in {1, 8, 32}, 1 repeat, few requests (< 10 min on CPU)
    python benchmark/grid.py --tiny --out D  # one cell, plain vs DFLASH on (the integration test)

Each configuration is a real server started with `sglang-dflash serve ...`
(= `python -m sglang.launch_server ...`; on a host without CUDA the CPU engine
is set up first, on a CUDA host nothing changes). Load comes from
`sglang.bench_serving` (`sglang.benchmark.serving`): its own command-line
parser builds the arguments (`--backend sglang --dataset-name custom
--dataset-path <prompts.jsonl> --apply-chat-template --max-concurrency C ...`)
and its `run_benchmark` runs each cell, so a cell is exactly what the printed
`python -m sglang.bench_serving ...` line would measure. We only wrap its
`sglang` request function to keep each request's final `meta_info`
(spec_verify_ct, spec_correct_drafts_histogram), which its result omits.

Metrics per cell (see benchmark/README.md for definitions): output tokens/s,
TPOT and TTFT (median, p90, p99), mean acceptance length (bonus included, from
the per-request histograms), the speculation on-ratio (delta of the server's
/server_info dflash block over the cell), and the peak memory of the
server's process tree. Cells are repeated; ratios against plain decoding are
taken within a repetition, then summarised as median [min-max].
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
from common import Server, ServerStartError, fmt, fmt_spread, spread  # noqa: E402

WORKLOADS = ("math", "code", "chat")
PIPE = "\\|"  # a literal | inside a Markdown table cell
WORKLOAD_SOURCES = {"math": "GSM8K", "code": "HumanEval", "chat": "MT-Bench"}


def _policy(mode: str, **knobs) -> dict:
    return {"SGLANG_DFLASH_POLICY": json.dumps({"mode": mode, **knobs})}


# name -> (description, kind, extra env[, extra server args]). kind: plain | dflash | ngram.
CONFIGS = {
    "plain": ("plain decoding (no speculation)", "plain", {}),
    # Diagnostic: plain decoding without SGLang's overlap scheduler, which our
    # worker also runs without (it drafts and verifies in one synchronous step).
    "plain-sync": ("plain decoding, --disable-overlap-schedule", "plain", {},
                   ["--disable-overlap-schedule"]),
    "dflash-on": ("our DFLASH worker, policy on (always full block)", "dflash", _policy("on")),
    # Diagnostic: a second, identical always-on server: its ratio to dflash-on
    # is the scatter between two server processes, the yardstick for the
    # criteria's 5% (benchmark/RESULTS.md, "noise between identical servers").
    "dflash-on-2": ("our DFLASH worker, policy on, a second identical server", "dflash",
                    _policy("on")),
    "dflash-adaptive": ("our DFLASH worker, adaptive policy", "dflash", _policy("adaptive")),
    # Diagnostic: the adaptive policy's trials as before 2026-12-01 evening (narrow
    # band for trials of off at every batch, no bias prior across loads); flap
    # trials (added after grid-eos-trials-wide) are not switched off here.
    "dflash-adaptive-prev": ("our DFLASH worker, adaptive policy, trial_close_off 0.15, "
                             "trial_prior off", "dflash",
                             _policy("adaptive", trial_close_off=0.15, trial_prior=False)),
    # Diagnostic: the wide band for trials of off at batch >= 16 (the default
    # from 43273df to this config's addition; trials.py says why it is off).
    "dflash-adaptive-wide": ("our DFLASH worker, adaptive policy, trial_close_off 1.0", "dflash",
                             _policy("adaptive", trial_close_off=1.0)),
    # Ragged verify (truncate.py): the adaptive policy with each request's verified
    # block cut at the cost model's break-even survival.
    "dflash-adaptive-ragged": ("our DFLASH worker, adaptive policy, truncate_below auto", "dflash",
                               _policy("adaptive", truncate_below="auto")),
    "dflash-on-ragged": ("our DFLASH worker, policy on, truncate_below 0.5", "dflash",
                         _policy("on", truncate_below=0.5)),
    "dflash-off": ("our DFLASH worker, policy off (zero-speculation control)", "dflash",
                   _policy("off")),
    "ngram": ("SGLang n-gram speculation (--speculative-algorithm NGRAM)", "ngram", {}),
    "upstream-dflash": ("SGLang's own DFLASH worker (SGLANG_DFLASH_UPSTREAM=1)", "dflash",
                        {"SGLANG_DFLASH_UPSTREAM": "1"}),
}
CUDA_ONLY = {"upstream-dflash"}
DIAGNOSTIC = {"plain-sync", "dflash-on-2", "dflash-adaptive-prev", "dflash-adaptive-wide",
              "dflash-adaptive-ragged", "dflash-on-ragged"}  # not in the full preset

PRESETS = {
    "full": dict(configs=[c for c in CONFIGS if c not in DIAGNOSTIC], workloads=list(WORKLOADS), concurrency=[1, 4, 8, 16, 32, 64],
                 repeats=3, max_new_tokens=128, min_requests=16, requests_per_slot=2,
                 warmup_requests=8, section="grid"),
    # Plain, ours always on, and SGLang's n-gram peer; upstream-dflash only costs a
    # start-up attempt where it cannot run (its state is still reported).
    "quick": dict(configs=["plain", "dflash-on", "ngram", "upstream-dflash"],
                  workloads=list(WORKLOADS), concurrency=[1, 8, 32], repeats=1, max_new_tokens=32,
                  min_requests=2, requests_per_slot=1, warmup_requests=1, section="grid-quick"),
    "tiny": dict(configs=["plain", "dflash-on"], workloads=["math"], concurrency=[4], repeats=1,
                 max_new_tokens=32, min_requests=8, requests_per_slot=1, warmup_requests=2,
                 section=None),
}


# ---------------------------------------------------------------------------
# sglang.bench_serving, driven through its own parser and run_benchmark
# ---------------------------------------------------------------------------


class BenchServing:
    """`sglang.benchmark.serving` (what `python -m sglang.bench_serving` runs),
    with its `sglang` request function wrapped to keep every output object and
    the last `meta_info` each streamed request received."""

    def __init__(self, log_path: str):
        from sglang.benchmark import serving

        self.serving = serving
        self.log_path = log_path
        self.collected: list = []
        original = serving.ASYNC_REQUEST_FUNCS["sglang"]
        record = serving._record_server_prompt_len

        async def collecting(request_func_input, pbar=None):
            out = await original(request_func_input=request_func_input, pbar=pbar)
            self.collected.append(out)
            return out

        def record_meta(data, output):
            record(data, output)
            meta = data.get("meta_info") if isinstance(data, dict) else None
            if meta:
                output.grid_meta_info = meta  # the final chunk's meta_info wins

        serving.ASYNC_REQUEST_FUNCS["sglang"] = collecting
        serving._record_server_prompt_len = record_meta

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """bench_serving's own CLI parser (cli_main) without running it."""
        serving, captured = self.serving, {}
        run, old_argv = serving.run_benchmark, sys.argv
        serving.run_benchmark = lambda a: captured.setdefault("args", a)
        sys.argv = ["sglang.bench_serving", *argv]
        try:
            serving.cli_main()
        finally:
            serving.run_benchmark, sys.argv = run, old_argv
        return captured["args"]

    def run(self, argv: list[str]) -> tuple[dict, list]:
        args = self.parse(argv)
        self.collected = []
        with open(self.log_path, "a") as log, contextlib.redirect_stdout(log):
            print("\n# python -m sglang.bench_serving " + shlex.join(argv), flush=True)
            result = self.serving.run_benchmark(args)
        return result, list(self.collected)


# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


def prompt_sets(target: str, workloads, max_new_tokens: int, block_size: int) -> dict[str, dict]:
    """Per workload: the bundled prompts whose chat-templated length plus the
    generated tokens (and one block of verify slack) fit the target's context,
    their token lengths, and how many were left out for not fitting."""
    from transformers import AutoConfig, AutoTokenizer

    from sglang_dflash.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(target)
    context = int(getattr(AutoConfig.from_pretrained(target), "max_position_embeddings", 1 << 30))
    budget = context - max_new_tokens - block_size
    sets = {}
    for w in workloads:
        kept, lengths = [], []
        for p in load_prompts(w):
            text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True)
            n = len(tok.encode(text))
            if n <= budget:
                kept.append(p)
                lengths.append(n)
        if not kept:
            raise SystemExit(f"grid: no {w} prompt fits the target's context of {context} tokens "
                             f"with {max_new_tokens} new tokens")
        sets[w] = {"prompts": kept, "longest": max(lengths), "excluded": len(load_prompts(w)) - len(kept)}
    return sets


def write_prompt_files(sets: dict[str, dict], n_max: int, directory: str) -> dict[str, dict]:
    """One bench_serving `custom` JSONL per workload (user turn = the prompt;
    the assistant turn is unused because the output length is fixed). When a
    cell needs more requests than the workload has prompts, prompts repeat."""
    files = {}
    for w, entry in sets.items():
        prompts = entry["prompts"]
        rows = [prompts[i % len(prompts)] for i in range(max(n_max, len(prompts)))]
        path = os.path.join(directory, f"prompts_{w}.jsonl")
        with open(path, "w") as f:
            for p in rows:
                f.write(json.dumps({"conversations": [
                    {"role": "user", "content": p}, {"role": "assistant", "content": "(unused)"}]}) + "\n")
        files[w] = {"path": path, "unique_prompts": len(prompts), "excluded_prompts": entry["excluded"]}
    return files


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


def server_args(name: str, opts) -> tuple[list[str], dict]:
    _, kind, env, *extra = CONFIGS[name]
    args = ["--model-path", opts.target,
            "--max-running-requests", str(opts.max_running_requests),
            "--max-total-tokens", str(opts.max_total_tokens),
            "--random-seed", str(opts.seed), "--log-level", "warning",
            # An idle scheduler otherwise spins a core: with several servers up at
            # once that would steal CPU from the one being measured.
            "--sleep-on-idle"]
    if kind == "dflash":
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", opts.drafter]
        if opts.block_size:
            args += ["--speculative-num-draft-tokens", str(opts.block_size)]
    elif kind == "ngram":
        args += ["--speculative-algorithm", "NGRAM"]
    args += extra[0] if extra else []
    args += shlex.split(opts.server_args or "")
    return args, dict(env)


def start_servers(names, opts, log_dir, on_cuda: bool, launched: list) -> tuple[dict, dict]:
    """Launch every configuration and wait for each; returns ({name: Server}
    for the healthy ones, {name: status record} for all). One at a time by
    default: an adaptive DFLASH server profiles its step costs at start-up,
    and a profile taken while other servers load is far off (`--parallel-start`
    overlaps them to save time). Every launched Server is appended to
    `launched` first, for the caller to stop."""
    status, up = {}, {}
    launching = {}
    for name in names:
        args, env = server_args(name, opts)
        srv = Server(name, args, env, os.path.join(log_dir, f"server_{name}.log"))
        rec = {"description": CONFIGS[name][0], "command": _shell(env, srv.command)}
        status[name] = rec
        free = common.mem_available_mib()
        if opts.schedule == "interleaved" and free is not None and free < opts.min_free_mib:
            rec.update(state="skipped", reason=(
                f"only {free:.0f} MiB available before start-up (< --min-free-mib "
                f"{opts.min_free_mib}); use --schedule sequential"))
            continue
        launching[name] = srv
        launched.append(srv)
        srv.launch()
        if opts.parallel_start:
            # Let the first imports overlap, not all compete from the same instant.
            time.sleep(2)
        else:
            _await_server(name, srv, status[name], up, opts, on_cuda)
    if opts.parallel_start:
        for name, srv in launching.items():
            _await_server(name, srv, status[name], up, opts, on_cuda)
    return up, status


def _await_server(name, srv, rec, up, opts, on_cuda) -> None:
    try:
        srv.wait_healthy(opts.start_timeout)
    except ServerStartError as exc:
        reason = common.first_error_line(exc.log_tail)
        state = "failed"
        if name in CUDA_ONLY and not on_cuda:
            state, reason = "not runnable on CPU", f"start-up failed: {reason}"
        rec.update(state=state, reason=f"{exc}: {reason}" if state == "failed" else reason,
                   log_tail=exc.log_tail[-3000:])
        print(f"[grid] {name}: {rec['state']}: {rec['reason']}", flush=True)
        return
    rec.update(state="ok", startup_s=round(srv.startup_s, 1))
    try:
        info = srv.server_info()
    except Exception as exc:
        rec.update(state="failed", reason=f"healthy, but /server_info failed: {exc}")
        srv.stop()
        return
    dflash = (info.get("internal_states") or [{}])[0].get("dflash")
    rec["server"] = {k: info.get(k) for k in (
        "max_running_requests", "max_total_num_tokens", "speculative_algorithm",
        "speculative_num_draft_tokens", "device", "attention_backend", "dtype")}
    if CONFIGS[name][1] == "dflash":
        rec["plugin_dflash_block"] = dflash is not None
        if name not in CUDA_ONLY and dflash is None:
            rec["note"] = "no dflash block in /server_info: is the plugin active?"
        if dflash:
            rec["drafter_version"] = dflash.get("drafter_version")
            rec["block_size"] = dflash.get("block_size")
    print(f"[grid] {name}: up in {srv.startup_s:.0f}s on port {srv.port}", flush=True)
    up[name] = srv


def _shell(env: dict, cmd: list[str]) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (prefix + " " if prefix else "") + shlex.join(cmd)


# ---------------------------------------------------------------------------
# One cell
# ---------------------------------------------------------------------------


def dflash_counters(srv: Server) -> dict | None:
    try:
        block = (srv.server_info().get("internal_states") or [{}])[0].get("dflash")
    except Exception:
        return None
    if not block or block.get("steps") is None:
        return None
    steps = int(block["steps"])
    ratio = block.get("spec_on_ratio") or 0.0
    return {"steps": steps, "spec_steps": round(ratio * steps), "current_width": block.get("current_width"),
            "policy": block.get("policy"), "timing": {k: block.get(k) for k in (
                "timed_step_ms_by_width", "timed_steps_by_width", "prefill_seconds", "prefill_steps")}}


def warm_up(srv: Server, prompts_path: str, n: int, max_tokens: int, opts) -> None:
    """A few concurrent requests before the measured run (not counted)."""
    import requests

    if n <= 0:
        return
    with open(prompts_path) as f:
        texts = [json.loads(line)["conversations"][0]["content"] for _, line in zip(range(n), f)]
    tok = _tokenizer(opts.target)

    def one(text):
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
        requests.post(srv.url + "/generate", timeout=600, json={
            "text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": opts.temperature}})

    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(one, texts))


_TOKENIZERS: dict = {}


def _tokenizer(path: str):
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
    return _TOKENIZERS[path]


def per_request(outputs) -> list[dict]:
    rows = []
    for o in outputs:
        meta = getattr(o, "grid_meta_info", None) or {}
        hist = meta.get("spec_correct_drafts_histogram") or []
        steps = sum(hist)
        rows.append({
            "ok": bool(o.success),
            "prompt_len": o.prompt_len,
            "output_len": o.output_len,
            "ttft_ms": o.ttft * 1000 if o.success else None,
            "tpot_ms": ((o.latency - o.ttft) / (o.output_len - 1) * 1000
                        if o.success and o.output_len > 1 else None),
            "latency_ms": o.latency * 1000 if o.success else None,
            "spec_accept_length": meta.get("spec_accept_length"),
            "spec_verify_ct": meta.get("spec_verify_ct"),
            "accept_hist": hist,  # index k: verify steps that accepted k drafts (AL = k + 1)
            "acceptance_length": (sum((k + 1) * c for k, c in enumerate(hist)) / steps
                                  if steps else None),
            "error": (o.error or "")[-300:] if not o.success else None,
        })
    return rows


def add_hist(acc: list[int], hist: list[int]) -> None:
    """acc += hist, elementwise, growing acc as needed."""
    acc += [0] * (len(hist) - len(acc))
    for k, v in enumerate(hist):
        acc[k] += v


def summarise_requests(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    hist: list[int] = []
    for r in ok:
        add_hist(hist, r["accept_hist"])
    steps = sum(hist)
    per_req = [r["acceptance_length"] for r in ok if r["acceptance_length"] is not None]
    sgl = [r["spec_accept_length"] for r in ok if r["spec_accept_length"] is not None]
    return {
        "failed_requests": len(rows) - len(ok),
        "accept_hist": hist,
        "verify_steps": steps,
        # Pooled over every verify step of the cell; bonus included.
        "acceptance_length": (sum((k + 1) * c for k, c in enumerate(hist)) / steps) if steps else None,
        # Mean over requests of each request's own mean.
        "acceptance_length_per_request": (sum(per_req) / len(per_req)) if per_req else None,
        "sglang_spec_accept_length_mean": (sum(sgl) / len(sgl)) if sgl else None,
    }


def run_cell(bench: BenchServing, srv: Server, cfg: str, workload: str, conc: int, rep: int,
             opts, prompt_files, out_jsonl: str) -> dict:
    n = requests_for(conc, opts)
    tag = f"{cfg}/{workload}/c{conc}/rep{rep}"
    cell = {"config": cfg, "workload": workload, "concurrency": conc, "rep": rep, "num_prompts": n}
    argv = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(srv.port),
            "--model", opts.target, "--tokenizer", opts.target,
            "--dataset-name", "custom", "--dataset-path", prompt_files[workload]["path"],
            "--apply-chat-template", "--num-prompts", str(n),
            "--sharegpt-output-len", str(opts.max_new_tokens),
            "--max-concurrency", str(conc), "--request-rate", "inf",
            "--temperature", str(opts.temperature), "--top-p", str(opts.top_p),
            "--seed", str(opts.seed), "--warmup-requests", "0", "--flush-cache",
            "--disable-tqdm", "--output-file", out_jsonl, "--tag", tag]
    if opts.allow_eos:
        argv.append("--disable-ignore-eos")
    cell["bench_serving_command"] = "python -m sglang.bench_serving " + shlex.join(argv)
    if not srv.alive():
        cell["error"] = "server is not running"
        return cell
    t0 = time.monotonic()
    try:
        warm_up(srv, prompt_files[workload]["path"], min(conc, opts.warmup_requests),
                min(opts.max_new_tokens, 8), opts)
        before = dflash_counters(srv)
        pids = srv.pids()
        hwm_reset = common.reset_peak_rss(pids)
        with common.RssSampler(srv.proc.pid) as sampler:
            result, outputs = bench.run(argv)
        peak_kib = common.tree_kib(srv.pids(), "VmHWM")
        after = dflash_counters(srv)
    except Exception as exc:  # a crashed server or a failed run: record, go on
        cell["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
        cell["server_alive"] = srv.alive()
        if not srv.alive():
            cell["server_log_tail"] = srv.log_tail(3000)
        print(f"[grid] {tag}: ERROR {cell['error'][:300]}", flush=True)
        return cell
    rows = per_request(outputs)
    cell.update({k: result.get(k) for k in (
        "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
        "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "median_e2e_latency_ms", "max_concurrent_requests")})
    # bench_serving's "concurrency": sum of request latencies / duration (achieved).
    cell["achieved_concurrency"] = result.get("concurrency")
    cell.update(summarise_requests(rows))
    if before and after and after["steps"] > before["steps"]:
        d_steps = after["steps"] - before["steps"]
        cell["spec_on_ratio"] = (after["spec_steps"] - before["spec_steps"]) / d_steps
        cell["server_steps"] = d_steps
        cell["width_at_end"] = after["current_width"]
        # The policy's state after the cell (rates, cost cells, predicted tok/s
        # per width): why adaptive chose what it chose, for the raw JSON only.
        cell["policy_at_end"] = after.get("policy")
        cell["timing_before"], cell["timing_after"] = before.get("timing"), after.get("timing")
    cell["peak_rss_mib"] = peak_kib / 1024
    cell["peak_rss_reset"] = hwm_reset  # False: VmHWM is the lifetime peak of the processes
    cell["sampled_max_rss_mib"] = sampler.max_kib / 1024
    cell["wall_s"] = time.monotonic() - t0
    cell["requests"] = rows
    print(f"[grid] {tag}: {cell['output_throughput']:.1f} tok/s, TPOT p50 "
          f"{cell['median_tpot_ms']:.1f} ms, AL {fmt(cell['acceptance_length'])}, "
          f"on {fmt(cell.get('spec_on_ratio'))} ({cell['wall_s']:.0f}s)", flush=True)
    return cell


def requests_for(conc: int, opts) -> int:
    if opts.requests:
        return opts.requests
    return max(opts.min_requests, opts.requests_per_slot * conc)


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------


def cell_order(names: list[str], shift: int) -> list[str]:
    """Configurations in a rotated order, so none is always measured first."""
    k = shift % len(names) if names else 0
    return names[k:] + names[:k]


def run_grid(opts, bench: BenchServing, prompt_files, log_dir, on_cuda) -> tuple[list, dict]:
    cells, statuses = [], {}
    out_jsonl = os.path.join(log_dir, "bench_serving.jsonl")
    grid = [(rep, wi, w, ci, c) for rep in range(opts.repeats) for wi, w in enumerate(opts.workloads)
            for ci, c in enumerate(opts.concurrency)]
    launched: list[Server] = []
    try:
        if opts.schedule == "interleaved":
            # With --restart-each-rep every repetition gets fresh server
            # processes. Why: should a process have a speed of its own, one
            # launch per grid makes it a bias of every repetition's ratio; fresh
            # processes make it scatter that the median over repetitions sees.
            # Two identical always-on servers differed by a median 9% over 5
            # repetitions of one launch (benchmark/RESULTS.md, "noise between
            # identical servers"; other launches gave 0.90-1.15).
            launches = [[r] for r in range(opts.repeats)] if opts.restart_each_rep \
                else [list(range(opts.repeats))]
            for reps in launches:
                servers, status = start_servers(opts.configs, opts, log_dir, on_cuda, launched)
                _merge_status(statuses, status)
                runnable = [n for n in opts.configs if n in servers]
                for rep, wi, w, ci, c in grid:
                    if rep not in reps:
                        continue
                    for name in cell_order(runnable, rep + wi + ci):
                        cells.append(run_cell(bench, servers[name], name, w, c, rep, opts,
                                              prompt_files, out_jsonl))
                for srv in servers.values():
                    srv.stop()
        else:
            for name in opts.configs:
                servers, status = start_servers([name], opts, log_dir, on_cuda, launched)
                statuses.update(status)
                for rep, _, w, _, c in grid:
                    if name in servers:
                        cells.append(run_cell(bench, servers[name], name, w, c, rep, opts,
                                              prompt_files, out_jsonl))
                for srv in servers.values():
                    srv.stop()
    finally:
        for srv in launched:
            srv.stop()
    return cells, statuses


def _merge_status(statuses: dict, launch: dict) -> None:
    """Fold one launch's status records into the grid's: the first launch's
    record stands unless a later one failed, and start-up seconds are listed
    per launch."""
    for name, rec in launch.items():
        prev = statuses.get(name)
        times = (prev or {}).get("startup_s_each", []) + (
            [rec["startup_s"]] if "startup_s" in rec else [])
        if prev is None or (rec.get("state") != "ok" and prev.get("state") == "ok"):
            statuses[name] = dict(rec)
        statuses[name]["startup_s_each"] = times


METRICS = ("output_throughput", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
           "p90_ttft_ms", "p99_ttft_ms", "acceptance_length", "acceptance_length_per_request",
           "spec_on_ratio", "peak_rss_mib", "sampled_max_rss_mib")


def summarise(cells: list[dict], opts) -> list[dict]:
    ok = [c for c in cells if "error" not in c and c.get("completed")]
    by_key = {(c["workload"], c["concurrency"], c["config"], c["rep"]): c for c in ok}
    rows = []
    for w in opts.workloads:
        for conc in opts.concurrency:
            for name in opts.configs:
                reps = [by_key.get((w, conc, name, r)) for r in range(opts.repeats)]
                reps = [c for c in reps if c]
                if not reps:
                    continue
                row = {"workload": w, "concurrency": conc, "config": name, "repeats": len(reps)}
                for m in METRICS:
                    row[m] = spread(c.get(m) for c in reps)
                thr_ratio, tpot_ratio = [], []
                for c in reps:
                    base = by_key.get((w, conc, "plain", c["rep"]))
                    if base and base["output_throughput"]:
                        thr_ratio.append(c["output_throughput"] / base["output_throughput"])
                    if base and c.get("median_tpot_ms"):
                        tpot_ratio.append(base["median_tpot_ms"] / c["median_tpot_ms"])
                row["speedup_throughput"] = spread(thr_ratio)
                row["speedup_tpot"] = spread(tpot_ratio)
                hist: list[int] = []
                for c in reps:
                    add_hist(hist, c.get("accept_hist") or [])
                row["accept_hist"] = hist
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------


def _save_figure(plt, fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(summary: list[dict], opts, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for w in opts.workloads:
        rows = [r for r in summary if r["workload"] == w]
        if not rows:
            continue
        for metric, ylabel, stem in (
                ("speedup_throughput", "output tokens/s relative to plain decoding", "speedup"),
                ("output_throughput", "output tokens/s", "throughput")):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            for name in opts.configs:
                pts = [r for r in rows if r["config"] == name and r[metric]]
                if not pts or (metric == "speedup_throughput" and name == "plain"):
                    continue
                xs = [r["concurrency"] for r in pts]
                med = [r[metric]["median"] for r in pts]
                lo = [r[metric]["median"] - r[metric]["min"] for r in pts]
                hi = [r[metric]["max"] - r[metric]["median"] for r in pts]
                ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
            if metric == "speedup_throughput":
                ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="plain = 1")
            ax.set_xscale("log", base=2)
            ax.set_xticks(opts.concurrency, [str(c) for c in opts.concurrency])
            ax.set_xlabel("concurrency")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{w} ({WORKLOAD_SOURCES[w]}): median, bars min-max over repeats")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            files.append(_save_figure(plt, fig, out_dir, f"{stem}_{w}.png"))
        # Acceptance-length histogram from the per-request histograms, pooled over
        # every cell of the workload (all concurrencies and repeats).
        pooled: dict[str, list[int]] = {}
        for r in rows:
            if sum(r["accept_hist"]):
                add_hist(pooled.setdefault(r["config"], []), r["accept_hist"])
        if pooled:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            width = 0.8 / len(pooled)
            for i, (name, h) in enumerate(pooled.items()):
                total = sum(h)
                xs = [k + 1 + (i - (len(pooled) - 1) / 2) * width for k in range(len(h))]
                al = sum((k + 1) * v for k, v in enumerate(h)) / total
                ax.bar(xs, [v / total for v in h], width=width, label=f"{name} (mean {al:.2f})")
            ax.set_xlabel("acceptance length per verify step (accepted drafts + bonus)")
            ax.set_ylabel("fraction of verify steps")
            ax.set_title(f"{w} ({WORKLOAD_SOURCES[w]}): acceptance length, all cells")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=8)
            files.append(_save_figure(plt, fig, out_dir, f"accept_hist_{w}.png"))
    return files


def _load(meta: dict, when: str) -> str:
    values = (meta.get("load_average") or {}).get(when)
    return "/".join(f"{x:.1f}" for x in values) if values else "n/a"


def _pooled_note(meta: dict) -> list[str]:
    """For a report of benchmark/pool_grids.py, the runs it pooled (in place of
    the date line of one run); [] for a run's own report."""
    runs = meta.get("pooled_from")
    if not runs:
        return []
    lines = [f"* Pooled on {meta['date']} from {len(runs)} runs of the same grid (wall time "
             f"{meta['wall_s'] / 60:.1f} min in all; repetitions renumbered in this order, ratios stay "
             "within a repetition; dates and load averages in each run's own section):"]
    for i, r in enumerate(runs, 1):
        lines.append(f"  {i}. `{r['command']}` ({r['date']}, git {r['git_commit']}, "
                     f"{r['repeats']} repetition(s)" + (f", section {r['section']}" if r.get("section") else "")
                     + ")")
    return lines


def markdown(report: dict, summary: list[dict], plots: list[str], img_prefix: str) -> str:
    meta, opts = report["meta"], report["meta"]["settings"]
    m, v = meta["machine"], meta["versions"]
    lines = [
        f"## Serving grid ({meta.get('section') or meta['mode']})",
        "",
        "Command (run from the repository root):",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        *(_pooled_note(meta) or [
            f"* Date: {meta['date']}; wall time {meta['wall_s'] / 60:.1f} min; load average (1/5/15 min) "
            f"before {_load(meta, 'before')}, after {_load(meta, 'after')} (other work shares the host "
            "when these exceed the CPU count)."]),
        f"* Machine: {m['nproc']} CPUs (`nproc`), {m['cpu_model']}, {m['ram_gib']} GiB RAM"
        + (f", GPU {', '.join(m['gpu'])}" if m.get("gpu") else ", no GPU (SGLang CPU engine)") + ".",
        f"* Versions: sglang {v['sglang']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"sglang-dflash {v['sglang-dflash']} (git {v['git_commit']}{', dirty' if v['git_dirty'] else ''}).",
        f"* Models: target `{common.repo_relative(opts['target'])}`, "
        f"drafter `{common.repo_relative(opts['drafter'])}`.",
        f"* Load: `sglang.bench_serving` (backend `sglang`, dataset `custom` = bundled prompts with the "
        f"target's chat template, streaming), temperature {opts['temperature']}, "
        f"{opts['max_new_tokens']} new tokens per request ({'EOS allowed' if opts['allow_eos'] else 'ignore_eos'}), "
        f"requests per cell = max({opts['min_requests']}, {opts['requests_per_slot']} x concurrency)"
        + (f" (fixed {opts['requests']})" if opts["requests"] else "")
        + f", {opts['repeats']} repeat(s), warm-up of min(c, {opts['warmup_requests']}) 8-token requests per cell "
        f"(not measured), prefix cache flushed before each measured run; schedule `{opts['schedule']}`"
        + (", fresh server processes for every repetition" if opts.get("restart_each_rep") else "") + "."
        + _excluded_note(opts),
        f"* Servers: `--max-running-requests {opts['max_running_requests']} --max-total-tokens "
        f"{opts['max_total_tokens']} --sleep-on-idle` (+ CPU defaults of `sglang-dflash serve` on a host "
        f"without CUDA).",
        "* Cells: median over repeats, [min-max] when repeats > 1. Speedups are taken within a "
        "repetition against plain decoding at the same workload and concurrency: throughput = "
        "output tok/s ratio, TPOT = plain median TPOT / config median TPOT. AL = acceptance length "
        "(accepted drafts + bonus per verify step), pooled over the cell's verify steps from the "
        "per-request `spec_correct_drafts_histogram`. On = fraction of the server's decode steps "
        "that speculated (delta of `/server_info` dflash counters over the cell). Peak RSS = "
        "VmHWM summed over the server's process tree, reset before each cell (shared pages count "
        "once per process).",
        "",
        "### Configurations",
        "",
        "| config | what | state | start-up s | server command |",
        "|---|---|---|---|---|",
    ]
    for name, st in report["configs"].items():
        state = st.get("state", "?")
        if st.get("reason"):
            state += ": " + st["reason"].replace("|", PIPE)
        if st.get("note"):
            state += f" ({st['note']})"
        command = common.repo_relative(st["command"]).replace("|", PIPE)
        lines.append(f"| {name} | {st['description']} | {state} | {fmt(st.get('startup_s'), 0)} | "
                     f"`{command}` |")
    errors = [c for c in report["cells"] if "error" in c]
    if errors:
        lines += ["", f"{len(errors)} cell(s) failed:", ""]
        lines += [f"* {c['config']}/{c['workload']}/c{c['concurrency']}/rep{c['rep']}: "
                  f"{c['error'][:200]}" for c in errors]
    for w in opts["workloads"]:
        rows = [r for r in summary if r["workload"] == w]
        if not rows:
            continue
        lines += ["", f"### {w} ({WORKLOAD_SOURCES[w]})", "",
                  "| c | config | out tok/s | speedup (tok/s) | speedup (TPOT) | TPOT ms p50 / p90 / p99 "
                  "| TTFT ms p50 / p90 / p99 | AL | on | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            tpot = " / ".join(fmt(r[k] and r[k]["median"], 1) for k in (
                "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms"))
            ttft = " / ".join(fmt(r[k] and r[k]["median"], 0) for k in (
                "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"))
            speed = "1 (baseline)" if r["config"] == "plain" else fmt_spread(r["speedup_throughput"])
            tspeed = "1 (baseline)" if r["config"] == "plain" else fmt_spread(r["speedup_tpot"])
            lines.append(
                f"| {r['concurrency']} | {r['config']} | {fmt_spread(r['output_throughput'], 1)} | "
                f"{speed} | {tspeed} | {tpot} | {ttft} | {fmt_spread(r['acceptance_length'])} | "
                f"{fmt_spread(r['spec_on_ratio'])} | {fmt(r['peak_rss_mib'] and r['peak_rss_mib']['median'], 0)} |")
        imgs = [p for p in plots if os.path.basename(p).endswith(f"_{w}.png")]
        if imgs:
            lines.append("")
            lines += [f"![{os.path.basename(p)}]({img_prefix}{os.path.basename(p)})" for p in imgs]
    lines += adaptive_criteria_md(report)
    return "\n".join(lines) + "\n"


# Concurrency-aware speculation, what must hold in every cell (medians of
# per-repetition ratios): adaptive >= 0.97 x plain; adaptive >= 0.95 x the
# better of always-on and off; at concurrency 1, adaptive >= 0.95 x always-on.
CRITERIA = {"vs_plain": 0.97, "vs_best_fixed": 0.95, "vs_on_at_c1": 0.95}


def adaptive_criteria(cells: list[dict], adaptive: str = "dflash-adaptive") -> list[dict]:
    """Per (workload, concurrency): the adaptive policy's throughput ratios
    against plain, the better of on/off, and on, each the median over
    repetitions of the ratio within a repetition; and, not criteria, the
    off server's ratio against plain (both decode plainly: its spread is the
    noise the criteria are judged in) and, with `dflash-on-2` in the run,
    its ratio against `dflash-on` (two identical servers: the same noise,
    measured where speculation runs)."""
    ok = {(c["workload"], c["concurrency"], c["config"], c["rep"]): c["output_throughput"]
          for c in cells if "error" not in c and c.get("completed") and c.get("output_throughput")}
    keys = sorted({(w, conc, rep) for (w, conc, name, rep) in ok if name == adaptive})
    ratios: dict = {}
    for w, conc, rep in keys:
        ad = ok[(w, conc, adaptive, rep)]
        on, off, plain, on2 = (ok.get((w, conc, n, rep))
                               for n in ("dflash-on", "dflash-off", "plain", "dflash-on-2"))
        entry = ratios.setdefault((w, conc), {"vs_plain": [], "vs_best_fixed": [], "vs_on": [],
                                              "off_vs_plain": [], "on2_vs_on": []})
        if on and on2:
            entry["on2_vs_on"].append(on2 / on)
        if plain:
            entry["vs_plain"].append(ad / plain)
            if off:  # the zero-speculation control: host noise plus the off path's cost
                entry["off_vs_plain"].append(off / plain)
        if on and off:
            entry["vs_best_fixed"].append(ad / max(on, off))
        if on:
            entry["vs_on"].append(ad / on)
    rows = []
    for (w, conc), entry in ratios.items():
        row = {"workload": w, "concurrency": conc}
        for k, values in entry.items():
            row[k] = spread(values)
        med = {k: (row[k] or {}).get("median") for k in entry}
        checks = [med["vs_plain"] is None or med["vs_plain"] >= CRITERIA["vs_plain"],
                  med["vs_best_fixed"] is None or med["vs_best_fixed"] >= CRITERIA["vs_best_fixed"]]
        if conc == 1:
            checks.append(med["vs_on"] is None or med["vs_on"] >= CRITERIA["vs_on_at_c1"])
        row["pass"] = all(checks)
        rows.append(row)
    return rows


def adaptive_criteria_md(report: dict) -> list[str]:
    """One criteria table per adaptive configuration in the run (the default
    policy and its diagnostic variants)."""
    names = sorted({c["config"] for c in report["cells"]
                    if c["config"].startswith("dflash-adaptive")})
    return [line for name in names for line in _criteria_table(report["cells"], name)]


def _criteria_table(cells: list[dict], adaptive: str) -> list[str]:
    rows = adaptive_criteria(cells, adaptive)
    if not rows:
        return []
    passed = sum(r["pass"] for r in rows)
    twin = any(r["on2_vs_on"] for r in rows)  # dflash-on-2 in the run
    lines = ["", f"### `{adaptive}` against the adaptive policy's criteria", "",
             f"Throughput ratios of `{adaptive}`, median [min-max] over repetitions of the ratio "
             f"within a repetition. Criteria: >= {CRITERIA['vs_plain']} x plain in every cell; "
             f">= {CRITERIA['vs_best_fixed']} x the better of `dflash-on` and `dflash-off`; at "
             f"concurrency 1, >= {CRITERIA['vs_on_at_c1']} x `dflash-on`. "
             f"**{passed} of {len(rows)} cells pass.** Control, not a criterion: `off vs plain`, "
             f"`dflash-off` (plain decoding through our worker) against plain in the same "
             f"repetition; its spread is the host's noise plus the off path's cost"
             + (", and `on-2 vs on`, two identical always-on servers" if twin else "") + ".", "",
             "| workload | c | vs plain | vs max(on, off) | vs on | pass | off vs plain |"
             + (" on-2 vs on |" if twin else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if twin else "")]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['concurrency']} | {fmt_spread(r['vs_plain'])} | "
                     f"{fmt_spread(r['vs_best_fixed'])} | {fmt_spread(r['vs_on'])} | "
                     f"{'yes' if r['pass'] else '**no**'} | {fmt_spread(r['off_vs_plain'])} |"
                     + (f" {fmt_spread(r['on2_vs_on'])} |" if twin else ""))
    return lines


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="c in {1,8,32}, 1 repeat, few requests")
    mode.add_argument("--tiny", action="store_true", help="one cell, plain vs dflash-on (tests)")
    p.add_argument("--target", help="target model dir (default: the bundled demo pair)")
    p.add_argument("--drafter", help="DFlash drafter dir (default: the bundled demo pair)")
    p.add_argument("--configs", help=f"comma list from {','.join(CONFIGS)}")
    p.add_argument("--workloads", help="comma list from math,code,chat")
    p.add_argument("--concurrency", help="comma list, e.g. 1,4,8,16,32,64")
    p.add_argument("--repeats", type=int)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--requests", type=int, help="requests per cell (default: the formula below)")
    p.add_argument("--min-requests", type=int, help="requests per cell >= this")
    p.add_argument("--requests-per-slot", type=int, help="requests per cell >= this x concurrency")
    p.add_argument("--warmup-requests", type=int, help="warm-up requests per cell: min(c, this)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--allow-eos", action="store_true",
                   help="let requests stop at EOS (default: ignore_eos, fixed output length)")
    p.add_argument("--block-size", type=int, help="DFLASH --speculative-num-draft-tokens")
    p.add_argument("--max-running-requests", type=int, help="default max(64, max concurrency)")
    p.add_argument("--max-total-tokens", type=int,
                   help="default: fits max-running-requests x (longest prompt + new tokens + block)")
    p.add_argument("--server-args", help="extra arguments for every server, one shell string")
    p.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved: all servers up, configs alternate within each cell "
                        "(fairest); sequential: one server at a time")
    p.add_argument("--restart-each-rep", action="store_true",
                   help="interleaved: fresh server processes for every repetition (a process's "
                        "own speed then varies between repetitions instead of biasing every one)")
    p.add_argument("--parallel-start", action="store_true",
                   help="interleaved: launch all servers at once (faster start-up, but adaptive "
                        "servers then profile their step costs on a busy host)")
    p.add_argument("--min-free-mib", type=int, default=2500,
                   help="interleaved: skip a server if less memory than this is available")
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output dir (default benchmark/results/<mode>)")
    p.add_argument("--results-md", help="Markdown file whose section to update (default: "
                   "benchmark/RESULTS.md for the full and quick grids with the default --out)")
    p.add_argument("--section", help="RESULTS.md section (and heading) to write; default: the mode's "
                   "(grid, grid-quick). Give one for a partial grid so the full grid's stays")
    p.add_argument("--keep-logs", action="store_true", help="keep server / bench_serving logs in OUT/logs")
    p.add_argument("--from-json", help="only re-render the reports (tables, plots, RESULTS.md section) "
                   "from an existing grid.json; runs nothing")
    opts = p.parse_args(argv)
    opts.out_given = opts.out
    opts.mode = "quick" if opts.quick else "tiny" if opts.tiny else "full"
    preset = PRESETS[opts.mode]
    opts.configs = opts.configs.split(",") if opts.configs else list(preset["configs"])
    opts.workloads = opts.workloads.split(",") if opts.workloads else list(preset["workloads"])
    opts.concurrency = ([int(c) for c in opts.concurrency.split(",")] if opts.concurrency
                        else list(preset["concurrency"]))
    for key in ("repeats", "max_new_tokens", "min_requests", "requests_per_slot", "warmup_requests"):
        if getattr(opts, key) is None:
            setattr(opts, key, preset[key])
    unknown = [c for c in opts.configs if c not in CONFIGS] + [w for w in opts.workloads if w not in WORKLOADS]
    if unknown:
        p.error(f"unknown config/workload {unknown}")
    if "plain" in opts.configs:  # the baseline is measured first in each cell's rotation base
        opts.configs = ["plain"] + [c for c in opts.configs if c != "plain"]
    default_out = os.path.join(common.RESULTS_DIR, opts.mode)
    if opts.results_md is None and not opts.out and not opts.from_json and preset["section"]:
        opts.results_md = common.RESULTS_MD
    opts.section = opts.section or preset["section"] or f"grid-{opts.mode}"
    opts.out = os.path.abspath(opts.out or default_out)
    if not opts.target or not opts.drafter:
        from sglang_dflash.demo import demo_pair

        target, drafter = demo_pair()
        opts.target = opts.target or target
        opts.drafter = opts.drafter or drafter
    opts.target, opts.drafter = os.path.abspath(opts.target), os.path.abspath(opts.drafter)
    if opts.max_running_requests is None:
        opts.max_running_requests = max(64, max(opts.concurrency))
    return opts


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the servers


def main(argv=None) -> int:
    t_start = time.monotonic()
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:  # fail before minutes of serving, not after
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("grid.py needs matplotlib for its plots: pip install matplotlib (or -e '.[bench]')")

    if opts.from_json:
        with open(opts.from_json) as f:
            report = json.load(f)
        out = os.path.abspath(opts.out_given or os.path.dirname(os.path.abspath(opts.from_json)))
        mode = report["meta"]["mode"]
        section = (opts.section or report["meta"].get("section")
                   or (PRESETS.get(mode) or {}).get("section") or f"grid-{mode}")
        render(report, out, opts.results_md, section)
        return 0
    on_cuda = common.cuda_available()
    os.makedirs(opts.out, exist_ok=True)
    sets = prompt_sets(opts.target, opts.workloads, opts.max_new_tokens, opts.block_size or 16)
    if opts.max_total_tokens is None:
        longest = max(entry["longest"] for entry in sets.values())
        per_req = longest + opts.max_new_tokens + 2 * (opts.block_size or 16)
        opts.max_total_tokens = max(
            16384, math.ceil(opts.max_running_requests * per_req * 1.25 / 1024) * 1024)
    load_before = os.getloadavg()
    log_ctx = (contextlib.nullcontext(os.path.join(opts.out, "logs")) if opts.keep_logs
               else tempfile.TemporaryDirectory(prefix="grid-logs-"))
    with log_ctx as log_dir:
        os.makedirs(log_dir, exist_ok=True)
        n_max = max(requests_for(c, opts) for c in opts.concurrency)
        prompt_files = write_prompt_files(sets, n_max, log_dir)
        bench = BenchServing(os.path.join(log_dir, "bench_serving.log"))
        print(f"[grid] {opts.mode}: configs {opts.configs}, workloads {opts.workloads}, "
              f"concurrency {opts.concurrency}, repeats {opts.repeats}; logs in {log_dir}", flush=True)
        cells, statuses = run_grid(opts, bench, prompt_files, log_dir, on_cuda)
        bench_lines = _compact_jsonl(os.path.join(log_dir, "bench_serving.jsonl"))
    settings = {k: getattr(opts, k) for k in (
        "configs", "workloads", "concurrency", "repeats", "max_new_tokens", "requests", "min_requests",
        "requests_per_slot", "warmup_requests", "temperature", "top_p", "allow_eos", "block_size",
        "max_running_requests", "max_total_tokens", "server_args", "schedule", "restart_each_rep", "seed", "target",
        "drafter")}
    settings["unique_prompts"] = {w: f["unique_prompts"] for w, f in prompt_files.items()}
    settings["excluded_prompts"] = {w: f["excluded_prompts"] for w, f in prompt_files.items()}
    command = [os.path.relpath(os.path.abspath(sys.argv[0]), common.REPO)] if argv is None else [
        "benchmark/grid.py"]
    report = {
        "meta": {
            "mode": opts.mode,
            # A non-default section names a partial grid (its heading too).
            "section": None if opts.section == (PRESETS[opts.mode]["section"] or f"grid-{opts.mode}")
            else opts.section,
            "command": "python " + shlex.join(command + (sys.argv[1:] if argv is None else list(argv))),
            "date": common.now_iso(),
            "machine": common.machine_info(),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
            "versions": common.versions(),
            "settings": settings,
            "wall_s": time.monotonic() - t_start,
        },
        "configs": statuses,
        "summary": None,
        "cells": cells,
        "bench_serving_results": bench_lines,
    }
    render(report, opts.out, opts.results_md, opts.section)
    failed = [c for c in cells if "error" in c]
    return 1 if not cells or len(failed) == len(cells) else 0


def _excluded_note(opts: dict) -> str:
    excluded = {w: n for w, n in (opts.get("excluded_prompts") or {}).items() if n}
    if not excluded:
        return ""
    parts = ", ".join(f"{w} {n} of {n + opts['unique_prompts'][w]}" for w, n in excluded.items())
    return f" Prompts too long for the target's context with the new tokens were left out ({parts})."


def render(report: dict, out: str, results_md: str | None, section: str) -> None:
    """Summary, plots, grid.json and grid.md in `out`; the section of results_md."""
    os.makedirs(out, exist_ok=True)
    settings = argparse.Namespace(**report["meta"]["settings"])
    summary = summarise(report["cells"], settings)
    report["summary"] = summary
    plots = plot(summary, settings, out)
    report["plots"] = [os.path.basename(p) for p in plots]
    common.write_json(os.path.join(out, "grid.json"), report, compact=True)
    with open(os.path.join(out, "grid.md"), "w") as f:
        f.write(markdown(report, summary, plots, img_prefix=""))
    if results_md:
        rel = os.path.relpath(out, os.path.dirname(os.path.abspath(results_md)))
        common.update_section(results_md, section, markdown(report, summary, plots, img_prefix=rel + "/"))
    print(f"[grid] wrote {out}/grid.json, grid.md and {len(plots)} plot(s)"
          + (f"; updated {results_md} [{section}]" if results_md else "")
          + f"; run took {report['meta']['wall_s'] / 60:.1f} min", flush=True)


def _compact_jsonl(path: str) -> list[dict]:
    """bench_serving's --output-file lines, without the server_info dump each carries."""
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    row.pop("server_info", None)
                    out.append(row)
    return out


if __name__ == "__main__":
    sys.exit(main())
