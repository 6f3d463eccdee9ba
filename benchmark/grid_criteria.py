"""The adaptive policy's pass/fail criteria, judged on a serving grid's cells.

What must hold in every cell (medians over repetitions of the ratio taken within
a repetition): adaptive >= 0.97 x plain; adaptive >= 0.95 x the better of
always-on and off; at concurrency 1, adaptive >= 0.95 x always-on. Reported
beside them, not criteria: off against plain (both decode plainly, so its
spread is the host's noise plus the off path's cost) and, with `dflash-on-2` in
the run, a second always-on server against the first (the same noise where
speculation runs; docs/decisions.md, "The noise yardstick").

Stdlib only: the unit tests and benchmark/baseline.py import this module.
"""

from __future__ import annotations

from common import fmt_spread, spread

CRITERIA = {"vs_plain": 0.97, "vs_best_fixed": 0.95, "vs_on_at_c1": 0.95}
_RATIOS = ("vs_plain", "vs_best_fixed", "vs_on", "off_vs_plain", "on2_vs_on")


def _throughputs(cells: list[dict]) -> dict:
    """(workload, concurrency, config, rep) -> output tok/s of the cells that ran."""
    return {(c["workload"], c["concurrency"], c["config"], c["rep"]): c["output_throughput"]
            for c in cells if "error" not in c and c.get("completed") and c.get("output_throughput")}


def _rep_ratios(tps: dict, w: str, conc: int, rep: int, adaptive: str) -> dict:
    """One repetition's ratios of the adaptive config (absent where a peer did not run)."""
    ad = tps[(w, conc, adaptive, rep)]
    on, off, plain, on2 = (tps.get((w, conc, n, rep))
                           for n in ("dflash-on", "dflash-off", "plain", "dflash-on-2"))
    out = {}
    if plain:
        out["vs_plain"] = ad / plain
        if off:
            out["off_vs_plain"] = off / plain
    if on and off:
        out["vs_best_fixed"] = ad / max(on, off)
    if on:
        out["vs_on"] = ad / on
        if on2:
            out["on2_vs_on"] = on2 / on
    return out


def _passes(row: dict) -> bool:
    """Every criterion whose ratio was measured holds at the median."""
    med = {k: (row[k] or {}).get("median") for k in _RATIOS}
    checks = [med["vs_plain"] is None or med["vs_plain"] >= CRITERIA["vs_plain"],
              med["vs_best_fixed"] is None or med["vs_best_fixed"] >= CRITERIA["vs_best_fixed"]]
    if row["concurrency"] == 1:
        checks.append(med["vs_on"] is None or med["vs_on"] >= CRITERIA["vs_on_at_c1"])
    return all(checks)


def adaptive_criteria(cells: list[dict], adaptive: str = "dflash-adaptive") -> list[dict]:
    """Per (workload, concurrency) where `adaptive` ran: each ratio as a spread
    (median, min, max over repetitions) and whether the cell passes."""
    tps = _throughputs(cells)
    keys = sorted({(w, conc, rep) for (w, conc, name, rep) in tps if name == adaptive})
    ratios: dict = {}
    for w, conc, rep in keys:
        entry = ratios.setdefault((w, conc), {k: [] for k in _RATIOS})
        for k, v in _rep_ratios(tps, w, conc, rep, adaptive).items():
            entry[k].append(v)
    rows = []
    for (w, conc), entry in ratios.items():
        row = {"workload": w, "concurrency": conc, **{k: spread(v) for k, v in entry.items()}}
        row["pass"] = _passes(row)
        rows.append(row)
    return rows


def adaptive_criteria_md(report: dict) -> list[str]:
    """One criteria table per adaptive configuration in the run."""
    names = sorted({c["config"] for c in report["cells"]
                    if c["config"].startswith("dflash-adaptive")})
    return [line for name in names for line in criteria_table(report["cells"], name)]


def criteria_table(cells: list[dict], adaptive: str) -> list[str]:
    """Markdown lines: a heading, what the columns mean, and the table ([] if absent)."""
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
