"""The real HTTP server, started the documented CPU way (`sglang-dflash serve`,
spawned as a user starts it, with SGLang's spawned scheduler and detokenizer),
with the trained drafter: native /generate, OpenAI /v1/completions and
/v1/chat/completions (plain and streaming), an SGLang frontend program, bad
requests, stop strings and regexes, and greedy identity with a plain server."""

import json
import os
import tempfile
import time

import pytest
import requests

from harness import PATHS, TARGET, chat_prompts, start_servers, stop_servers, stream_choices

PROMPTS = 8
MAX_NEW = 32


def _args(spec: bool) -> list[str]:
    args = ["--model-path", TARGET, "--dtype", "float32"]
    if spec:
        args += ["--speculative-algorithm", "DFLASH",
                 "--speculative-draft-model-path", PATHS["drafter-trained"]]
    return args


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(PROMPTS)


TRACE = os.path.join(tempfile.mkdtemp(prefix="dflash-trace-"), "steps.jsonl")


@pytest.fixture(scope="module")
def servers():
    """(plain, DFLASH), started together, spawned (the path every child loads
    our plugin on by itself); the DFLASH server traces its steps to TRACE."""
    plain, spec = start_servers(_args(spec=False), (_args(spec=True), {"SGLANG_DFLASH_STEP_TRACE": TRACE}),
                                spawn=True)
    yield plain, spec
    stop_servers(spec, plain)


@pytest.fixture(scope="module")
def plain_outputs(servers, prompts):
    return [_generate(servers[0], p) for p in prompts]


@pytest.fixture(scope="module")
def server(servers):
    return servers[1]


def _generate(server, prompt, **params):
    sampling = {"max_new_tokens": MAX_NEW, "temperature": 0.0, **params}
    r = requests.post(server.url + "/generate", json={"text": prompt, "sampling_params": sampling}, timeout=300)
    r.raise_for_status()
    return r.json()


def test_generate_identical_to_plain_server(server, prompts, plain_outputs):
    accept = []
    for prompt, want in zip(prompts, plain_outputs):
        got = _generate(server, prompt)
        assert got["output_ids"] == want["output_ids"]
        assert got["text"] == want["text"]
        assert got["meta_info"]["spec_verify_ct"] > 0
        accept.append(got["meta_info"]["spec_accept_length"])
    assert sum(accept) / len(accept) > 1.5


def test_generate_batch_and_stop_inside_block(server, prompts, plain_outputs):
    # A stop token that plain decoding emits mid-way lands inside a verify block.
    ref_ids = plain_outputs[0]["output_ids"]
    stop_id = ref_ids[5]
    got = _generate(server, prompts[0], stop_token_ids=[stop_id])
    first = ref_ids.index(stop_id)
    assert got["output_ids"][: first + 1] == ref_ids[: first + 1]
    assert len(got["output_ids"]) <= first + 1
    assert got["meta_info"]["finish_reason"]["type"] == "stop"
    # max_new_tokens that is not a multiple of the block size.
    got = _generate(server, prompts[1], max_new_tokens=13)
    assert got["output_ids"] == plain_outputs[1]["output_ids"][:13]
    assert got["meta_info"]["finish_reason"]["type"] == "length"


def _stops(text: str) -> dict:
    """Stop settings that end greedy output mid-way: a string and a regex taken
    from the middle of the plain server's text (their first match can fall
    anywhere in a verify block), each with and without no_stop_trim."""
    import re

    mid = len(text) // 3
    string, pattern = text[mid:mid + 4], re.escape(text[mid + 8:mid + 11]) + r"\S*"
    return {"stop": {"stop": [string]}, "stop kept": {"stop": [string], "no_stop_trim": True},
            "stop_regex": {"stop_regex": pattern}, "stop_regex kept": {"stop_regex": [pattern], "no_stop_trim": True}}


def test_stop_strings_and_regex_equal_plain(servers, prompts, plain_outputs):
    """`stop` and `stop_regex` (trimmed and with no_stop_trim) matched inside a
    verify block: the same ids, text and finish reason as the plain server."""
    plain, spec = servers
    stopped = 0
    for i in (3, 4, 5):
        for name, params in _stops(plain_outputs[i]["text"]).items():
            want, got = _generate(plain, prompts[i], **params), _generate(spec, prompts[i], **params)
            assert (got["output_ids"], got["text"]) == (want["output_ids"], want["text"]), (i, name)
            assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"], (i, name)
            stopped += want["meta_info"]["finish_reason"]["type"] == "stop"
    assert stopped >= 9, f"only {stopped} of 12 requests stopped: the settings no longer test a stop"


def test_openai_completions(server, prompts, plain_outputs):
    body = {"model": "default", "prompt": prompts[2], "max_tokens": MAX_NEW, "temperature": 0}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    assert r.json()["choices"][0]["text"] == plain_outputs[2]["text"]
    streamed = _stream_text(server.url + "/v1/completions", body, lambda c: c["text"])
    assert streamed == plain_outputs[2]["text"]


def test_openai_chat_completions(server):
    body = {"model": "default", "messages": [{"role": "user", "content": "What is 12 times 7?"}],
            "max_tokens": MAX_NEW, "temperature": 0}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    text = r.json()["choices"][0]["message"]["content"]
    assert isinstance(text, str) and text
    streamed = _stream_text(server.url + "/v1/chat/completions", body,
                            lambda c: c.get("delta", {}).get("content") or "")
    assert streamed == text


def _stream_text(url, body, piece):
    return "".join(piece(choice) for choice in stream_choices(url, body))


def test_frontend_program(server, plain_outputs, prompts):
    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()  # importing sglang needs the sgl_kernel stand-in here
    import sglang as sgl

    @sgl.function
    def complete(s, prompt):
        s += prompt
        s += sgl.gen("answer", max_tokens=MAX_NEW, temperature=0)

    backend = sgl.RuntimeEndpoint(server.url)
    state = complete.run(prompt=prompts[3], backend=backend)
    assert state["answer"] == plain_outputs[3]["text"]


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"max_new_tokens": -5}, {"top_k": -7}])
def test_invalid_sampling_params_get_4xx_and_server_keeps_serving(server, prompts, plain_outputs, bad):
    r = requests.post(server.url + "/generate",
                      json={"text": prompts[0], "sampling_params": {"max_new_tokens": 8, **bad}}, timeout=120)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert _generate(server, prompts[4])["output_ids"] == plain_outputs[4]["output_ids"]


@pytest.mark.parametrize("ids", [[5, 6, 5000, 99999], [5, -1, 6]])
def test_out_of_vocabulary_input_ids_get_400_and_server_keeps_serving(server, prompts, plain_outputs, ids):
    r = requests.post(server.url + "/generate",
                      json={"input_ids": ids, "sampling_params": {"max_new_tokens": 8}}, timeout=120)
    assert r.status_code == 400, (r.status_code, r.text)
    assert "outside the vocabulary" in r.text
    assert _generate(server, prompts[4])["output_ids"] == plain_outputs[4]["output_ids"]


def _vocab() -> int:
    with open(os.path.join(TARGET, "config.json")) as f:
        return json.load(f)["vocab_size"]


@pytest.mark.parametrize("body, reason", [
    ({"text": ""}, "prompt is empty"),
    ({"text": ["Hi", ""]}, "prompt is empty"),  # one empty prompt in a batch
    ({"return_logprob": True, "top_logprobs_num": _vocab() + 1}, "exceeds the vocabulary size"),
    ({"return_logprob": True, "logprob_start_len": -2}, "must be >= -1"),
    ({"sampling_params": {"max_new_tokens": 8, "min_new_tokens": 3, "stop_token_ids": [99999]}},
     "stop_token_ids contains token id 99999"),
], ids=["empty-text", "empty-in-batch", "top-logprobs-past-vocab", "logprob-start-below-minus-one",
        "stop-id-past-vocab-with-min-new-tokens"])
def test_requests_that_crashed_the_scheduler_get_400(servers, prompts, plain_outputs, body, reason):
    """Each of these took SGLang 0.5.23's scheduler down, plain and DFLASH alike
    (an IndexError on no input tokens, a top-k past the row, an assertion, a
    scatter past the row); the plugin's request validation answers 400 with
    the reason on both. A stop id outside the vocabulary without
    min_new_tokens never matches and is served as before."""
    body = {"text": prompts[0], "sampling_params": {"max_new_tokens": 8}, **body}
    for srv in servers:
        r = requests.post(srv.url + "/generate", json=body, timeout=120)
        assert r.status_code == 400 and reason in r.text, (r.status_code, r.text)
        assert _generate(srv, prompts[4])["output_ids"] == plain_outputs[4]["output_ids"]
    if "stop_token_ids" in body["sampling_params"]:
        served = {**body, "sampling_params": {"max_new_tokens": 8, "stop_token_ids": [99999], "temperature": 0}}
        assert [requests.post(srv.url + "/generate", json=served, timeout=120).status_code
                for srv in servers] == [200] * len(servers)


def test_grammar_ended_before_min_new_tokens_fails_the_request_not_the_server(servers, prompts, plain_outputs):
    """regex "x" with min_new_tokens 5: once "x" is out the grammar allows only
    EOS, which min_new_tokens forbids, so no token is allowed. Plain SGLang
    fails such a request with a 500 naming the grammar; DFLASH gives the same,
    greedy and sampled. With top-k and top-p plain SGLang's sampler draws from
    the all-masked row and its whole server exits; DFLASH fails only the request."""
    plain, spec = servers
    conflict = {"max_new_tokens": 16, "regex": "x", "min_new_tokens": 5}

    def post(srv, i, **params):
        return requests.post(srv.url + "/generate", timeout=120, json={
            "text": prompts[i], "sampling_params": {**conflict, "sampling_seed": i, **params}})

    for i, temperature in enumerate((0.0, 0.8)):
        want, got = post(plain, i, temperature=temperature), post(spec, i, temperature=temperature)
        assert want.status_code == 500 and "Grammar accept_token failed" in want.text, want.text
        assert (got.status_code, got.json()["message"]) == (want.status_code, want.json()["message"])
    for i in range(4):
        got = post(spec, i, temperature=0.8, top_k=50, top_p=0.9)
        assert got.status_code == 500 and "Grammar accept_token failed" in got.text, got.text
    assert _generate(spec, prompts[4])["output_ids"] == plain_outputs[4]["output_ids"]


def test_idle_time_is_no_decode_step_cost(server, prompts):
    """A server waiting for requests is not running a decode step: the period of
    the last step before an idle gap must not reach the cost model (it once
    charged the seconds between benchmark cells to that step's width)."""
    gap = 1.5
    for prompt in prompts[5:7]:
        _generate(server, prompt)
        time.sleep(gap)
    _generate(server, prompts[7])
    rows = [json.loads(line) for line in open(TRACE)]
    assert rows and {r["kind"] for r in rows} == {"prefill", "decode"}
    after_gap = [r for prev, r in zip(rows, rows[1:]) if r["t"] - prev["t"] > gap * 0.9]
    assert len(after_gap) >= 2, "the sleeps must show in the trace"
    for r in after_gap:
        assert r["kind"] == "prefill" and r["idle"] is True and r["sample"] is None, r
    samples = [r["sample"] for r in rows if r["sample"] is not None]
    assert samples and max(s[2] for s in samples) < gap * 1e3 * 0.9, max(samples, key=lambda s: s[2])
