"""Sampled rows rank only what their filters can keep (`rejection.target_probs`'
`ranks` and `probe`, wired in the worker from each request's own filters): on
the real engine, the same tokens as sorting the whole vocabulary for every
sampled row (SGLANG_DFLASH_FULL_SORT=1), for requests with

* temperature only (no ranking: the softmax as is);
* a top-k, with top-p / min-p on top (the top-k bounds the ranking);
* top-p or min-p without a top-k, peaked (the probe of the most probable
  tokens holds) and flat (the nucleus passes the probe: the sort runs);

speculating (DFlash v1 and DFlash 2 drafts) and off (W = 0). Every request
carries a sampling_seed, so its draws are keyed by (seed, position) alone and
the two engines draw the same uniforms; the p's agree to rounding, so the
tokens are the same. One request at a time: SGLang's own first-token sample
(the prefill's) flips between engines when requests batch differently (logits
move by rounding), which would hide what is compared here. Batches that mix
these rows, greedy ones included, are unit-tested (test_rejection.py,
test_verify.py: the same p as the full sort); losslessness against plain
decoding is test_sampling.py's."""

import pytest

from harness import Job, chat_prompts, dflash_args, output_ids, run_engines

ALL = 1 << 30  # SGLang's "no top-k"
NEW = {"max_new_tokens": 20, "ignore_eos": True}


def _params(rows):
    return [{**NEW, "sampling_seed": 11 + i, **row} for i, row in enumerate(rows)]


BATCHES = {
    "temperature only": [{"temperature": t} for t in (0.6, 1.0, 1.3, 0.8)],
    "top-k": [{"temperature": 0.9, "top_k": 5}, {"temperature": 1.1, "top_k": 12, "top_p": 0.8},
              {"temperature": 0.7, "top_k": 3, "min_p": 0.1}, {"temperature": 1.2, "top_k": 40}],
    "top-p peaked": [{"temperature": 0.5, "top_p": 0.3}, {"temperature": 0.6, "min_p": 0.3},
                     {"temperature": 0.4, "top_p": 0.6}, {"temperature": 0.7, "min_p": 0.2}],
    "top-p flat": [{"temperature": 1.5, "top_p": 0.97}, {"temperature": 1.2, "top_p": 0.9},
                   {"temperature": 1.3, "min_p": 0.001}, {"temperature": 1.0, "top_p": 0.99}],
}
CASES = [("on", "drafter-trained"), ("on", "dflash2-random"), ("off", "drafter-trained")]


@pytest.fixture(scope="module")
def engines():
    prompts = chat_prompts(4)
    runs = [{"name": f"{name} {i}", "prompts": [prompt], "batch_size": 1, "sampling_params": params}
            for name, rows in BATCHES.items() for i, (prompt, params) in enumerate(zip(prompts, _params(rows)))]
    jobs = []
    for mode, drafter in CASES:
        policy = {"SGLANG_DFLASH_POLICY": f'{{"mode": "{mode}"}}'}
        jobs += [Job(dflash_args(drafter), runs, env=policy),
                 Job(dflash_args(drafter), runs, env={**policy, "SGLANG_DFLASH_FULL_SORT": "1"})]
    outs = run_engines(jobs)
    return {case: (outs[2 * i], outs[2 * i + 1]) for i, case in enumerate(CASES)}


@pytest.mark.parametrize("mode, drafter", CASES)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_ranked_sampling_draws_the_full_sorts_tokens(engines, mode, drafter, batch):
    ranked, full = engines[mode, drafter]
    names = [f"{batch} {i}" for i in range(len(BATCHES[batch]))]
    got, want = [output_ids(ranked[n]) for n in names], [output_ids(full[n]) for n in names]
    assert all(len(ids) == NEW["max_new_tokens"] for run in want for ids in run)
    assert got == want
