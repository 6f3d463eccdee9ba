# Throwaway load driver (twentieth session): one sgl.Engine, policy MODE, BS fixed-length requests at a time.
import json, os, sys, time
if __name__ == "__main__":
    mode = sys.argv[1]; bs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    secs = float(sys.argv[2])
    from sglang_dflash import cpu_runtime
    cpu_runtime.activate()
    import sglang as sgl
    from sglang_dflash.cli import CPU_ENGINE_DEFAULTS
    from sglang_dflash.demo import demo_pair
    target, drafter = demo_pair()
    kw = {**CPU_ENGINE_DEFAULTS, "dtype": "float32", "max_total_tokens": 32768, "log_level": "warning",
          "random_seed": 0, "model_path": target}
    if mode != "plain":
        os.environ["SGLANG_DFLASH_POLICY"] = json.dumps({"mode": mode})
        kw.update(speculative_algorithm="DFLASH", speculative_draft_model_path=drafter)
    e = sgl.Engine(**kw)
    print("READY", flush=True)
    t_end = time.time() + secs
    n = 0
    t0 = time.perf_counter(); toks = 0
    while time.time() < t_end:
        e.generate(prompt=[f"Run {n} {i}. " + " ".join(f"w{(j*i+j)%97}" for j in range(20 + 15 * (i % 4))) for i in range(bs)],
                   sampling_params={"max_new_tokens": 256, "temperature": 0.0, "ignore_eos": True})
        n += 1; toks += 256 * bs
    print("tok/s", toks / (time.perf_counter() - t0), flush=True)
    e.shutdown()
