"""A server started with --is-embedding, plain and with DFLASH's flags: it
serves embeddings (DFLASH's equal plain's; its drafter never runs), and a
generation request gets a 400 instead of killing the scheduler (SGLang 0.5.23
ran it and died in the decode step, plain decoding included)."""

import pytest
import requests

from harness import PATHS, TARGET, start_servers, stop_servers

INPUTS = ["hello there", "Janet has 16 eggs and eats 3. How many are left?"]


@pytest.fixture(scope="module")
def servers():
    args = ["--model-path", TARGET, "--dtype", "float32", "--is-embedding"]
    servers = start_servers(args, args + ["--speculative-algorithm", "DFLASH",
                                          "--speculative-draft-model-path", PATHS["drafter-trained"]])
    yield servers
    stop_servers(*servers)


def _embeddings(server) -> list[list[float]]:
    r = requests.post(server.url + "/v1/embeddings", json={"model": "m", "input": INPUTS}, timeout=300)
    assert r.status_code == 200, r.text
    return [row["embedding"] for row in r.json()["data"]]


def test_embeddings_equal_plain_and_generation_refused(servers):
    plain, spec = servers
    want = _embeddings(plain)
    got = _embeddings(spec)
    assert len(want) == len(INPUTS) and len(want[0]) > 0
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=1e-5)
    for server in servers:
        generate = requests.post(server.url + "/generate", timeout=60,
                                 json={"text": INPUTS[0], "sampling_params": {"max_new_tokens": 4}})
        completion = requests.post(server.url + "/v1/completions", timeout=60,
                                   json={"model": "m", "prompt": INPUTS[0], "max_tokens": 4})
        for r in (generate, completion):
            assert r.status_code == 400, (r.status_code, r.text)
            assert "embedding model" in r.text
        assert requests.get(server.url + "/health", timeout=60).status_code == 200
        for a, b in zip(_embeddings(server), want):  # still serving, the same answers
            assert a == pytest.approx(b, abs=1e-5)
