"""A multimodal target under DFLASH: the tiny Qwen3-VL pair (`tools/tiny_vl.py`).

SGLang 0.5.23 could not start DFLASH with a Qwen3-VL target (its model class
asks its language model for a method that class lacks;
adapter/layer_capture.py). Served now, its output must equal plain decoding's
on the same target: images become vision-tower rows in the prompt, M-RoPE
gives them 2-D positions and shifts the text after them, so every verify block
needs the request's position offset (as does a W = 0 step, served by a third
server with speculation off), and prefill chunks of 16 tokens split the images
between chunks. Chat requests with one or two images and text-only
ones, one at a time and eight at once, on the OpenAI route and native
/generate (with logprobs); a repeated image prompt served from the radix cache.
"""

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from harness import PATHS, start_servers, stop_servers

QUESTIONS = ("Describe the picture.", "Tom has 3 apples and buys 5 more. How many?", "What colour is it?")
SIZES = ((64, 64), (96, 64), (128, 96))  # 4, 6 and 12 image tokens after the 2 x 2 merge
GREEDY = {"max_tokens": 48, "temperature": 0}


@pytest.fixture(scope="module")
def servers():
    args = ["--model-path", PATHS["vl-target"], "--dtype", "float32", "--chunked-prefill-size", "16",
            "--enable-cache-report"]
    spec = args + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", PATHS["vl-drafter"]]
    # (plain, DFLASH always on, DFLASH off: W = 0 steps through the target's
    # DECODE forward, whose M-RoPE positions SGLang builds apart from a verify's)
    servers = start_servers(args, spec, (spec, {"SGLANG_DFLASH_POLICY": '{"mode": "off"}'}))
    yield servers
    stop_servers(*servers)


def _image(i: int) -> str:
    """A noise image as a data URL (seeded: the same bytes on every run)."""
    w, h = SIZES[i]
    pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat_bodies() -> list[dict]:
    def image(i):
        return {"type": "image_url", "image_url": {"url": _image(i)}}

    contents = [[{"type": "text", "text": "Look:"}, image(i), {"type": "text", "text": q}]
                for i in range(len(SIZES)) for q in QUESTIONS]
    contents.append([image(0), image(2), {"type": "text", "text": "Compare them."}])
    contents.append(QUESTIONS[1])
    return [{"model": "m", "messages": [{"role": "user", "content": c}], **GREEDY} for c in contents]


def _chat(server, body) -> dict:
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _texts(server, bodies, workers: int = 1) -> list[str]:
    with ThreadPoolExecutor(workers) as pool:
        return [out["choices"][0]["message"]["content"] for out in pool.map(lambda b: _chat(server, b), bodies)]


def test_image_chats_equal_plain(servers):
    plain, spec, off = servers
    bodies = _chat_bodies()
    want = _texts(plain, bodies)
    assert len(set(want)) > len(want) // 2, "the images should change the answers"
    assert _texts(spec, bodies) == want
    assert _texts(spec, bodies, workers=8) == want
    assert _texts(off, bodies, workers=8) == want
    # The first prompt again: its image tokens come from the radix cache.
    again = _chat(spec, bodies[0])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["choices"][0]["message"]["content"] == want[0]
    state = requests.get(spec.url + "/get_server_info", timeout=60).json()["internal_states"][0]["dflash"]
    assert state["mean_acceptance_length"] > 1.5, state["mean_acceptance_length"]


def test_native_generate_with_image_data_equals_plain(servers):
    """/generate with `image_data` and the template's vision tokens in the text,
    prompt and output logprobs returned."""
    text = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe it.<|im_end|>\n"
            "<|im_start|>assistant\n")
    body = {"text": text, "image_data": _image(1), "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    outs = []
    for server in servers:
        r = requests.post(server.url + "/generate", json=body, timeout=300)
        assert r.status_code == 200, r.text
        outs.append(r.json())
    want = outs[0]
    for got in outs[1:]:
        assert got["output_ids"] == want["output_ids"]
        assert len(got["meta_info"]["input_token_logprobs"]) == len(want["meta_info"]["input_token_logprobs"])
        for (lp_got, tok_got, _), (lp_want, tok_want, _) in zip(got["meta_info"]["output_token_logprobs"],
                                                                want["meta_info"]["output_token_logprobs"]):
            assert tok_got == tok_want and lp_got == pytest.approx(lp_want, abs=1e-4)
