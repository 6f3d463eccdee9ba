"""Ragged verify, offline: how well the drafter's confidence predicts acceptance,
and what per-request truncation keeps against what it saves (no server).

    python benchmark/truncation_offline.py [--prompts math,code,chat --n 16
        --max-new-tokens 128 --out FILE.json --results-md benchmark/RESULTS.md
        --section truncation-offline]

Runs the greedy reference loop (`sglang_dflash.acceptance`) with the bundled
demo pair and records, per decode step, the drafter's confidence at each
drafted slot (`select.path_confidence`: the selector walk's peak probability,
the signal `truncate.draft_limits` uses) and the number of drafts the target
accepted. Reports:

* calibration: per confidence bin, the slots reached and the share accepted;
* the trade-off per step and request: verified tokens (anchor + drafts) and
  committed tokens (accepted + bonus) for every uniform width W, and for
  truncation at survival thresholds (the running product of confidences >= t,
  within W = B - 1), replayed on the same steps.

A step's acceptance does not depend on how many drafts were verified beyond
the accepted ones, so the replay is exact for greedy decoding: committed =
min(accepted, verified drafts) + 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import machine_info, now_iso, update_section, write_json  # noqa: E402

THRESHOLDS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
BINS = 10


def record(workload: str, n: int, max_new_tokens: int):
    import torch

    from sglang_dflash import acceptance
    from sglang_dflash.checkpoint import load_drafter
    from sglang_dflash.demo import demo_pair
    from sglang_dflash.train.cli import load_target

    target_dir, drafter_dir = demo_pair()
    target, tokenizer = load_target(target_dir)
    c = target.config
    drafter = load_drafter(drafter_dir, target_hidden_size=c.hidden_size, target_vocab_size=c.vocab_size,
                           target_num_layers=c.num_hidden_layers)
    with torch.no_grad():
        stats = acceptance.acceptance_report(target, tokenizer, drafter,
                                             acceptance.load_prompt_texts(workload, n),
                                             max_new_tokens=max_new_tokens, record_steps=True)
    return stats.step_records, drafter.cfg.block_size - 1


def calibration(records, slots: int) -> list[dict]:
    bins = [[0, 0] for _ in range(BINS)]
    for conf, accepted in records:
        for j in range(min(accepted + 1, slots)):  # slots reached: 0..accepted
            b = min(BINS - 1, int(conf[j] * BINS))
            bins[b][0] += 1
            bins[b][1] += j < accepted
    return [{"low": i / BINS, "reached": r, "accepted": a / r if r else None} for i, (r, a) in enumerate(bins) if r]


def tradeoff(records, slots: int) -> dict:
    steps = len(records)
    uniform = []
    for w in range(slots + 1):
        committed = sum(min(a, w) + 1 for _, a in records) / steps
        uniform.append({"width": w, "verified": w + 1, "committed": committed})
    ragged = []
    for t in THRESHOLDS:
        verified = committed = 0
        for conf, a in records:
            survival, limit = 1.0, 0
            for c in conf[:slots]:
                survival *= c
                if survival < t:
                    break
                limit += 1
            verified += limit + 1
            committed += min(a, limit) + 1
        ragged.append({"threshold": t, "verified": verified / steps, "committed": committed / steps})
    return {"steps": steps, "uniform": uniform, "ragged": ragged}


def _interp_uniform(uniform, verified):
    """Committed tokens of the uniform widths at a fractional verified count."""
    for lo, hi in zip(uniform, uniform[1:]):
        if lo["verified"] <= verified <= hi["verified"]:
            lam = (verified - lo["verified"]) / (hi["verified"] - lo["verified"])
            return lo["committed"] + lam * (hi["committed"] - lo["committed"])
    return uniform[-1]["committed"]


def markdown(result: dict, cmd: str) -> str:
    out = [f"## Ragged verify offline: confidence against acceptance ({result['section']})", "",
           "Command:", "", "```bash", cmd, "```", "",
           f"{result['when']}, {result['machine']}; demo pair, greedy reference loop "
           f"(`sglang_dflash.acceptance`), {result['n']} prompts per workload, {result['max_new_tokens']} "
           f"new tokens; {result['seconds']:.0f} s.", ""]
    out += ["Calibration: share of reached draft slots the target accepted, by the drafter's "
            "confidence at the slot (slots reached in brackets).", "",
            "| workload | " + " | ".join(f"{i / BINS:.1f}-{(i + 1) / BINS:.1f}" for i in range(BINS)) + " |",
            "|---|" + "---|" * BINS]
    for wl, r in result["workloads"].items():
        cells = {round(b["low"] * BINS): b for b in r["calibration"]}
        row = [f"{cells[i]['accepted']:.2f} ({cells[i]['reached']})" if i in cells else "" for i in range(BINS)]
        out.append(f"| {wl} | " + " | ".join(row) + " |")
    out += ["", "Per step and request: tokens verified (anchor + drafts) and committed (accepted + "
            "bonus). Uniform widths W, and truncation at survival thresholds t within W = "
            f"{result['slots']}; 'uniform at same' interpolates the uniform widths at the same "
            "verified count.", "",
            "| workload | steps | setting | verified | committed | uniform at same verified | ragged / uniform |",
            "|---|---|---|---|---|---|---|"]
    for wl, r in result["workloads"].items():
        t = r["tradeoff"]
        for u in t["uniform"]:
            out.append(f"| {wl} | {t['steps']} | W = {u['width']} | {u['verified']:.2f} | {u['committed']:.2f} | | |")
        for g in t["ragged"]:
            same = _interp_uniform(t["uniform"], g["verified"])
            out.append(f"| {wl} | {t['steps']} | t = {g['threshold']} | {g['verified']:.2f} | "
                       f"{g['committed']:.2f} | {same:.2f} | {g['committed'] / same:.3f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", default="math,code,chat")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--results-md", default=None)
    p.add_argument("--section", default="truncation-offline")
    opts = p.parse_args(argv)
    import torch

    torch.set_num_threads(opts.threads)
    start = time.time()
    result = {"when": now_iso(), "machine": f"{machine_info().get('cpu_model')}, {machine_info().get('nproc')} cores",
              "n": opts.n, "max_new_tokens": opts.max_new_tokens, "section": opts.section, "workloads": {}}
    for wl in opts.prompts.split(","):
        records, slots = record(wl, opts.n, opts.max_new_tokens)
        result["slots"] = slots
        result["workloads"][wl] = {"calibration": calibration(records, slots), "tradeoff": tradeoff(records, slots)}
        print(f"{wl}: {len(records)} steps", file=sys.stderr, flush=True)
    result["seconds"] = time.time() - start
    cmd = "python benchmark/truncation_offline.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(result, cmd)
    print(text)
    if opts.out:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        write_json(opts.out, result)
    if opts.results_md:
        update_section(opts.results_md, opts.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
