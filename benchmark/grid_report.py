"""The serving grid's report: per-cell summary over repetitions, plots, and the
Markdown tables of benchmark/grid.py (grid.md) and benchmark/baseline.py.

`render(report, out)` writes grid.json, grid.md and the PNG plots into `out`;
the other functions are its parts, reused by baseline.py and pool_grids.py.
matplotlib is imported only when plotting.
"""

from __future__ import annotations

import argparse
import os

import common
from common import add_hist, fmt, fmt_spread, spread
from grid_criteria import adaptive_criteria_md

PIPE = "\\|"  # a literal | inside a Markdown table cell
WORKLOAD_SOURCES = {"math": "GSM8K", "code": "HumanEval", "chat": "MT-Bench"}
METRICS = ("output_throughput", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
           "p90_ttft_ms", "p99_ttft_ms", "acceptance_length", "acceptance_length_per_request",
           "spec_on_ratio", "peak_rss_mib", "sampled_max_rss_mib")
PLOT_KINDS = ("speedup", "throughput", "accept_hist")


# ---------------------------------------------------------------------------
# Summary over repetitions
# ---------------------------------------------------------------------------


def _speedups(reps: list[dict], by_key: dict, w: str, conc: int) -> tuple[list, list]:
    """Throughput and TPOT ratios against plain, each within its repetition."""
    thr, tpot = [], []
    for c in reps:
        base = by_key.get((w, conc, "plain", c["rep"]))
        if base and base["output_throughput"]:
            thr.append(c["output_throughput"] / base["output_throughput"])
        if base and c.get("median_tpot_ms"):
            tpot.append(base["median_tpot_ms"] / c["median_tpot_ms"])
    return thr, tpot


def summarise(cells: list[dict], opts) -> list[dict]:
    """One row per (workload, concurrency, config) that ran: every metric and the
    speedups against plain as spreads over repetitions, and the pooled
    acceptance histogram."""
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
                thr, tpot = _speedups(reps, by_key, w, conc)
                row["speedup_throughput"] = spread(thr)
                row["speedup_tpot"] = spread(tpot)
                hist: list[int] = []
                for c in reps:
                    add_hist(hist, c.get("accept_hist") or [])
                row["accept_hist"] = hist
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------


def _save_figure(plt, fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_LINE_PLOTS = {"speedup": ("speedup_throughput", "output tokens/s relative to plain decoding"),
               "throughput": ("output_throughput", "output tokens/s")}


def _line_plot(plt, rows: list[dict], opts, w: str, kind: str, out_dir: str) -> str:
    """Median per config over concurrency (log2 axis), bars min-max over repeats."""
    metric, ylabel = _LINE_PLOTS[kind]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in opts.configs:
        pts = [r for r in rows if r["config"] == name and r[metric]]
        if not pts or (kind == "speedup" and name == "plain"):
            continue
        xs = [r["concurrency"] for r in pts]
        med = [r[metric]["median"] for r in pts]
        lo = [r[metric]["median"] - r[metric]["min"] for r in pts]
        hi = [r[metric]["max"] - r[metric]["median"] for r in pts]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
    if kind == "speedup":
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="plain = 1")
    ax.set_xscale("log", base=2)
    ax.set_xticks(opts.concurrency, [str(c) for c in opts.concurrency])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{w} ({WORKLOAD_SOURCES[w]}): median, bars min-max over repeats")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_figure(plt, fig, out_dir, f"{kind}_{w}.png")


def _accept_hist_plot(plt, rows: list[dict], w: str, out_dir: str) -> str | None:
    """Acceptance-length histogram per config from the per-request histograms,
    pooled over every cell of the workload (all concurrencies and repeats)."""
    pooled: dict[str, list[int]] = {}
    for r in rows:
        if sum(r["accept_hist"]):
            add_hist(pooled.setdefault(r["config"], []), r["accept_hist"])
    if not pooled:
        return None
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
    return _save_figure(plt, fig, out_dir, f"accept_hist_{w}.png")


def plot(summary: list[dict], opts, out_dir: str, kinds=PLOT_KINDS) -> list[str]:
    """PNG files `<kind>_<workload>.png` in out_dir, workload by workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for w in opts.workloads:
        rows = [r for r in summary if r["workload"] == w]
        if not rows:
            continue
        for kind in kinds:
            path = (_accept_hist_plot(plt, rows, w, out_dir) if kind == "accept_hist"
                    else _line_plot(plt, rows, opts, w, kind, out_dir))
            if path:
                files.append(path)
    return files


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def _load(meta: dict, when: str) -> str:
    values = (meta.get("load_average") or {}).get(when)
    return "/".join(f"{x:.1f}" for x in values) if values else "n/a"


def pooled_note(meta: dict) -> list[str]:
    """For a report of benchmark/pool_grids.py, the runs it pooled (in place of
    the date line of one run); [] for a run's own report."""
    runs = meta.get("pooled_from")
    if not runs:
        return []
    lines = [f"* Pooled on {meta['date']} from {len(runs)} runs of the same grid (wall time "
             f"{meta['wall_s'] / 60:.1f} min in all; repetitions renumbered in this order, ratios stay "
             "within a repetition; dates and load averages in each run's own report):"]
    for i, r in enumerate(runs, 1):
        lines.append(f"  {i}. `{r['command']}` ({r['date']}, git {r['git_commit']}, "
                     f"{r['repeats']} repetition(s))")
    return lines


def excluded_note(settings: dict) -> str:
    excluded = {w: n for w, n in (settings.get("excluded_prompts") or {}).items() if n}
    if not excluded:
        return ""
    parts = ", ".join(f"{w} {n} of {n + settings['unique_prompts'][w]}" for w, n in excluded.items())
    return f" Prompts too long for the target's context with the new tokens were left out ({parts})."


def machine_line(meta: dict) -> str:
    m = meta["machine"]
    return (f"* Machine: {m['nproc']} CPUs (`nproc`), {m['cpu_model']}, {m['ram_gib']} GiB RAM"
            + (f", GPU {', '.join(m['gpu'])}" if m.get("gpu") else ", no GPU (SGLang CPU engine)")
            + ".")


def versions_line(meta: dict) -> str:
    v = meta["versions"]
    return (f"* Versions: sglang {v['sglang']}, torch {v['torch']}, transformers {v['transformers']}, "
            f"sglang-dflash {v['sglang-dflash']} (git {v['git_commit']}"
            f"{', dirty' if v['git_dirty'] else ''}).")


def load_line(opts: dict) -> str:
    """How each cell's load was generated (bench_serving settings, warm-up, schedule)."""
    return (
        f"* Load: `sglang.bench_serving` (backend `sglang`, dataset `custom` = bundled prompts with "
        f"the target's chat template, streaming), temperature {opts['temperature']}, "
        f"{opts['max_new_tokens']} new tokens per request "
        f"({'EOS allowed' if opts['allow_eos'] else 'ignore_eos'}), "
        f"requests per cell = max({opts['min_requests']}, {opts['requests_per_slot']} x concurrency)"
        + (f" (fixed {opts['requests']})" if opts["requests"] else "")
        + f", {opts['repeats']} repeat(s), warm-up of min(c, {opts['warmup_requests']}) 8-token "
        f"requests per cell (not measured), prefix cache flushed before each measured run; "
        f"schedule `{opts['schedule']}`"
        + (", fresh server processes for every repetition" if opts.get("restart_each_rep") else "")
        + "." + excluded_note(opts))


def _header(meta: dict) -> list[str]:
    opts = meta["settings"]
    return [
        f"## Serving grid ({meta['mode']}{', pooled' if meta.get('pooled_from') else ''})",
        "",
        "Command (run from the repository root):",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        *(pooled_note(meta) or [
            f"* Date: {meta['date']}; wall time {meta['wall_s'] / 60:.1f} min; load average "
            f"(1/5/15 min) before {_load(meta, 'before')}, after {_load(meta, 'after')} (other work "
            "shares the host when these exceed the CPU count)."]),
        machine_line(meta),
        versions_line(meta),
        f"* Models: target `{common.repo_relative(opts['target'])}`, "
        f"drafter `{common.repo_relative(opts['drafter'])}`.",
        load_line(opts),
        f"* Servers: `--max-running-requests {opts['max_running_requests']} --max-total-tokens "
        f"{opts['max_total_tokens']} --sleep-on-idle` (+ CPU defaults of `sglang-dflash serve` on a "
        f"host without CUDA).",
        "* Cells: median over repeats, [min-max] when repeats > 1. Speedups are taken within a "
        "repetition against plain decoding at the same workload and concurrency: throughput = "
        "output tok/s ratio, TPOT = plain median TPOT / config median TPOT. AL = acceptance length "
        "(accepted drafts + bonus per verify step), pooled over the cell's verify steps from the "
        "per-request `spec_correct_drafts_histogram`. On = fraction of the server's decode steps "
        "that speculated (delta of `/server_info` dflash counters over the cell). Peak RSS = "
        "VmHWM summed over the server's process tree, reset before each cell (shared pages count "
        "once per process).",
    ]


def config_state(st: dict) -> str:
    """A configuration's start-up state, with the reason and note if any."""
    state = st.get("state", "?")
    if st.get("reason"):
        state += ": " + st["reason"].replace("|", PIPE)
    if st.get("note"):
        state += f" ({st['note']})"
    return state


def _configs_table(report: dict) -> list[str]:
    lines = ["", "### Configurations", "",
             "| config | what | state | start-up s | server command |", "|---|---|---|---|---|"]
    for name, st in report["configs"].items():
        command = common.repo_relative(st["command"]).replace("|", PIPE)
        lines.append(f"| {name} | {st['description']} | {config_state(st)} | "
                     f"{fmt(st.get('startup_s'), 0)} | `{command}` |")
    return lines


def failed_cells(report: dict) -> list[str]:
    errors = [c for c in report["cells"] if "error" in c]
    if not errors:
        return []
    return ["", f"{len(errors)} cell(s) failed:", ""] + [
        f"* {c['config']}/{c['workload']}/c{c['concurrency']}/rep{c['rep']}: {c['error'][:200]}"
        for c in errors]


def _workload_table(rows: list[dict]) -> list[str]:
    lines = ["| c | config | out tok/s | speedup (tok/s) | speedup (TPOT) | TPOT ms p50 / p90 / p99 "
             "| TTFT ms p50 / p90 / p99 | AL | on | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tpot = " / ".join(fmt(r[k] and r[k]["median"], 1) for k in (
            "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms"))
        ttft = " / ".join(fmt(r[k] and r[k]["median"], 0) for k in (
            "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"))
        base = r["config"] == "plain"
        speed = "1 (baseline)" if base else fmt_spread(r["speedup_throughput"])
        tspeed = "1 (baseline)" if base else fmt_spread(r["speedup_tpot"])
        rss = fmt(r["peak_rss_mib"] and r["peak_rss_mib"]["median"], 0)
        lines.append(
            f"| {r['concurrency']} | {r['config']} | {fmt_spread(r['output_throughput'], 1)} | "
            f"{speed} | {tspeed} | {tpot} | {ttft} | {fmt_spread(r['acceptance_length'])} | "
            f"{fmt_spread(r['spec_on_ratio'])} | {rss} |")
    return lines


def images(plots: list[str], w: str, img_prefix: str) -> list[str]:
    """Markdown image lines of the workload's plots."""
    names = [os.path.basename(p) for p in plots if os.path.basename(p).endswith(f"_{w}.png")]
    return [f"![{n}]({img_prefix}{n})" for n in names]


def markdown(report: dict, summary: list[dict], plots: list[str], img_prefix: str = "") -> str:
    """grid.md: the run's header, configurations, one table per workload, criteria."""
    lines = _header(report["meta"]) + _configs_table(report) + failed_cells(report)
    for w in report["meta"]["settings"]["workloads"]:
        rows = [r for r in summary if r["workload"] == w]
        if not rows:
            continue
        lines += ["", f"### {w} ({WORKLOAD_SOURCES[w]})", ""] + _workload_table(rows)
        imgs = images(plots, w, img_prefix)
        if imgs:
            lines += [""] + imgs
    lines += adaptive_criteria_md(report)
    return "\n".join(lines) + "\n"


def summarise_report(report: dict) -> list[dict]:
    """report["summary"], recomputed from the cells (and stored in the report)."""
    settings = argparse.Namespace(**report["meta"]["settings"])
    report["summary"] = summarise(report["cells"], settings)
    return report["summary"]


def render(report: dict, out: str) -> None:
    """Summary, plots, grid.json and grid.md in `out`."""
    os.makedirs(out, exist_ok=True)
    summary = summarise_report(report)
    plots = plot(summary, argparse.Namespace(**report["meta"]["settings"]), out)
    report["plots"] = [os.path.basename(p) for p in plots]
    common.write_json(os.path.join(out, "grid.json"), report, compact=True)
    with open(os.path.join(out, "grid.md"), "w") as f:
        f.write(markdown(report, summary, plots))
    print(f"[grid] wrote {out}/grid.json, grid.md and {len(plots)} plot(s); run took "
          f"{report['meta']['wall_s'] / 60:.1f} min", flush=True)
