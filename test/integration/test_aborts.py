"""Aborts keep both sides consistent: a request aborted through /abort_request
and a streaming client that disconnects mid-generation, each while other
requests decode in the same batch. The survivors' greedy output equals their
output before any abort, and afterwards every prompt run alone reproduces its
earlier output AND its earlier acceptance (the same verify steps): a leaked or
stale drafter context would change acceptance, a leaked or stale target KV
slot would change the tokens (and SGLang's idle-time leak check would stop
the scheduler)."""

import json
import threading
import time

import pytest
import requests

from harness import PATHS, TARGET, Server, chat_prompts

MAX_NEW = 48
LONG = {"max_new_tokens": 1200, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    srv = Server(["--model-path", TARGET, "--dtype", "float32",
                  "--speculative-algorithm", "DFLASH",
                  "--speculative-draft-model-path", PATHS["drafter-trained"]])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(4)


def _generate(server, prompt, **extra):
    body = {"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0.0}, **extra}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def _summary(out):
    meta = out["meta_info"]
    return out["output_ids"], meta["spec_verify_ct"], meta["spec_accept_length"]


def _concurrently(server, prompts):
    """Run the prompts in parallel threads; returns their outputs in order."""
    outs = [None] * len(prompts)

    def run(i):
        outs[i] = _generate(server, prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    return threads, outs


def _start_stream(server, prompt, **extra):
    """A long streaming request, returned once it has produced a few chunks (it is decoding)."""
    stream = requests.post(server.url + "/generate", stream=True, timeout=600,
                           json={"text": prompt, "sampling_params": LONG, "stream": True, **extra})
    lines = stream.iter_lines()
    chunks = 0
    for line in lines:
        chunks += line.startswith(b"data:")
        if chunks >= 3:
            return stream, lines
    raise AssertionError("the long request ended before streaming 3 chunks")


def test_abort_request_and_client_disconnect(server, prompts):
    before = [_generate(server, p) for p in prompts]

    # 1. /abort_request on a long request that shares the batch with the others.
    stream, lines = _start_stream(server, prompts[0], rid="victim-abort")
    threads, outs = _concurrently(server, prompts)
    time.sleep(0.5)
    assert requests.post(server.url + "/abort_request", json={"rid": "victim-abort"}, timeout=30).ok
    last = None
    for line in lines:  # the stream ends with the abort
        if line.startswith(b"data:") and line != b"data: [DONE]":
            last = json.loads(line[5:])
    stream.close()
    for t in threads:
        t.join(timeout=600)
    assert last is not None and last["meta_info"]["finish_reason"]["type"] == "abort", last
    assert last["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]
    for got, want in zip(outs, before):
        assert got["output_ids"] == want["output_ids"]

    # 2. A streaming client that goes away mid-generation.
    stream, _ = _start_stream(server, prompts[1])
    threads, outs = _concurrently(server, prompts)
    time.sleep(0.5)
    stream.close()
    for t in threads:
        t.join(timeout=600)
    for got, want in zip(outs, before):
        assert got["output_ids"] == want["output_ids"]

    # 3. Alone again: same tokens and the same verify steps as before the aborts.
    for prompt, want in zip(prompts, before):
        assert _summary(_generate(server, prompt)) == _summary(want)
    assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200
