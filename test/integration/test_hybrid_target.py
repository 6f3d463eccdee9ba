"""A Gated DeltaNet hybrid target (Qwen3.5 layout) under DFLASH on the CPU engine.

The tiny hybrid pair (`tools/tiny_hybrid.py`): layers 0 and 2 linear attention,
1 and 3 full attention, and a drafter trained on the target, so verifies
accept several drafts and the worker commits the recurrent state at positions
past the anchor. Oracle: the same engine without speculation, which in turn
equals transformers' Qwen3.5 reference (the stand-in's GDN ops serve plain
decoding). Chunked prefill (chunks of 32) makes the prompts' states continue
across chunks. DFLASH runs always on (the whole block), at a fixed width of 2,
off (every decode step a plain DECODE forward through our worker) and adaptive
(the default: the width changes between steps).
"""

import pytest
import torch

from harness import Job, chat_prompts, output_ids, run_engines
from sglang_dflash.demo import tiny_paths

NUM_PROMPTS = 8
BATCH_SIZES = (1, 4)
GREEDY = {"max_new_tokens": 32, "temperature": 0.0}
PATHS = tiny_paths()
# The mamba state pool is otherwise sized from free host memory (gigabytes,
# a minute to allocate); a few slots per running request are plenty. On a CPU
# SGLang's default radix cache for hybrids needs state snapshots it has only on
# GPUs (start-up fails), so it is off here.
ENGINE = {"model_path": PATHS["hybrid-target"], "max_mamba_cache_size": 64, "chunked_prefill_size": 32,
          "disable_radix_cache": True}
POLICIES = {"on": '{"mode": "on"}', "width 2": '{"mode": "fixed", "fixed_width": 2}', "off": '{"mode": "off"}',
            "adaptive": '{"mode": "adaptive", "probe_interval": 8}'}


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(NUM_PROMPTS)


@pytest.fixture(scope="module")
def engines(prompts):
    runs = [{"name": f"bs{bs}", "prompts": prompts, "batch_size": bs, "sampling_params": GREEDY}
            for bs in BATCH_SIZES]
    dflash = {**ENGINE, "speculative_algorithm": "DFLASH",
              "speculative_draft_model_path": PATHS["hybrid-drafter-trained"]}
    jobs = {"plain": Job(ENGINE, runs)}
    for name, policy in POLICIES.items():
        jobs[name] = Job(dflash, runs, True, {"SGLANG_DFLASH_POLICY": policy})
    return dict(zip(jobs, run_engines(list(jobs.values()))))


def test_plain_hybrid_serving_equals_transformers(engines, prompts):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PATHS["hybrid-target"])
    model = AutoModelForCausalLM.from_pretrained(PATHS["hybrid-target"], dtype=torch.float32).eval()
    served = output_ids(engines["plain"]["bs4"])
    for i in range(3):
        ids = tok(prompts[i], return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=GREEDY["max_new_tokens"], do_sample=False)
        want = out[0, ids.shape[1]:].tolist()
        assert served[i] == want[:len(served[i])], f"prompt {i}: plain serving differs from transformers"


@pytest.mark.parametrize("policy", list(POLICIES))
def test_dflash_greedy_identical_to_plain(engines, policy):
    spec, state = engines[policy]
    for name in (f"bs{bs}" for bs in BATCH_SIZES):
        want, got = output_ids(engines["plain"][name]), output_ids(spec[name])
        diff = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
        assert len(got) == NUM_PROMPTS and not diff, f"{policy} {name}: prompts {diff} differ from plain"
    widths = state["steps_by_width"]
    if policy == "off":
        assert widths[0] == state["steps"] > 0, widths
        return
    if policy == "adaptive":  # the default: widths change between steps, W = 0 included
        assert state["width_changes"] > 0 and sum(widths) == state["steps"] > 0, state
        return
    assert widths[0] == 0 and state["steps"] > 0, widths
    lengths = [r["meta_info"]["spec_accept_length"] for r in spec["bs1"]["results"]]
    # Drafts accepted: the state is committed past the anchor on most steps.
    assert sum(lengths) / len(lengths) > 1.5, lengths
