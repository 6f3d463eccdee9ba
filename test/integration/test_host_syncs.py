"""At most one host read of device values per decode step in the worker's own code
(the target model's forward excluded), counted on the real engine with the
diagnostic SGLANG_DFLASH_CHECK_SYNCS=1 (host_syncs.py; on this CPU host every
tensor stands in for a CUDA one). Greedy, sampled and seeded batches, always-on
adaptive (W = 0 steps), and off with its steps as one-row verifies (one_row_verify.py,
the path a CUDA server replays captured graphs for). Seeded requests draw their uniforms from (seed,
position) on the device (randomness.py, unit-tested for batch independence)."""

import pytest

from harness import Job, chat_prompts, dflash_args, run_engines

BUDGET = 1  # the longest context's length, read once to size the drafter's context gather
CASES = [('{"mode": "on"}', "dflash2-random", ""), ('{"mode": "adaptive"}', "drafter-trained", ""),
         ('{"mode": "off"}', "drafter-trained", "1")]


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
    jobs = [Job(dflash_args(drafter), runs, True, {"SGLANG_DFLASH_CHECK_SYNCS": "1", "SGLANG_DFLASH_POLICY": policy,
                                                   **({"SGLANG_DFLASH_ONE_ROW_OFF": one_row} if one_row else {})})
            for policy, drafter, one_row in CASES]
    return dict(zip(CASES, run_engines(jobs)))


@pytest.mark.parametrize("policy, drafter, one_row", CASES)
def test_decode_step_reads_the_host_at_most_once(engines, policy, drafter, one_row):
    out, state = engines[policy, drafter, one_row]
    syncs = state["host_syncs"]
    assert syncs["decode_steps"] > 20, syncs
    assert syncs["max_per_step"] <= BUDGET, syncs
    assert all(len(r["output_ids"]) == 24 for run in out.values() for r in run["results"])
    if one_row:
        assert state["one_row_verify"]["steps"] == syncs["decode_steps"], state
