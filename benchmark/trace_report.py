#!/usr/bin/env python
"""Summarize DFLASH step traces (`SGLANG_DFLASH_STEP_TRACE`) per server and stretch of traffic.

A grid run with the variable set makes every DFLASH server append one JSON line
per forward (worker.py `_trace_line`). This splits each server process's lines
into stretches separated by idle gaps (a grid cell, or its workload on a server
that serves several in a row) and reports per stretch: decode steps, prefill
calls, the batch size, the steps per verify width (all and at batch 1), the
share of speculating steps and the mean measured step period per width: which
widths the policy actually ran, cell by cell.

    python benchmark/trace_report.py /tmp/steps.jsonl [--gap 5] [--min-steps 50] [--json]
    python benchmark/trace_report.py RUN_DIR/trace.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import Counter, defaultdict


def read_trace(paths: list[str]) -> dict[int, list[dict]]:
    """pid -> its trace lines in time order."""
    rows: dict[int, list[dict]] = defaultdict(list)
    for path in paths:
        # A trace kept beside a run's results is usually gzipped.
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    rows[int(row["pid"])].append(row)
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"{path}:{n}: not a step-trace line ({e})") from None
    for lines in rows.values():
        lines.sort(key=lambda r: r["t"])
    return dict(rows)


def stretches(lines: list[dict], gap: float, min_steps: int) -> list[list[dict]]:
    """Runs of lines without a pause longer than `gap` seconds, keeping those
    with at least `min_steps` decode steps (drops the grid's warm-up requests)."""
    runs: list[list[dict]] = []
    for row in lines:
        if not runs or row["t"] - runs[-1][-1]["t"] > gap:
            runs.append([])
        runs[-1].append(row)
    return [r for r in runs if sum(x["kind"] == "decode" for x in r) >= min_steps]


def summarize(lines: list[dict]) -> dict:
    decode = [r for r in lines if r["kind"] == "decode"]
    widths = Counter(r["width"] for r in decode)
    at_1 = Counter(r["width"] for r in decode if r["bs"] == 1)
    periods: dict[int, list[float]] = defaultdict(list)
    for r in lines:  # a sample is the period of the decode step before this line
        if r.get("sample"):
            periods[r["sample"][0]].append(r["sample"][2])
    return {
        "seconds": round(lines[-1]["t"] - lines[0]["t"], 2),
        "decode_steps": len(decode),
        "prefills": sum(r["kind"] == "prefill" for r in lines),
        "median_bs": statistics.median(r["bs"] for r in decode) if decode else None,
        "spec_share": round(sum(n for w, n in widths.items() if w) / len(decode), 4) if decode else None,
        "widths": dict(sorted(widths.items())),
        "widths_at_bs1": dict(sorted(at_1.items())),
        "step_ms": {w: round(statistics.fmean(v), 3) for w, v in sorted(periods.items())},
    }


def report(paths: list[str], gap: float = 5.0, min_steps: int = 50) -> list[dict]:
    out = []
    for pid, lines in read_trace(paths).items():
        for i, run in enumerate(stretches(lines, gap, min_steps)):
            out.append({"pid": pid, "stretch": i, **summarize(run)})
    return out


def markdown(rows: list[dict]) -> str:
    head = ("| pid | stretch | s | decode steps | prefills | median bs | speculating | steps per width "
            "| at batch 1 | mean step ms per width |\n|---|---|---|---|---|---|---|---|---|---|\n")

    def fmt(d: dict) -> str:
        return ", ".join(f"{k}: {v}" for k, v in d.items()) or "-"

    return head + "".join(
        f"| {r['pid']} | {r['stretch']} | {r['seconds']} | {r['decode_steps']} | {r['prefills']} "
        f"| {r['median_bs']} | {r['spec_share']} | {fmt(r['widths'])} | {fmt(r['widths_at_bs1'])} "
        f"| {fmt(r['step_ms'])} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", help="JSON-lines files written by SGLANG_DFLASH_STEP_TRACE (.gz: gzipped)")
    p.add_argument("--gap", type=float, default=5.0, help="seconds of silence that end a stretch")
    p.add_argument("--min-steps", type=int, default=50, help="drop stretches with fewer decode steps")
    p.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    opts = p.parse_args(argv)
    rows = report(opts.traces, opts.gap, opts.min_steps)
    sys.stdout.write(json.dumps(rows, indent=1) + "\n" if opts.json else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
