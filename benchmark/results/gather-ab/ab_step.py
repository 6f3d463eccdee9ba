"""Throwaway A/B (twentieth session) of the worker's step speed in separate engines: old (PYTHONPATH at a worktree of c6c6733 in /tmp/old) vs new, on and off, plain as reference. Too noisy to resolve the change; see README.md."""
import json, os, statistics, sys, types
sys.path.insert(0, "/work/main/benchmark")
import off_path
from sglang_dflash.demo import demo_pair

if __name__ == "__main__":
    bss = [int(x) for x in sys.argv[1].split(",")]
    reps = int(sys.argv[2]); out = sys.argv[3]
    opts = types.SimpleNamespace(omp_threads=0, runs=4, prompt_words=100, new_tokens=128)
    target, drafter = demo_pair()
    res = []
    base_pp = os.environ.get("PYTHONPATH")
    for bs in bss:
        for rep in range(reps):
            order = [("old", "on"), ("new", "on"), ("old", "off"), ("new", "off"), ("plain", "plain")]
            if rep % 2:
                order = [("new", "on"), ("old", "on"), ("new", "off"), ("old", "off"), ("plain", "plain")]
            row = {"bs": bs, "rep": rep}
            for ver, cfg in order:
                if ver == "old":
                    os.environ["PYTHONPATH"] = "/tmp/old/python"
                else:
                    os.environ.pop("PYTHONPATH", None)
                row[f"{ver}-{cfg}"] = off_path._measure(cfg, target, drafter, bs, opts)
            os.environ.pop("PYTHONPATH", None)
            print(json.dumps(row), flush=True)
            res.append(row)
            json.dump(res, open(out, "w"), indent=1)
