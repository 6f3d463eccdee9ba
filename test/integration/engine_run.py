"""Run one sgl.Engine configuration over prompt groups and write JSON results.

Used by the integration tests in a subprocess (the CPU runtime must be set up
before SGLang is imported, and the engine spawns processes):

    python engine_run.py SPEC.json OUT.json

SPEC: {"engine": {sgl.Engine kwargs}, "runs": [{"name", "prompts" | "input_ids",
"batch_size", "sampling_params"[, "lora_path": one per prompt][, "load_lora": {name: path},
loaded into the engine before the run]}]}. OUT also holds the server's dflash state
after the last run (`/get_server_info`'s internal_states[0]["dflash"]). Each run submits its prompts in groups of
`batch_size` (one `generate` call per group, so the decode batch holds up to
that many requests) and records output ids and meta_info per prompt.
"""

import json
import sys
import time


def _run(engine, run):
    items = run.get("input_ids") or run["prompts"]
    key = "input_ids" if "input_ids" in run else "prompt"
    bs = int(run["batch_size"])
    for name, path in run.get("load_lora", {}).items():
        engine.load_lora_adapter(name, path)
    loras = run.get("lora_path")
    results = []
    t0 = time.time()
    for start in range(0, len(items), bs):
        group = items[start : start + bs]
        extra = {} if loras is None else {"lora_path": loras[start : start + bs]}
        outs = engine.generate(**{key: group}, sampling_params=run["sampling_params"], **extra)
        for out in outs:
            results.append(
                {
                    "output_ids": out["output_ids"],
                    "text": out.get("text"),
                    "meta_info": {
                        k: out["meta_info"].get(k)
                        for k in ("finish_reason", "completion_tokens", "spec_accept_length", "spec_verify_ct", "num_retractions", "cached_tokens")
                    },
                }
            )
    return {"name": run["name"], "seconds": time.time() - t0, "results": results}


def main():
    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()
    import sglang as sgl

    spec = json.load(open(sys.argv[1]))
    engine = sgl.Engine(**spec["engine"])
    try:
        runs = [_run(engine, run) for run in spec["runs"]]
        states = engine.get_server_info().get("internal_states") or [{}]
    finally:
        engine.shutdown()
    json.dump({"runs": runs, "dflash": states[0].get("dflash")}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
