# Throwaway load driver: one sgl.Engine (demo pair), policy from argv, closed loop of BS chat requests.
import json, os, sys, time
if __name__ == "__main__":
    policy, secs, bs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    os.environ["SGLANG_DFLASH_POLICY"] = policy
    from sglang_dflash import cpu_runtime
    cpu_runtime.activate()
    import sglang as sgl
    from transformers import AutoTokenizer
    from sglang_dflash.cli import CPU_ENGINE_DEFAULTS
    from sglang_dflash.demo import demo_pair
    from sglang_dflash.prompts import load_prompts
    target, drafter = demo_pair()
    tok = AutoTokenizer.from_pretrained(target)
    wl = sys.argv[4] if len(sys.argv) > 4 else "code"
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in load_prompts(wl, 64)]
    prompts = [p for p in prompts if len(tok(p).input_ids) + 128 <= 512]  # fits the demo's context
    kw = {**CPU_ENGINE_DEFAULTS, "max_total_tokens": 32768, "log_level": "warning", "random_seed": 0,
          "model_path": target, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter,
          "max_running_requests": bs}
    e = sgl.Engine(**kw)
    e.generate(prompts[:bs], {"max_new_tokens": 16, "temperature": 0})
    t_end = time.time() + secs; n = 0; toks = 0; t0 = time.perf_counter()
    while time.time() < t_end:
        outs = e.generate([prompts[(n * bs + i) % len(prompts)] for i in range(bs * 12)], {"max_new_tokens": 128, "temperature": 0})
        toks += sum(o["meta_info"]["completion_tokens"] for o in outs); n += 1
    el = time.perf_counter() - t0
    st = e.get_server_info()["internal_states"][0]["dflash"]
    print("RESULT", policy, bs, round(toks / el, 1), st.get("mean_acceptance_length"), st.get("truncated_share"), st.get("verified_drafts_per_request"), st.get("timed_step_ms_by_width")[-1], flush=True)
    e.shutdown()
