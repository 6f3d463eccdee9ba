"""The draft side stays consistent through chunked prefill, radix-cache prefix
hits, mixed chunked prefill (also on hybrid targets), retraction under KV
pressure, requests ending at the context length, and long prompts: greedy
DFLASH output equals plain decoding under the same engine settings, and so do
the target's hidden states returned beside it (`return_hidden_states`, also
under mixed chunked prefill)."""

import pytest

from harness import TARGET, Job, assert_same_hidden_states, chat_prompts, dflash_args, output_ids, run_engines

GREEDY = {"max_new_tokens": 48, "temperature": 0.0}


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(12)


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_and_radix_hits(prompts, page_size):
    # Chunks of 32 tokens split most prompts; the second pass over the same
    # prompts (and a shared-prefix variant) is served from the radix cache.
    # Page size 16 (as paged GPU attention backends use): SGLang allocates
    # the verify block's slots page by page and the radix cache matches
    # whole pages, while the drafter's context is addressed per token.
    shared = [p + " Answer briefly." for p in prompts[:4]]
    runs = [
        {"name": "first", "prompts": prompts, "batch_size": 4, "sampling_params": GREEDY},
        {"name": "again", "prompts": prompts, "batch_size": 4, "sampling_params": GREEDY},
        {"name": "shared", "prompts": shared, "batch_size": 4, "sampling_params": GREEDY},
    ]
    settings = dict(chunked_prefill_size=32, page_size=page_size)
    plain, spec = run_engines([Job(settings, runs), Job({**settings, **dflash_args("drafter-trained")}, runs)])
    for name in plain:
        assert output_ids(spec[name]) == output_ids(plain[name]), name
    cached = [r["meta_info"]["cached_tokens"] or 0 for r in spec["again"]["results"]]
    assert sum(cached) > 0, "the second pass should hit the radix cache"
    assert all(n % page_size == 0 for n in cached), f"radix hits are whole pages: {cached}"


@pytest.mark.parametrize("overlap, policy", [(True, '{"mode": "on"}'), (False, '{"mode": "adaptive"}')],
                         ids=["overlap-on", "sync-adaptive"])
def test_mixed_chunked_prefill(prompts, monkeypatch, overlap, policy):
    """--enable-mixed-chunk: a prefill chunk and the running requests' next token
    (their pending bonus) run as one extend. Twelve prompts in chunks of 64 tokens
    arrive at once, so the later prompts' chunks run with the first ones decoding;
    a second group is held to a regex (the mixed rows are sampled by SGLang's
    extend sampler under the request's grammar state) and a third has penalties
    (SGLang's penalizers hold no counts for speculative requests, so the
    plugin keeps prefills unmixed while one runs: adapter/mixed_chunk.py).
    Both scheduler loops for DFLASH; the oracle is plain decoding with the
    synchronous one (with the overlap scheduler plain SGLang applies penalties a
    step late: test_request_features.py). The penalized prompts are split into
    chunks too, whose last chunk's token must be counted even when, under the
    overlap scheduler, the previous chunk's result is processed after it ran.
    The greedy group asks for the target's hidden states (True, "last" or none
    per prompt): rows computed in mixed extends equal plain's too."""
    monkeypatch.setenv("SGLANG_DFLASH_POLICY", policy)
    penalized = {**GREEDY, "frequency_penalty": 0.6, "presence_penalty": 0.4, "repetition_penalty": 1.3}
    asks = [True, "last", False, True] * 3
    runs = [{"name": "greedy", "prompts": prompts, "batch_size": 12, "sampling_params": GREEDY,
             "return_hidden_states": asks},
            {"name": "regex", "prompts": prompts[::-1], "batch_size": 12,
             "sampling_params": {**GREEDY, "regex": "(ab|[0-9]+ )+x"}},
            # New prompts: the radix cache holds the others, and would skip their chunks.
            {"name": "penalties", "prompts": chat_prompts(24)[12:], "batch_size": 12,
             "sampling_params": penalized}]
    settings = dict(enable_mixed_chunk=True, chunked_prefill_size=64, enable_return_hidden_states=True,
                    disable_overlap_schedule=not overlap)
    plain, (spec, state) = run_engines([Job({**settings, "disable_overlap_schedule": True}, runs),
                                        Job({**settings, **dflash_args("drafter-trained")}, runs, True)])
    for name in plain:
        for i, (want, got) in enumerate(zip(output_ids(plain[name]), output_ids(spec[name]))):
            assert got == want, f"{name} request {i}"
    assert_same_hidden_states(plain["greedy"], spec["greedy"], asks, "greedy")
    assert state["mixed_prefills"] > 2 and state["mixed_decode_rows"] > 10, state
    assert state["steps"] > 0


# Hybrid targets (tiny_paths names): Gated DeltaNet layers, Nemotron-H's Mamba2 layers.
HYBRIDS = {"gdn": ("hybrid-target", "hybrid-drafter-trained"), "mamba2": ("nemotron-h-target",
                                                                          "nemotron-h-drafter-trained")}


@pytest.mark.parametrize("hybrid", list(HYBRIDS))
def test_mixed_chunked_prefill_on_hybrid_targets(prompts, hybrid):
    """--enable-mixed-chunk on a target with state-space layers: running
    requests decode their next token inside the prefill chunks' extend, where
    SGLang advances their recurrent state, between DFLASH verify steps that
    commit it at the accepted position. Twelve prompts in chunks of 32 arrive
    at once; output equals plain decoding's with the same settings."""
    from transformers import AutoTokenizer

    from sglang_dflash.demo import tiny_paths

    paths = tiny_paths()
    target, drafter = (paths[name] for name in HYBRIDS[hybrid])
    ids = [AutoTokenizer.from_pretrained(target)(text).input_ids for text in prompts]
    runs = [{"name": "mixed", "input_ids": ids, "batch_size": 12, "sampling_params": GREEDY}]
    settings = dict(model_path=target, enable_mixed_chunk=True, chunked_prefill_size=32, dtype="float32",
                    max_mamba_cache_size=64, disable_radix_cache=True)
    dflash = {**settings, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter}
    plain, (spec, state) = run_engines([Job(settings, runs), Job(dflash, runs, True)])
    for i, (want, got) in enumerate(zip(output_ids(plain["mixed"]), output_ids(spec["mixed"]), strict=True)):
        assert got == want, f"request {i}"
    assert state["mixed_prefills"] > 2 and state["mixed_decode_rows"] > 10 and state["steps"] > 0, state


def test_requests_ending_at_the_context_length(prompts):
    """--context-length 128 with prompts of up to 88 tokens and 40 new tokens
    each: the longest end at the model's limit (SGLang stops them a token
    short of it), where a verify block would reach past it. Output and finish
    lengths equal plain decoding's, greedy and (no crash, same lengths) sampled."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    ids = [tok(text).input_ids[:88] for text in prompts[:8]]
    params = {"max_new_tokens": 40, "ignore_eos": True}
    runs = [{"name": "greedy", "input_ids": ids, "batch_size": 8, "sampling_params": {**params, "temperature": 0.0}},
            {"name": "sampled", "input_ids": ids, "batch_size": 8, "sampling_params": {**params, "temperature": 0.7}}]
    settings = dict(context_length=128)
    plain, spec = run_engines([Job(settings, runs), Job({**settings, **dflash_args("drafter-trained")}, runs)])
    assert output_ids(spec["greedy"]) == output_ids(plain["greedy"])
    lengths = [len(out) for out in output_ids(plain["greedy"])]
    assert [len(out) for out in output_ids(spec["sampled"])] == lengths and min(lengths) < 40, lengths
    assert sum(r["meta_info"]["spec_verify_ct"] for r in spec["greedy"]["results"]) < sum(lengths)  # drafts accepted


def test_retraction_under_kv_pressure():
    # Twelve short prompts with long outputs in a 600-token KV pool, admitted
    # optimistically (schedule_conservativeness 0.01): decode runs out of KV,
    # so the scheduler retracts requests and re-prefills them later.
    from transformers import AutoTokenizer

    from harness import TARGET
    from sglang_dflash.tools.prompts import chat_text, mixed_prompts

    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [chat_text(tok, p[:60]) for p in mixed_prompts(12)]
    runs = [{"name": "all", "prompts": prompts, "batch_size": 12,
             "sampling_params": {"max_new_tokens": 160, "temperature": 0.0}}]
    settings = dict(max_total_tokens=600, max_running_requests=12, schedule_conservativeness=0.01)
    plain, spec = run_engines([Job(settings, runs), Job({**settings, **dflash_args("drafter-trained")}, runs)])
    assert output_ids(spec["all"]) == output_ids(plain["all"])
    retractions = sum(r["meta_info"]["num_retractions"] or 0 for r in spec["all"]["results"])
    assert retractions > 0, "the setting no longer forces a retraction; shrink max_total_tokens"


def test_returned_hidden_states_equal_plain(prompts):
    """`return_hidden_states` through the engine API, per prompt True, "last"
    or none in one batch, with prompts prefilled in chunks of 32 (only a
    prompt's last chunk returns rows, as plain serving does) and served again
    from the radix cache (only the uncached rows return): the target's final
    states equal plain decoding's within float noise (a verify computes a block
    of rows at once), the token ids exactly."""
    asks = [True, "last", False, True] * 2
    runs = [{"name": "first", "prompts": prompts[:8], "batch_size": 4, "sampling_params": GREEDY,
             "return_hidden_states": asks},
            {"name": "again", "prompts": prompts[:4], "batch_size": 4, "sampling_params": GREEDY,
             "return_hidden_states": asks[:4]}]
    settings = dict(chunked_prefill_size=32, enable_return_hidden_states=True)
    plain, spec = run_engines([Job(settings, runs), Job({**settings, **dflash_args("drafter-trained")}, runs)])
    for name in plain:
        assert output_ids(spec[name]) == output_ids(plain[name]), name
        assert_same_hidden_states(plain[name], spec[name], asks, name)
    cached = [r["meta_info"]["cached_tokens"] for r in spec["again"]["results"]]
    assert all(cached), f"the second pass should hit the radix cache: {cached}"
    assert sum(r["meta_info"]["spec_verify_ct"] for r in spec["first"]["results"]) < \
        sum(r["meta_info"]["completion_tokens"] for r in spec["first"]["results"])  # drafts accepted
