"""At most one host read of device values per decode step in the worker's own code
(the target model's forward excluded), counted on the real engine with the
diagnostic SGLANG_DFLASH_CHECK_SYNCS=1 (host_syncs.py; on this CPU host every
tensor stands in for a CUDA one). Greedy, sampled and seeded batches, always-on
and adaptive (W = 0 steps). Seeded requests draw their uniforms from (seed,
position) on the device (randomness.py, unit-tested for batch independence)."""

import pytest

from harness import Job, chat_prompts, dflash_args, run_engines

BUDGET = 1  # the longest context's length, read once to size the drafter's context gather
CASES = [('{"mode": "on"}', "dflash2-random"), ('{"mode": "adaptive"}', "drafter-trained")]


@pytest.fixture(scope="module")
def engines():
    """Each case's runs and dflash state, the engines started together."""
    prompts = chat_prompts(6)
    runs = [
        {"name": "greedy", "prompts": prompts, "batch_size": 3,
         "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0}},
        {"name": "sampled", "prompts": prompts, "batch_size": 3,
         "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0.8, "top_p": 0.9, "top_k": 20}},
        {"name": "seeded", "prompts": prompts[:3], "batch_size": 3,
         "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, "temperature": 1.0, "sampling_seed": 7}},
    ]
    jobs = [Job(dflash_args(drafter), runs, True, {"SGLANG_DFLASH_CHECK_SYNCS": "1", "SGLANG_DFLASH_POLICY": policy})
            for policy, drafter in CASES]
    return dict(zip(CASES, run_engines(jobs)))


@pytest.mark.parametrize("policy, drafter", CASES)
def test_decode_step_reads_the_host_at_most_once(engines, policy, drafter):
    out, state = engines[policy, drafter]
    syncs = state["host_syncs"]
    assert syncs["decode_steps"] > 20, syncs
    assert syncs["max_per_step"] <= BUDGET, syncs
    assert all(len(r["output_ids"]) == 24 for run in out.values() for r in run["results"])
