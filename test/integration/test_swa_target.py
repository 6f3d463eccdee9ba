"""A hybrid sliding-window target (Laguna) under DFLASH on the CPU engine.

The tiny pair (`tools/tiny_swa.py`): layers 0 and 2 attend over the last 8
tokens, 1 and 3 over everything, and a drafter trained on the target. SGLang
keeps the sliding layers' K/V in a second, smaller pool (`SWAKVPool`, 0.8 of
the full pool's tokens by default) whose slots are the full pool's translated,
and frees a decoding request's out-of-window slots as it goes. The pool here is
small (1024 full slots, 819 windowed) and freed every few tokens
(`SGLANG_SWA_EVICTION_INTERVAL`), so within the two waves of requests the full
slot ids pass the windowed pool's size and the two pools' ids part: SGLang's
own torch_native backend then reads the wrong rows (or fails), which our
backend reads through the translation, and the drafter's context pool must be
sized by the full pool. The radix cache stays on (SGLang's unified tree with a
windowed component), and prompts are prefilled in chunks. Oracle: transformers' greedy choice for plain serving,
then the plain engine for DFLASH: adaptive with the DFlash v1 drafter, and
always on with a drafter in SGLang's Laguna drafter layout
(`DFlashLagunaForCausalLM`, trained on the same target).
"""

import pytest

from harness import Job, chat_prompts, not_transformers_greedy, output_ids, run_engines
from sglang_dflash.demo import tiny_paths

NUM_PROMPTS = 8
GREEDY = {"max_new_tokens": 32, "temperature": 0.0}
PATHS = tiny_paths()
# Chunks of 32 tokens: a prompt's later chunks read its earlier ones' sliding
# layers from the windowed pool (an extend on top of a prefix).
ENGINE = {"model_path": PATHS["swa-target"], "max_total_tokens": 1024, "chunked_prefill_size": 32,
          "dtype": "float32"}
ENV = {"SGLANG_SWA_EVICTION_INTERVAL": "4"}
# name -> (drafter, policy): the v1 drafter under the adaptive policy (widths
# change between steps, W = 0 included), the Laguna-layout one always on.
CASES = {"adaptive": ("swa-drafter-trained", '{"mode": "adaptive", "probe_interval": 8}'),
         "laguna-on": ("swa-drafter-laguna", '{"mode": "on"}')}


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PATHS["swa-target"])
    return [tok(text).input_ids for text in chat_prompts(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def engines(prompts):
    runs = [{"name": "bs4", "input_ids": prompts, "batch_size": 4, "sampling_params": GREEDY}]
    jobs = {"plain": Job(ENGINE, runs, env=ENV)}
    for case, (drafter, policy) in CASES.items():
        dflash = {**ENGINE, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": PATHS[drafter]}
        jobs[case] = Job(dflash, runs, True, {**ENV, "SGLANG_DFLASH_POLICY": policy})
    return dict(zip(jobs, run_engines(list(jobs.values()))))


def test_plain_serving_equals_transformers(engines, prompts):
    served = output_ids(engines["plain"]["bs4"])
    assert all(len(out) == GREEDY["max_new_tokens"] for out in served), [len(out) for out in served]
    wrong = not_transformers_greedy(PATHS["swa-target"], prompts, served)
    assert not wrong, f"{{prompt: positions}} not transformers' greedy choice: {wrong}"


@pytest.mark.parametrize("case", list(CASES))
def test_dflash_greedy_identical_to_plain(engines, case):
    """"laguna-on": SGLang's Laguna drafter layout (gated attention outputs,
    normalized context features), trained on the target: drafts accepted."""
    spec, state = engines[case]
    want, got = output_ids(engines["plain"]["bs4"]), output_ids(spec["bs4"])
    diff = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
    assert len(got) == NUM_PROMPTS and not diff, f"{case}: prompts {diff} differ"
    widths = state["steps_by_width"]
    if case == "adaptive":
        assert state["width_changes"] > 0 and sum(widths) == state["steps"] > 0, state
        return
    assert widths[0] == 0 and state["steps"] > 0, widths
    lengths = [r["meta_info"]["spec_accept_length"] for r in spec["bs4"]["results"]]
    assert sum(lengths) / len(lengths) > 1.5, lengths  # drafts accepted past the window's edge
