#!/usr/bin/env python
"""Serving benchmark grid: plain decoding vs DFLASH (policies on / adaptive / off)
vs SGLang's n-gram speculation vs upstream's DFLASH worker, over concurrency and
workloads, with real servers and SGLang's own load generator.

    python benchmark/grid.py                 # the full grid (long: hours on a CPU host)
    python benchmark/grid.py --quick         # c in {1, 8, 32}, 1 repeat, few requests (< 10 min on CPU)
    python benchmark/grid.py --tiny --out D  # one cell, plain vs DFLASH on (the integration test)
    python benchmark/grid.py --from-json D/grid.json  # re-render the report only

The report (grid.json, grid.md, PNG plots) goes to --out (default
benchmark/results/<mode>/, not tracked); grid_report.py renders it and
grid_criteria.py judges the adaptive policy's criteria. benchmark/baseline.py
runs the published baseline through this module.

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
import grid_report  # noqa: E402
from common import Server, ServerStartError, add_hist, fmt  # noqa: E402

WORKLOADS = tuple(grid_report.WORKLOAD_SOURCES)  # math, code, chat


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
    # criteria's 5% (docs/decisions.md, "The noise yardstick").
    "dflash-on-2": ("our DFLASH worker, policy on, a second identical server", "dflash",
                    _policy("on")),
    "dflash-adaptive": ("our DFLASH worker, adaptive policy", "dflash", _policy("adaptive")),
    "dflash-off": ("our DFLASH worker, policy off (zero-speculation control)", "dflash",
                   _policy("off")),
    "ngram": ("SGLang n-gram speculation (--speculative-algorithm NGRAM)", "ngram", {}),
    "upstream-dflash": ("SGLang's own DFLASH worker (SGLANG_DFLASH_UPSTREAM=1)", "dflash",
                        {"SGLANG_DFLASH_UPSTREAM": "1"}),
}
CUDA_ONLY = {"upstream-dflash"}
DIAGNOSTIC = {"plain-sync", "dflash-on-2"}  # not in the full preset

PRESETS = {
    "full": dict(configs=[c for c in CONFIGS if c not in DIAGNOSTIC], workloads=list(WORKLOADS),
                 concurrency=[1, 4, 8, 16, 32, 64], repeats=3, max_new_tokens=128, min_requests=16, requests_per_slot=2,
                 warmup_requests=8),
    # Plain, ours always on, and SGLang's n-gram peer; upstream-dflash only costs a
    # start-up attempt where it cannot run (its state is still reported).
    "quick": dict(configs=["plain", "dflash-on", "ngram", "upstream-dflash"],
                  workloads=list(WORKLOADS), concurrency=[1, 8, 32], repeats=1, max_new_tokens=32,
                  min_requests=2, requests_per_slot=1, warmup_requests=1),
    "tiny": dict(configs=["plain", "dflash-on"], workloads=["math"], concurrency=[4], repeats=1,
                 max_new_tokens=32, min_requests=8, requests_per_slot=1, warmup_requests=2),
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

    from sglang_dflash.tools.prompts import chat_text, load_prompts

    tok = AutoTokenizer.from_pretrained(target)
    context = int(getattr(AutoConfig.from_pretrained(target), "max_position_embeddings", 1 << 30))
    budget = context - max_new_tokens - block_size
    sets = {}
    for w in workloads:
        kept, lengths = [], []
        for p in load_prompts(w):
            n = len(tok.encode(chat_text(tok, p)))
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

    from sglang_dflash.tools.prompts import chat_text

    if n <= 0:
        return
    with open(prompts_path) as f:
        texts = [json.loads(line)["conversations"][0]["content"] for _, line in zip(range(n), f)]
    tok = _tokenizer(opts.target)

    def one(text):
        requests.post(srv.url + "/generate", timeout=600, json={
            "text": chat_text(tok, text),
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": opts.temperature}})

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
            # processes make it scatter that the median over repetitions sees
            # (two identical servers of one launch can differ by 10% and more:
            # docs/decisions.md, "The noise yardstick").
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
    p.add_argument("--keep-logs", action="store_true", help="keep server / bench_serving logs in OUT/logs")
    p.add_argument("--from-json", help="only re-render the report (grid.md, plots) from an existing "
                   "grid.json, into --out or the JSON's directory; runs nothing")
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
    opts.out = os.path.abspath(opts.out or os.path.join(common.RESULTS_DIR, opts.mode))
    if not opts.target or not opts.drafter:
        from sglang_dflash.demo import demo_pair

        target, drafter = demo_pair()
        opts.target = opts.target or target
        opts.drafter = opts.drafter or drafter
    opts.target, opts.drafter = os.path.abspath(opts.target), os.path.abspath(opts.drafter)
    if opts.max_running_requests is None:
        opts.max_running_requests = max(64, max(opts.concurrency))
    return opts


def exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the servers


def require_matplotlib() -> None:
    try:  # fail before minutes of serving, not after
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("grid.py needs matplotlib for its plots: pip install matplotlib (or -e '.[bench]')")


def _fill_max_total_tokens(opts, sets: dict) -> None:
    """Default KV budget: max-running-requests x (longest prompt + new tokens + 2 blocks), +25%."""
    if opts.max_total_tokens is None:
        longest = max(entry["longest"] for entry in sets.values())
        per_req = longest + opts.max_new_tokens + 2 * (opts.block_size or 16)
        opts.max_total_tokens = max(
            16384, math.ceil(opts.max_running_requests * per_req * 1.25 / 1024) * 1024)


def _settings(opts, prompt_files: dict) -> dict:
    """The run's settings as the report records them (what pool_grids.py compares)."""
    settings = {k: getattr(opts, k) for k in (
        "configs", "workloads", "concurrency", "repeats", "max_new_tokens", "requests", "min_requests",
        "requests_per_slot", "warmup_requests", "temperature", "top_p", "allow_eos", "block_size",
        "max_running_requests", "max_total_tokens", "server_args", "schedule", "restart_each_rep",
        "seed", "target", "drafter")}
    settings["unique_prompts"] = {w: f["unique_prompts"] for w, f in prompt_files.items()}
    settings["excluded_prompts"] = {w: f["excluded_prompts"] for w, f in prompt_files.items()}
    return settings


def run(opts, command: str) -> dict:
    """Start the servers, measure every cell, write the report into opts.out;
    returns the report (grid.json's content)."""
    t_start = time.monotonic()
    on_cuda = common.cuda_available()
    os.makedirs(opts.out, exist_ok=True)
    sets = prompt_sets(opts.target, opts.workloads, opts.max_new_tokens, opts.block_size or 16)
    _fill_max_total_tokens(opts, sets)
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
    report = {
        "meta": {
            "mode": opts.mode,
            "command": command,
            "date": common.now_iso(),
            "machine": common.machine_info(),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
            "versions": common.versions(),
            "settings": _settings(opts, prompt_files),
            "wall_s": time.monotonic() - t_start,
        },
        "configs": statuses,
        "summary": None,
        "cells": cells,
        "bench_serving_results": bench_lines,
    }
    grid_report.render(report, opts.out)
    return report


def succeeded(report: dict) -> bool:
    """At least one cell ran without an error."""
    cells = report["cells"]
    return any("error" not in c for c in cells)


def main(argv=None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    require_matplotlib()
    if opts.from_json:
        with open(opts.from_json) as f:
            report = json.load(f)
        out = os.path.abspath(opts.out_given or os.path.dirname(os.path.abspath(opts.from_json)))
        grid_report.render(report, out)
        return 0
    report = run(opts, common.command_line("benchmark/grid.py", argv))
    return 0 if succeeded(report) else 1


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
