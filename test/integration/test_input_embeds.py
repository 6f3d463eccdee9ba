"""Prompts given as embeddings (`input_embeds`, native /generate) on a float32
target: SGLang 0.5.23 casts them to bfloat16 and the server died on its first
matmul (adapter/input_embeds.py). A prompt sent as its own token embeddings now
decodes as the same prompt sent as ids, and DFLASH's output equals plain
decoding's, one request or several at once; both servers keep serving."""

import os

import pytest
import requests
from safetensors.torch import load_file
from transformers import AutoTokenizer

from harness import PATHS, TARGET, chat_prompts, start_servers, stop_servers

GREEDY = {"max_new_tokens": 32, "temperature": 0.0}


@pytest.fixture(scope="module")
def servers():
    """(plain, DFLASH) on the tiny float32 target; SGLang takes input_embeds
    only without the radix cache."""
    args = ["--model-path", TARGET, "--dtype", "float32", "--disable-radix-cache"]
    servers = start_servers(args, args + ["--speculative-algorithm", "DFLASH",
                                          "--speculative-draft-model-path", PATHS["drafter-trained"]])
    yield servers
    stop_servers(*servers)


@pytest.fixture(scope="module")
def prompts():
    """(token ids, their embedding rows) of three chat prompts."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    table = load_file(os.path.join(TARGET, "model.safetensors"))["model.embed_tokens.weight"]
    ids = [tok(text).input_ids for text in chat_prompts(3)]
    return ids, [table[i].tolist() for i in ids]


def _generate(server, **body):
    r = requests.post(server.url + "/generate", json={"sampling_params": GREEDY, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_input_embeds_decode_as_their_ids(servers, prompts):
    plain, spec = servers
    ids, embeds = prompts
    want = [_generate(plain, input_ids=one)["output_ids"] for one in ids]
    for server in servers:
        got = [_generate(server, input_embeds=one)["output_ids"] for one in embeds]
        assert got == want
    batched = _generate(spec, input_embeds=embeds)
    assert [out["output_ids"] for out in batched] == want
    verify_steps = sum(out["meta_info"]["spec_verify_ct"] for out in batched)
    assert verify_steps < sum(map(len, want)), "DFLASH should accept drafts after an embedded prompt"
    for server in servers:
        assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200
