"""The draft side stays consistent through chunked prefill, radix-cache prefix
hits, retraction under KV pressure, and long prompts: greedy DFLASH output equals
plain decoding under the same engine settings."""

import pytest

from harness import chat_prompts, dflash_args, run_engine

GREEDY = {"max_new_tokens": 48, "temperature": 0.0}


def _ids(run):
    return [r["output_ids"] for r in run["results"]]


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(12)


def test_chunked_prefill_and_radix_hits(prompts):
    # Chunks of 32 tokens split most prompts; the second pass over the same
    # prompts (and a shared-prefix variant) is served from the radix cache.
    shared = [p + " Answer briefly." for p in prompts[:4]]
    runs = [
        {"name": "first", "prompts": prompts, "batch_size": 4, "sampling_params": GREEDY},
        {"name": "again", "prompts": prompts, "batch_size": 4, "sampling_params": GREEDY},
        {"name": "shared", "prompts": shared, "batch_size": 4, "sampling_params": GREEDY},
    ]
    settings = dict(chunked_prefill_size=32)
    plain = run_engine(settings, runs)
    spec = run_engine({**settings, **dflash_args("drafter-trained")}, runs)
    for name in plain:
        assert _ids(spec[name]) == _ids(plain[name]), name
    cached = sum(r["meta_info"]["cached_tokens"] or 0 for r in spec["again"]["results"])
    assert cached > 0, "the second pass should hit the radix cache"


def test_retraction_under_kv_pressure():
    # Twelve short prompts with long outputs in a 600-token KV pool, admitted
    # optimistically (schedule_conservativeness 0.01): decode runs out of KV,
    # so the scheduler retracts requests and re-prefills them later.
    from transformers import AutoTokenizer

    from harness import TARGET
    from sglang_dflash.tools.prompts import mixed_prompts

    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": p[:60]}], tokenize=False, add_generation_prompt=True)
        for p in mixed_prompts(12)
    ]
    runs = [{"name": "all", "prompts": prompts, "batch_size": 12,
             "sampling_params": {"max_new_tokens": 160, "temperature": 0.0}}]
    settings = dict(max_total_tokens=600, max_running_requests=12, schedule_conservativeness=0.01)
    plain = run_engine(settings, runs)
    spec = run_engine({**settings, **dflash_args("drafter-trained")}, runs)
    assert _ids(spec["all"]) == _ids(plain["all"])
    retractions = sum(r["meta_info"]["num_retractions"] or 0 for r in spec["all"]["results"])
    assert retractions > 0, "the setting no longer forces a retraction; shrink max_total_tokens"
