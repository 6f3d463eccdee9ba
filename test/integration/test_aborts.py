"""Aborts and pauses keep both sides consistent.

Aborts: a request aborted through /abort_request and a streaming client that
disconnects mid-generation, each while other requests decode in the same
batch. The survivors' greedy output equals their output before any abort, and
afterwards every prompt run alone reproduces its earlier output AND its
earlier acceptance (the same verify steps): a leaked or stale drafter context
would change acceptance, a leaked or stale target KV slot would change the
tokens (and SGLang's idle-time leak check would stop the scheduler).

Pauses (/pause_generation, /continue_generation, as RL trainers drive a
server between weight updates), each while four requests decode: "retract"
(every request back to the queue, its KV and drafter context rebuilt on
resume) and "in_place" (the batch held) finish with the tokens the same
requests produce unpaused; "abort" ends them; and pause "retract", a target
update from disk, continue serves each request's tokens before the pause
from the old target and every token after it from the new one (judged
token by token against transformers' greedy choice of each)."""

import json
import threading
import time

import pytest
import requests
import torch

from harness import PATHS, TARGET, Server, Streams, chat_prompts, noised_copy, not_transformers_greedy

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


PAUSED = {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}


def _streams(server, prompt_ids) -> Streams:
    return Streams(server, [{"input_ids": ids, "sampling_params": PAUSED} for ids in prompt_ids])


def _post(server, path, body=None):
    r = requests.post(server.url + path, json=body or {}, timeout=300)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


@pytest.fixture(scope="module")
def prompt_ids(prompts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    return [tok(p)["input_ids"] for p in prompts]


@pytest.fixture(scope="module")
def unpaused(server, prompt_ids):
    streams = _streams(server, prompt_ids)
    return [out["output_ids"] for out in streams.join()]


@pytest.mark.parametrize("mode", ["retract", "in_place", "abort"])
def test_pause_and_continue(server, prompt_ids, unpaused, mode):
    streams = _streams(server, prompt_ids)
    streams.wait_decoding()
    _post(server, "/pause_generation", {"mode": mode})
    time.sleep(1.0)
    _post(server, "/continue_generation")
    outs = streams.join()
    if mode == "abort":
        assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs), outs
        assert all(len(o["output_ids"]) < PAUSED["max_new_tokens"] for o in outs)
        streams = _streams(server, prompt_ids)  # and the server serves them as before
        outs = streams.join()
    assert [o["output_ids"] for o in outs] == unpaused
    retracted = [o["meta_info"]["num_retractions"] for o in outs]
    assert all(retracted) if mode == "retract" else not any(retracted), retracted


def test_pause_update_target_continue(server, prompt_ids, tmp_path):
    """The RL loop: pause (retract), load new target weights from disk, continue.
    Each request's tokens are the old target's greedy choices up to some point
    and the new target's from there on (teacher-forced: every position judged
    on the served prefix), and the new target does choose differently. The
    original weights are loaded back after."""
    new_target = noised_copy(TARGET, tmp_path / "target2", 0.3, torch.Generator().manual_seed(1))
    streams = _streams(server, prompt_ids)
    streams.wait_decoding()
    _post(server, "/pause_generation", {"mode": "retract"})
    try:
        assert _post(server, "/update_weights_from_disk", {"model_path": new_target})["success"]
    finally:
        _post(server, "/continue_generation")
    outs = [o["output_ids"] for o in streams.join()]
    assert _post(server, "/update_weights_from_disk", {"model_path": TARGET})["success"]
    assert all(len(o) == PAUSED["max_new_tokens"] for o in outs)
    not_old = not_transformers_greedy(TARGET, prompt_ids, outs)
    not_new = not_transformers_greedy(new_target, prompt_ids, outs)
    for i in range(len(outs)):
        assert not_old.get(i), f"prompt {i}: no token differs from the old target's choice"
        assert max(not_new.get(i, [-1])) < min(not_old[i]), \
            f"prompt {i}: new-target tokens before old-target ones: {not_new.get(i)} / {not_old[i]}"


def test_release_and_resume_memory_occupation(server, prompt_ids, unpaused):
    """The colocated RL loop's memory calls between rollouts: release (every
    tag) and resume. On a CPU host SGLang's release ended in a CUDA
    synchronize that killed the scheduler, plain decoding included
    (adapter/cpu_memory_occupation.py); now both return and the server
    serves the same tokens (the radix cache flushed: KV and drafter context
    rebuilt from the prompts)."""
    _post(server, "/release_memory_occupation")
    _post(server, "/resume_memory_occupation")
    assert [o["output_ids"] for o in _streams(server, prompt_ids).join()] == unpaused
