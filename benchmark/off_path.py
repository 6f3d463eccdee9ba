"""What speculation off costs: plain decoding against DFLASH with the policy
`off` (every step W = 0 through our worker), fixed-length decode, no HTTP.
With `--configs plain,off,on` also always-on (W = 7 every step): the decode
step's own speed without a serving loop, for A/B checks of the worker's code.

The serving grid measures the off path only inside a closed loop (prefills,
EOS, HTTP, the client on the same cores). This isolates the decode step: one
`sgl.Engine` per configuration in a subprocess, `--runs` batches of
`batch_size` distinct prompts each decoding exactly `--new-tokens` tokens
(ignore_eos); the first batch is a warm-up. Reported: decode tokens/s per
batch (median over the batches of a repetition), off / plain per repetition.

    python benchmark/off_path.py --batch-sizes 1,16,48 --repeats 2
    python benchmark/off_path.py --batch-sizes 1,16 --configs plain,off,on
    python benchmark/off_path.py --batch-sizes 16 --temperature 1.0   # sampled

Each repetition starts plain first, then off (then on; alternating the order would
not remove the host's drift between engines; the ratio spread over
repetitions shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import fmt, fmt_spread, machine_info, now_iso, spread, versions  # noqa: E402
from sglang_dflash.cli import CPU_ENGINE_DEFAULTS  # noqa: E402

ENGINE = {**CPU_ENGINE_DEFAULTS, "dtype": "float32", "max_total_tokens": 32768, "log_level": "warning",
          "random_seed": 0}


def _prompts(bs: int, words: int, run: int) -> list[str]:
    """bs distinct prompts, unique per run (no radix-cache hits across runs);
    with `words`, request i has words * (i % 4 + 1) / 4 words (lengths spread
    4x, as a chat batch's are)."""
    if words == 0:
        return [f"Run {run}. Question {i}: what is {i} plus {i * 3}? Explain." for i in range(bs)]
    return [f"Run {run}. " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(words * (i % 4 + 1) // 4))
            + f" story {i}" for i in range(bs)]


def _engine_main(spec_path: str, out_path: str) -> None:
    """Subprocess: one engine, the runs of one configuration, seconds per run."""
    import time

    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()
    import sglang as sgl

    spec = json.load(open(spec_path))
    engine = sgl.Engine(**spec["engine"])
    seconds = []
    try:
        for run in range(spec["runs"]):
            prompts = _prompts(spec["batch_size"], spec["words"], run)
            t0 = time.perf_counter()
            engine.generate(prompt=prompts, sampling_params={
                "max_new_tokens": spec["new_tokens"], "temperature": spec["temperature"], "ignore_eos": True})
            seconds.append(time.perf_counter() - t0)
    finally:
        engine.shutdown()
    json.dump({"seconds": seconds}, open(out_path, "w"))


def _measure(config: str, target: str, drafter: str, bs: int, opts) -> float:
    """Decode tokens/s of one configuration (median over its batches after the warm-up)."""
    engine = {**ENGINE, "model_path": target}
    env = dict(os.environ)
    if opts.omp_threads:
        env["OMP_NUM_THREADS"] = str(opts.omp_threads)
    if config in ("off", "on"):
        engine.update(speculative_algorithm="DFLASH", speculative_draft_model_path=drafter)
        env["SGLANG_DFLASH_POLICY"] = json.dumps({"mode": config})
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        json.dump({"engine": engine, "runs": opts.runs, "batch_size": bs, "words": opts.prompt_words,
                   "new_tokens": opts.new_tokens, "temperature": opts.temperature}, open(spec_path, "w"))
        proc = subprocess.run([sys.executable, __file__, "--engine", spec_path, out_path],
                              capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{config} bs {bs}: engine failed:\n{proc.stderr[-4000:]}")
        seconds = json.load(open(out_path))["seconds"][1:]  # the first batch warms up
    return bs * opts.new_tokens / statistics.median(seconds)


def _table(rows: list[dict], configs: list[str]) -> str:
    others = [c for c in configs if c != "plain"]
    head = ["batch"] + [f"{c} tok/s" for c in configs] + [f"{c} / plain, median [min-max]" for c in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["batch_size"])] + [fmt(statistics.median(r[c]), 0) for c in configs]
        cells += [fmt_spread(r["ratio"][c]) for c in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--batch-sizes", default="1,16,48")
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--prompt-words", type=int, default=0, help="0: short questions; N: N-word prompts")
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0: greedy)")
    p.add_argument("--runs", type=int, default=7, help="batches per engine (the first warms up)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--configs", default="plain,off",
                   help="comma list from plain, off, on (plain is the baseline, always measured first)")
    p.add_argument("--omp-threads", type=int, default=0,
                   help="OMP_NUM_THREADS for both engines (0: torch's default, all cores)")
    p.add_argument("--out", default=None, help="JSON results path (the table also goes beside it, .md)")
    opts = p.parse_args(argv)
    if opts.engine:
        _engine_main(*opts.engine)
        return 0
    from sglang_dflash.demo import demo_pair

    target, drafter = demo_pair()
    configs = ["plain"] + [c for c in opts.configs.split(",") if c and c != "plain"]
    bad = [c for c in configs if c not in ("plain", "off", "on")]
    if bad:
        p.error(f"--configs: unknown {bad} (choose from plain, off, on)")
    rows = []
    for bs in [int(x) for x in opts.batch_sizes.split(",")]:
        row = {"batch_size": bs, **{c: [] for c in configs}, "ratios": {c: [] for c in configs[1:]}}
        for rep in range(opts.repeats):
            for config in configs:
                row[config].append(_measure(config, target, drafter, bs, opts))
            for c in configs[1:]:
                row["ratios"][c].append(row[c][-1] / row["plain"][-1])
            print(f"[off-path] bs {bs} rep {rep}: " + ", ".join(
                f"{c} {row[c][-1]:.0f} tok/s" for c in configs) + ", ratios " + ", ".join(
                f"{c} {row['ratios'][c][-1]:.2f}" for c in configs[1:]), flush=True)
        row["ratio"] = {c: spread(v) for c, v in row["ratios"].items()}
        rows.append(row)
    result = {"when": now_iso(), "machine": machine_info(), "versions": versions(),
              "options": {k: v for k, v in vars(opts).items() if k != "engine"}, "rows": rows}
    print(_table(rows, configs))
    if opts.out:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        with open(opts.out, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(opts.out)[0] + ".md", "w") as f:
            f.write(_markdown(result, rows, configs, opts, argv))
    return 0


def _markdown(result: dict, rows: list, configs: list, opts, argv) -> str:
    """The table with the command and the host it was measured on."""
    cmd = "python benchmark/off_path.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = result["machine"]
    return (f"## Off path against plain decoding\n\nCommand:\n\n```bash\n{cmd}\n```\n\n"
            f"{result['when']}, {machine.get('cpu_model')}, {machine.get('nproc')} cores; "
            f"{opts.new_tokens} new tokens per request, temperature {opts.temperature}, prompts: "
            f"{'short questions' if opts.prompt_words == 0 else f'up to {opts.prompt_words} words'}; "
            f"torch threads: {opts.omp_threads or 'default (all cores)'}.\n\n"
            + _table(rows, configs) + "\n")


if __name__ == "__main__":
    sys.exit(main())
