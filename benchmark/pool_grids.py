#!/usr/bin/env python
"""Pool the repetitions of several runs of the same grid into one report.

Two runs of one grid command (same configs, workloads, concurrency and load
settings, same kind of host) are samples of the same cells; pooled, a cell's
median is taken over all their repetitions, which the 5% criteria need on a
host where two identical servers differ by up to 10-20% in one repetition
(docs/decisions.md, "The noise yardstick"). Ratios stay within a repetition:
each run's repetitions are renumbered after the previous run's, so no
repetition of one run is paired with one of another.

The sources are named in the report (command, date, commit, repetitions); each
run's own report stays where it is.

    python benchmark/pool_grids.py RUN_A/grid.json RUN_B/grid.json --out POOLED_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import common
import grid_report

# The one setting pooled runs may differ in: their repetitions (summed).
_FREE = {"repeats"}
# A cell's raw per-request rows stay in each run's own grid.json (megabytes; no
# table reads them), as do bench_serving's output lines.
_RAW = {"requests"}


def _settings_key(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in _FREE}


def pool(reports: list[dict]) -> dict:
    """One report whose cells are all the runs' cells, repetitions renumbered."""
    if len(reports) < 2:
        raise SystemExit("pool_grids: give at least two grid.json files")
    first = reports[0]["meta"]
    for r in reports[1:]:
        meta = r["meta"]
        a, b = _settings_key(first["settings"]), _settings_key(meta["settings"])
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if differ:
            raise SystemExit(f"pool_grids: the runs differ in {', '.join(differ)}; "
                             "only runs of the same grid can be pooled")
        hosts = [(m["machine"]["nproc"], m["machine"]["cpu_model"]) for m in (first, meta)]
        if hosts[0] != hosts[1]:
            raise SystemExit(f"pool_grids: different hosts {hosts[0]} and {hosts[1]}")
    cells, offset = [], 0
    for r in reports:
        for c in r["cells"]:
            cell = {k: v for k, v in c.items() if k not in _RAW}
            cells.append(dict(cell, rep=c["rep"] + offset))
        offset += r["meta"]["settings"]["repeats"]
    settings = dict(first["settings"], repeats=offset)
    sources = [{"command": r["meta"]["command"], "date": r["meta"]["date"],
                "git_commit": r["meta"]["versions"]["git_commit"],
                "repeats": r["meta"]["settings"]["repeats"]} for r in reports]
    commits = list(dict.fromkeys(r["meta"]["versions"]["git_commit"] for r in reports))
    versions = dict(first["versions"], git_commit=" + ".join(commits),
                    git_dirty=any(r["meta"]["versions"]["git_dirty"] for r in reports))
    meta = dict(first, settings=settings, versions=versions, date=common.now_iso(), load_average=None,
                wall_s=sum(r["meta"]["wall_s"] for r in reports), pooled_from=sources)
    return {"meta": meta, "configs": reports[0]["configs"], "summary": None, "cells": cells,
            "bench_serving_results": []}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="grid.json files of runs of the same grid")
    p.add_argument("--out", required=True, help="output dir (grid.json, grid.md, plots)")
    opts = p.parse_args(argv)
    reports = []
    for path in opts.reports:
        with open(path) as f:
            reports.append(json.load(f))
    report = pool(reports)
    report["meta"]["command"] = common.command_line("benchmark/pool_grids.py", argv)
    grid_report.render(report, os.path.abspath(opts.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
