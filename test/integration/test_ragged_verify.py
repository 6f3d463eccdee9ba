"""Ragged verify (per-request truncation of the verified block, truncate.py) on
the real engine: greedy output identical to plain decoding, and the ragged
path really ran (requests verified fewer drafts than the step's width).

The demo pair's DFlash 2 drafter (confidences spread over (0, 1], so a
survival threshold of 0.5 cuts part of the blocks) and the tiny trained v1
drafter (confidence from its LM-head softmax), at decode batches of 1 and 8,
under SGLang's overlap scheduler and the synchronous loop.
"""

import json

import pytest

from harness import chat_prompts, dflash_args, run_engine

GREEDY = {"max_new_tokens": 48, "temperature": 0.0}
POLICY = {"mode": "on", "truncate_below": 0.5}


def _runs(prompts):
    return [{"name": f"bs{bs}", "prompts": prompts, "batch_size": bs, "sampling_params": GREEDY}
            for bs in (1, 8)]


def _ids(run):
    return [r["output_ids"] for r in run["results"]]


def _demo_prompts(n):
    from transformers import AutoTokenizer

    from sglang_dflash.demo import demo_pair
    from sglang_dflash.prompts import mixed_prompts

    tok = AutoTokenizer.from_pretrained(demo_pair()[0])
    return [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                    add_generation_prompt=True) for p in mixed_prompts(n)]


def _check_ragged(plain, spec, state, width):
    for name in plain:
        assert _ids(spec[name]) == _ids(plain[name]), f"{name}: ragged verify output differs from plain"
    assert state["steps_by_width"][width] > 0
    # The ragged path ran: request-steps verified fewer than W drafts.
    assert state["truncated_share"] > 0.05, state["truncated_share"]
    assert state["verified_drafts_per_request"] < width


@pytest.mark.parametrize("overlap", [True, False])
def test_demo_pair_ragged_verify_greedy_identical(monkeypatch, overlap):
    from sglang_dflash.demo import demo_pair

    monkeypatch.setenv("SGLANG_DFLASH_POLICY", json.dumps(POLICY))
    target, drafter = demo_pair()
    prompts = _demo_prompts(16)
    plain = run_engine({"model_path": target}, _runs(prompts))
    spec, state = run_engine({"model_path": target, "speculative_algorithm": "DFLASH",
                              "speculative_draft_model_path": drafter,
                              "disable_overlap_schedule": not overlap}, _runs(prompts), with_state=True)
    _check_ragged(plain, spec, state, width=state["block_size"] - 1)
    assert state["truncated_share"] < 0.95  # a trained drafter: many blocks verified whole
    lengths = [r["meta_info"]["spec_accept_length"] for run in spec.values() for r in run["results"]]
    assert sum(lengths) / len(lengths) > 2.5  # still speculating well


def test_v1_drafter_ragged_verify_greedy_identical(monkeypatch):
    monkeypatch.setenv("SGLANG_DFLASH_POLICY", json.dumps(POLICY))
    prompts = chat_prompts(16)
    plain = run_engine({}, _runs(prompts))
    spec, state = run_engine(dflash_args("drafter-trained"), _runs(prompts), with_state=True)
    _check_ragged(plain, spec, state, width=state["block_size"] - 1)
