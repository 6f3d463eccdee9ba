"""Request features under DFLASH against the same server without speculation (the
oracle): penalties, min_new_tokens, logit bias, logprobs (native and OpenAI),
structured output (regex, JSON schema, EBNF, json_object), sessions, returned hidden states,
and a mixed batch.
The demo pair, so drafts are often accepted and every verified position matters.

The plain oracle runs without the overlap scheduler: there SGLang counts every
generated token before the next step's penalties, the rule DFLASH implements
(with the overlap scheduler plain SGLang's repetition-penalized output differed
from its own synchronous run on this pair)."""

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness import Streams, hidden_state_rows, max_row_difference, start_servers, stop_servers, stream_choices
from sglang_dflash.demo import demo_pair

EGGS = ("<|im_start|>user\nJanet has 16 eggs and eats 3. How many are left?<|im_end|>\n"
        "<|im_start|>assistant\n")
PROMPTS = [
    EGGS,
    "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n",
]


def _args(spec: bool, sync: bool = False) -> list[str]:
    target, drafter = demo_pair()
    args = ["--model-path", target, "--dtype", "float32", "--grammar-backend", "xgrammar",
            "--enable-custom-logit-processor", "--enable-return-hidden-states"]
    if spec:
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
    if sync:
        args.append("--disable-overlap-schedule")
    return args


@pytest.fixture(scope="module")
def all_servers():
    """(plain, DFLASH, DFLASH with speculation off, the same off as one-row
    verifies), started together: the harness pins the policy to always-on
    (every step verifies the whole block); the third runs every decode step at
    W = 0 through the target's DECODE forward, the fourth as a one-row
    TARGET_VERIFY on its own attention backend (the path whose graphs a CUDA
    server captures for W = 0; one_row_verify.py), eagerly."""
    off = {"SGLANG_DFLASH_POLICY": '{"mode": "off"}'}
    servers = start_servers(_args(spec=False, sync=True), _args(spec=True), (_args(spec=True), off),
                            (_args(spec=True), {**off, "SGLANG_DFLASH_ONE_ROW_OFF": "1"}))
    yield servers
    stop_servers(*servers)


@pytest.fixture(scope="module")
def servers(all_servers):
    """(plain, DFLASH)."""
    return all_servers[:2]


def _gen(server, text, timeout=300, **params):
    top = {k: params.pop(k) for k in list(params) if k in _TOP_LEVEL}
    body = {"sampling_params": {"max_new_tokens": 64, "temperature": 0, **params}, **top}
    if "input_ids" not in top:
        body["text"] = text
    r = requests.post(server.url + "/generate", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


_TOP_LEVEL = {"priority", "return_logprob", "top_logprobs_num", "token_ids_logprob", "logprob_start_len", "input_ids",
              "return_sampling_mask", "custom_logit_processor", "return_hidden_states", "session_params"}

PENALTIES = [
    {"frequency_penalty": 0.5},
    {"presence_penalty": 0.8},
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 0.3, "presence_penalty": 0.3},
    # Additive and scaling penalties together: the order matters, and SGLang's
    # own varied from one server start to the next (adapter/penalty_order.py).
    {"frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.2},
    {"min_new_tokens": 40},
    {"min_new_tokens": 200, "max_new_tokens": 220},
]


@pytest.mark.parametrize("params", PENALTIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_penalties_greedy_identical_to_plain(servers, params):
    plain, dflash = servers
    for prompt in PROMPTS:
        want = _gen(plain, prompt, **params)
        got = _gen(dflash, prompt, **params)
        assert got["output_ids"] == want["output_ids"], (params, prompt[:40])
    # The penalty really changes the output (the test would catch it being ignored).
    base = _gen(plain, EGGS, max_new_tokens=params.get("max_new_tokens", 64))
    assert _gen(dflash, EGGS, **params)["output_ids"] != base["output_ids"]


def test_logit_bias_identical_to_plain(servers):
    plain, dflash = servers
    base = _gen(plain, EGGS)["output_ids"]
    bias = {str(base[3]): -100.0, str(base[6]): 5.0}
    want = _gen(plain, EGGS, logit_bias=bias)["output_ids"]
    assert want != base
    assert _gen(dflash, EGGS, logit_bias=bias)["output_ids"] == want


def test_min_new_tokens_sampled_never_stops_early(servers):
    _, dflash = servers
    for seed in range(10):
        out = _gen(dflash, EGGS, temperature=0.7, min_new_tokens=60, max_new_tokens=120, sampling_seed=seed)
        assert out["meta_info"]["completion_tokens"] >= 60, seed


def _close(a, b, tol=1e-3):
    return all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b)) and len(a) == len(b)


def test_logprobs_equal_plain(servers):
    plain, dflash = servers
    params = dict(return_logprob=True, top_logprobs_num=3, token_ids_logprob=[5, 17], logprob_start_len=0)
    want, got = _gen(plain, EGGS, **params)["meta_info"], _gen(dflash, EGGS, **params)["meta_info"]
    assert [t for _, t, *_ in got["output_token_logprobs"]] == [t for _, t, *_ in want["output_token_logprobs"]]
    assert _close([v for v, *_ in got["output_token_logprobs"]], [v for v, *_ in want["output_token_logprobs"]])
    for g, w in zip(got["output_top_logprobs"], want["output_top_logprobs"], strict=True):
        assert [t for _, t, *_ in g] == [t for _, t, *_ in w]
        assert _close([v for v, *_ in g], [v for v, *_ in w])
    for g, w in zip(got["output_token_ids_logprobs"], want["output_token_ids_logprobs"], strict=True):
        assert _close([v for v, *_ in g], [v for v, *_ in w])
    assert _close([v or 0.0 for v, *_ in got["input_token_logprobs"]],
                  [v or 0.0 for v, *_ in want["input_token_logprobs"]])


def test_sampled_logprobs_are_the_targets(servers):
    """Sampled at T = 1 the two servers draw different tokens, so the oracle scores
    DFLASH's own output: plain's prompt logprobs of prompt + output at those
    positions are log p of each emitted token, which DFLASH must report."""
    plain, dflash = servers
    got = _gen(dflash, EGGS, temperature=1.0, sampling_seed=3, return_logprob=True, max_new_tokens=48)
    out = got["meta_info"]["output_token_logprobs"]
    ids = [t for _, t, *_ in out]
    prompt_ids = _gen(plain, EGGS, max_new_tokens=1, return_logprob=True,
                      logprob_start_len=0)["meta_info"]["input_token_logprobs"]
    n_prompt = len(prompt_ids)
    scored = _gen(plain, "", input_ids=[t for _, t, *_ in prompt_ids] + ids, max_new_tokens=1,
                  return_logprob=True, logprob_start_len=n_prompt)["meta_info"]["input_token_logprobs"]
    assert [t for _, t, *_ in scored] == ids
    # SGLang reports no logprob for the first token of a prompt window.
    pairs = [(v, w) for (v, *_), (w, *_) in zip(out, scored) if w is not None]
    assert len(pairs) >= len(ids) - 1
    assert _close([v for v, _ in pairs], [w for _, w in pairs])


def test_sampling_mask_greedy_equal_plain(servers):
    plain, dflash = servers
    want = _gen(plain, EGGS, return_sampling_mask=True)["meta_info"]
    got = _gen(dflash, EGGS, return_sampling_mask=True)["meta_info"]
    assert got["output_token_sampling_mask"] == want["output_token_sampling_mask"]
    assert len(got["output_token_sampling_mask"]) == got["completion_tokens"]


def test_sampling_mask_sampled_is_the_targets_support(servers):
    """Sampled with top_k 8: each committed token's mask is the support of the
    target's p at its prefix (the top 8 tokens), which the plain server reports
    as prompt top logprobs when it scores DFLASH's own output."""
    plain, dflash = servers
    got = _gen(dflash, EGGS, temperature=1.0, top_k=8, sampling_seed=5, max_new_tokens=32,
               return_sampling_mask=True, return_logprob=True)["meta_info"]
    ids = [t for _, t, *_ in got["output_token_logprobs"]]
    masks = got["output_token_sampling_mask"]
    assert len(masks) == len(ids)
    assert all(t in m and len(m) <= 8 for t, m in zip(ids, masks))
    prompt = _gen(plain, EGGS, max_new_tokens=1, return_logprob=True,
                  logprob_start_len=0)["meta_info"]["input_token_logprobs"]
    start = len(prompt) - 1
    scored = _gen(plain, "", input_ids=[t for _, t, *_ in prompt] + ids, max_new_tokens=1,
                  return_logprob=True, top_logprobs_num=8, logprob_start_len=start)["meta_info"]
    # Row j is the prompt position start + j: its token and the top 8 of the p it came from.
    rows = list(zip(scored["input_token_logprobs"], scored["input_top_logprobs"]))[1:]
    assert [tok for (_, tok, *_), _ in rows] == ids
    assert [sorted(m) for m in masks] == [sorted(t for _, t, *_ in top) for _, top in rows]


def test_openai_chat_logprobs_equal_plain(servers):
    plain, dflash = servers
    body = {"model": "default", "messages": [{"role": "user", "content": "How many legs has a cat?"}],
            "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    want = requests.post(plain.url + "/v1/chat/completions", json=body, timeout=300).json()
    r = requests.post(dflash.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    got = r.json()
    w, g = want["choices"][0]["logprobs"]["content"], got["choices"][0]["logprobs"]["content"]
    assert [x["token"] for x in g] == [x["token"] for x in w]
    assert _close([x["logprob"] for x in g], [x["logprob"] for x in w])
    assert [[t["token"] for t in x["top_logprobs"]] for x in g] == \
        [[t["token"] for t in x["top_logprobs"]] for x in w]


def _streamed_chat_logprobs(server, body) -> list[tuple[str, float]]:
    """(token, logprob) of every logprob entry a streamed chat response sent, in order."""
    return [(x["token"], x["logprob"]) for choice in stream_choices(server.url + "/v1/chat/completions", body)
            for x in (choice.get("logprobs") or {}).get("content") or []]


@pytest.mark.parametrize("stop", [None, ["legs"]], ids=["eos", "stop-string"])
def test_openai_chat_streamed_logprobs_equal_plain(servers, stop):
    """A streamed chat's logprobs, concatenated, are the whole response's, on
    both servers: SGLang dropped those of a step whose text delta was empty
    (plain: the EOS token; DFLASH commits it with other tokens and kept it),
    and sends them now (adapter/stream_logprobs.py)."""
    plain, dflash = servers
    body = {"model": "default", "messages": [{"role": "user", "content": "How many legs has a cat?"}],
            "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 2, "stop": stop}
    whole = requests.post(plain.url + "/v1/chat/completions", json=body, timeout=300).json()
    want = [(x["token"], x["logprob"]) for x in whole["choices"][0]["logprobs"]["content"]]
    for server in (plain, dflash):
        got = _streamed_chat_logprobs(server, body)
        assert [t for t, _ in got] == [t for t, _ in want], server.url
        assert _close([lp for _, lp in got], [lp for _, lp in want]), server.url


def _concurrent_equal_plain(server, plain, requests_):
    """Send requests_ (dicts: text and parameters) to server at once, so they share
    decode batches, and to plain one by one; each output must equal plain's.
    Returns both replies in request order."""
    def run(target, req):
        req = dict(req)
        return _gen(target, req.pop("text"), **req)

    with ThreadPoolExecutor(len(requests_)) as pool:
        got = list(pool.map(lambda r: run(server, r), requests_))
    want = [run(plain, r) for r in requests_]
    for g, w, r in zip(got, want, requests_):
        assert g["output_ids"] == w["output_ids"], r
    return got, want


def test_mixed_batch_with_and_without_logprobs_and_penalties(servers):
    """Concurrent requests share decode batches: with and without logprobs,
    penalties and grammar; each equals its plain answer and the server keeps serving."""
    plain, dflash = servers
    requests_ = [
        dict(text=PROMPTS[0], return_logprob=True, top_logprobs_num=2),
        dict(text=PROMPTS[1]),
        dict(text=PROMPTS[2], frequency_penalty=0.7),
        dict(text=PROMPTS[0], regex=r"[0-9]+ eggs"),
        dict(text=PROMPTS[1], return_logprob=True, presence_penalty=0.5),
        dict(text=PROMPTS[2], min_new_tokens=30),
    ]

    _concurrent_equal_plain(dflash, plain, requests_)
    assert requests.get(dflash.url + "/health_generate", timeout=60).status_code == 200


def _random_request(rng) -> dict:
    """One greedy request with a random mix of features (each with probability 1/4)."""
    req = dict(text=rng.choice(PROMPTS + [EGGS + "The"]), max_new_tokens=rng.choice([1, 2, 7, 8, 9, 33, 64]))
    options = {"frequency_penalty": lambda: rng.choice([0.2, 0.7]), "presence_penalty": lambda: rng.choice([0.3, 1.0]),
               "repetition_penalty": lambda: rng.choice([1.1, 1.5]), "min_new_tokens": lambda: rng.randint(1, 40),
               "logit_bias": lambda: {str(rng.randint(0, 4000)): rng.choice([-5.0, 3.0])},
               "stop": lambda: [rng.choice([" the", ".", "\n", "total"])],
               "regex": lambda: rng.choice(["[a-z ]+", "([0-9]+ )+x", "(yes|no)"]),
               "ignore_eos": lambda: True, "stop_token_ids": lambda: [rng.randint(0, 4000)],
               "return_logprob": lambda: True}
    for key, value in options.items():
        if rng.random() < 0.25:
            req[key] = value()
    if "min_new_tokens" in req:  # a grammar that ends first fails the request (test_server.py)
        req.pop("regex", None)
        req["max_new_tokens"] = max(req["max_new_tokens"], req["min_new_tokens"])
    if "regex" in req:  # README: plain emits one token past a grammar's end under ignore_eos
        req.pop("ignore_eos", None)
    if req.get("return_logprob"):
        req["top_logprobs_num"] = rng.choice([0, 3])
    return req


def test_random_feature_combinations_equal_plain(servers):
    """32 concurrent greedy requests, each a random mix of penalties, min_new_tokens,
    logit bias, stop strings and ids, a regex, ignore_eos, logprobs and lengths
    around the block size (fixed seed): each equals its plain answer."""
    import random

    plain, dflash = servers
    rng = random.Random(0)
    _concurrent_equal_plain(dflash, plain, [_random_request(rng) for _ in range(32)])


GRAMMARS = [
    {"regex": r"(yes|no), [a-z]+ [0-9]{1,3}\."},
    {"json_schema": json.dumps({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "eggs": {"type": "integer"}},
        "required": ["name", "eggs"]})},
    {"ebnf": 'root ::= "The answer is " digit digit? "."\ndigit ::= [0-9]'},
]


@pytest.mark.parametrize("grammar", GRAMMARS, ids=["regex", "json_schema", "ebnf"])
def test_structured_output_greedy_identical_to_plain(servers, grammar):
    plain, dflash = servers
    want = _gen(plain, EGGS, max_new_tokens=48, **grammar)
    got = _gen(dflash, EGGS, max_new_tokens=48, **grammar)
    assert got["output_ids"] == want["output_ids"]
    assert got["meta_info"]["spec_verify_ct"] > 0


def test_structured_output_sampled_is_always_valid(servers):
    """Sampled at T = 1, every output matches its grammar (closed patterns, so an
    output cut by max_new_tokens cannot pass for a valid one)."""
    _, dflash = servers
    patterns = [r"(yes|no), [a-z]+ [0-9]{1,3}\.", r'\{"eggs": [0-9]{1,4}, "left": (true|false)\}']
    for seed in range(6):
        for pattern in patterns:
            out = _gen(dflash, EGGS, max_new_tokens=48, temperature=1.0, sampling_seed=seed, regex=pattern)
            assert re.fullmatch(pattern, out["text"]), (pattern, out["text"])
        out = _gen(dflash, EGGS, max_new_tokens=48, temperature=1.0, sampling_seed=seed,
                   ebnf=GRAMMARS[2]["ebnf"])
        assert re.fullmatch(r"The answer is [0-9][0-9]?\.", out["text"]), out["text"]


def test_openai_json_object_response_format(servers):
    plain, dflash = servers
    body = {"model": "default", "messages": [{"role": "user", "content": "Give me a JSON object."}],
            "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}}
    want = requests.post(plain.url + "/v1/chat/completions", json=body, timeout=300).json()
    r = requests.post(dflash.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]


def _disallowed_tokens_processor() -> str:
    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()  # importing sglang needs the sgl_kernel stand-in here
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor().to_str()


def test_custom_logit_processor_identical_to_plain(servers):
    plain, dflash = servers
    base = _gen(plain, EGGS)["output_ids"]
    params = dict(custom_logit_processor=_disallowed_tokens_processor(),
                  custom_params={"token_ids": [base[2], base[5]]})
    want = _gen(plain, EGGS, **params)["output_ids"]
    assert want != base and base[2] not in want
    assert _gen(dflash, EGGS, **params)["output_ids"] == want


def test_parallel_samples_n2(servers):
    _, dflash = servers
    body = {"text": EGGS, "sampling_params": {"max_new_tokens": 24, "temperature": 0.9, "n": 2}}
    r = requests.post(dflash.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 2
    assert all(o["meta_info"]["completion_tokens"] > 0 for o in outs)


def test_return_hidden_states_equal_plain(all_servers):
    """The target's final hidden states over HTTP, every prompt row and one per
    token, as plain decoding returns them: DFLASH always on (verify rows; a last
    verify step that runs past the output's end has those rows dropped) under
    the overlap scheduler, and with speculation off (W = 0 decode rows), beside
    requests that ask for none. Equal within float noise: a verify computes a
    block of rows at once. A prompt no server has seen: a cached prefix's rows
    are not returned. ("last" is an engine API value: test_engine_robustness.)"""
    plain, dflash, off, one_row = all_servers
    text = "Hidden states. " + EGGS
    want = _gen(plain, text, max_new_tokens=27, return_hidden_states=True)["meta_info"]
    expected = hidden_state_rows(want["hidden_states"])
    assert want["cached_tokens"] == 0 and len(expected) == want["prompt_tokens"] + want["completion_tokens"] - 1
    asking = dict(text=text, max_new_tokens=27, return_hidden_states=True)
    for server in (dflash, off, one_row):
        got, _ = _concurrent_equal_plain(server, plain, [asking, dict(text=PROMPTS[1]), dict(text=PROMPTS[2])])
        assert "hidden_states" not in got[1]["meta_info"]
        rows = hidden_state_rows(got[0]["meta_info"]["hidden_states"])
        assert len(rows) == len(expected), (len(rows), len(expected))
        assert max_row_difference(rows, expected) < 1e-3
    assert _gen(dflash, EGGS, max_new_tokens=27)["meta_info"]["spec_verify_ct"] < 27


@pytest.mark.parametrize("path", ["decode", "one-row"])
def test_off_path_request_features_equal_plain(all_servers, path):
    """Speculation off (every decode step W = 0: the target's DECODE forward,
    or a one-row verify; what the adaptive policy runs under load): penalties,
    grammar, logit bias, a custom logit processor, logprobs and sampling
    masks, concurrently in one batch, each equal to plain's answer."""
    plain, off = all_servers[0], all_servers[2 if path == "decode" else 3]
    base = _gen(plain, EGGS)["output_ids"]
    requests_ = [
        dict(text=PROMPTS[0], return_logprob=True, top_logprobs_num=2, return_sampling_mask=True),
        dict(text=PROMPTS[1], repetition_penalty=1.3),
        dict(text=PROMPTS[2], frequency_penalty=0.7, min_new_tokens=30),
        dict(text=PROMPTS[0], regex=r"(yes|no), [a-z]+ [0-9]{1,3}\."),
        dict(text=EGGS, logit_bias={str(base[3]): -100.0, str(base[6]): 5.0}),
        dict(text=EGGS, custom_logit_processor=_disallowed_tokens_processor(),
             custom_params={"token_ids": [base[2], base[5]]}),
    ]
    got, want = _concurrent_equal_plain(off, plain, requests_)
    g, w = got[0]["meta_info"], want[0]["meta_info"]
    assert _close([v for v, *_ in g["output_token_logprobs"]], [v for v, *_ in w["output_token_logprobs"]])
    assert [[t for _, t, *_ in x] for x in g["output_top_logprobs"]] == \
        [[t for _, t, *_ in x] for x in w["output_top_logprobs"]]
    assert g["output_token_sampling_mask"] == w["output_token_sampling_mask"]
    internal = requests.get(off.url + "/get_server_info", timeout=60).json()["internal_states"][0]
    state = internal["dflash"]
    assert state["steps_by_width"][0] == state["steps"] > 0, state  # every decode step ran W = 0
    one_row = state.get("one_row_verify")
    assert (one_row is None) if path == "decode" else (one_row["steps"] == state["steps"]), state
    # Built while the resolved block read 1, then restored (SGLang's readback
    # includes runtime overrides): the scheduler sizes every verify from it.
    assert internal["speculative_num_draft_tokens"] == state["block_size"], internal


def _session_turns(server):
    """Three turns in one session (each continues the last), then a branch off the
    first turn; returns each turn's output ids."""
    sid = requests.post(server.url + "/open_session", json={"capacity_of_str_len": 100000}, timeout=60).json()
    outs, rids = [], []
    for prompt, parent in [(PROMPTS[0], None), (PROMPTS[1], -1), (PROMPTS[2], -1), (PROMPTS[2], 0)]:
        rid = None if parent is None else rids[parent]
        out = _gen(server, prompt, session_params={"id": sid, "rid": rid})
        rids.append(out["meta_info"]["id"])
        outs.append(out["output_ids"])
    assert requests.post(server.url + "/close_session", json={"session_id": sid}, timeout=60).status_code == 200
    return outs


def test_session_turns_identical_to_plain(servers):
    """Sessions (/open_session, `session_params`): a turn continues the session's
    cached context, a branch restarts from an earlier turn's; under DFLASH the
    drafter's context rows of that cached context are reused too."""
    plain, dflash = servers
    want = _session_turns(plain)
    alone = [_gen(plain, prompt)["output_ids"] for prompt in (PROMPTS[1], PROMPTS[2])]
    assert [want[1], want[2]] != alone  # the session's context changes the turns
    assert _session_turns(dflash) == want


RETRACTED = {"max_new_tokens": 320, "temperature": 0, "ignore_eos": True,
             "frequency_penalty": 0.4, "presence_penalty": 0.3, "repetition_penalty": 1.2}


def _paused_and_retracted(server, prompts, params) -> list[dict]:
    """Each prompt streamed at once; once every one is decoding, /pause_generation
    "retract" sends them all back to the queue (their output so far kept,
    re-prefilled on /continue_generation). Their last chunks."""
    streams = Streams(server, [{"text": p, "sampling_params": params} for p in prompts])
    streams.wait_decoding()
    assert requests.post(server.url + "/pause_generation", json={"mode": "retract"}, timeout=300).ok
    time.sleep(0.5)
    assert requests.post(server.url + "/continue_generation", json={}, timeout=300).ok
    return streams.join()


def test_penalized_requests_retracted_by_a_pause_equal_unpaused(all_servers):
    """A retracted request comes back through a prefill with its output so far;
    its penalties go on counting that output (SGLang 0.5.23 restarted them from
    zero, plain decoding included: adapter/penalty_counts.py). Plain, DFLASH
    and speculation off, each paused mid-decode, equal plain unpaused."""
    plain = all_servers[0]
    want = [_gen(plain, p, **RETRACTED)["output_ids"] for p in PROMPTS]
    for server in all_servers[:3]:
        outs = _paused_and_retracted(server, PROMPTS, RETRACTED)
        assert all(o["meta_info"]["num_retractions"] for o in outs), server.url
        assert [o["output_ids"] for o in outs] == want, server.url


def test_requests_preempted_by_priority_equal_plain(all_servers):
    """Priority scheduling with preemption (`--enable-priority-scheduling`,
    room for two running requests): a request of higher priority arriving
    while two penalized ones decode sends one of them back to the queue (its
    output kept, re-prefilled later), as a retraction does. Under DFLASH every
    output, the preempted one's included, equals plain's unpreempted."""
    plain = all_servers[0]
    want = [_gen(plain, p, **RETRACTED)["output_ids"] for p in PROMPTS]
    server = start_servers([*_args(spec=True), "--enable-priority-scheduling", "--max-running-requests", "2"])[0]
    try:
        low = Streams(server, [{"text": p, "sampling_params": RETRACTED, "priority": 0} for p in PROMPTS[:2]])
        low.wait_decoding()
        # SGLang preempts for a priority higher by more than its threshold (10).
        high = _gen(server, PROMPTS[2], priority=100, **RETRACTED)
        outs = low.join()
    finally:
        stop_servers(server)
    assert sorted(o["meta_info"]["num_retractions"] for o in outs) == [0, 1]
    assert [o["output_ids"] for o in outs] + [high["output_ids"]] == want
