"""Prefill-decode disaggregation under DFLASH: a prefill server and a decode
server, the KV moved between them by SGLang's Mooncake transfer over TCP.

Oracle: the same pair of servers without speculation (its decode server without
the overlap scheduler, which under SGLang's penalties skips a token). Requests:
greedy, greedy with frequency / presence / repetition penalties (the decode
server starts their output counts when the KV arrives: no prefill runs there),
and a regex. The drafter's context K/V of the prompt travels with the target's
KV, so each request's number of verify steps equals a single DFLASH server's
(without it the decode server's first drafts read rows of earlier requests,
and the counts differ).

The CPU pair needs Mooncake's non-CUDA transfer engine (and libibverbs, which
it links against); `.ci/run` installs both. Without them the module is skipped.
"""

import random
import threading

import pytest
import requests

from harness import PATHS, TARGET, Server, chat_prompts, start_servers, stop_servers
from common import free_port

try:
    from mooncake.engine import TransferEngine  # noqa: F401
    _MOONCAKE = None
except ImportError as e:  # not installed, or libibverbs missing
    _MOONCAKE = str(e)

pytestmark = pytest.mark.skipif(_MOONCAKE is not None,
                                reason=f"Mooncake's transfer engine does not import: {_MOONCAKE}")

MAX_NEW = 24
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", PATHS["drafter-trained"]]
# On a host without CUDA SGLang's PD loops need: the TCP transport, a prefill
# server without the overlap scheduler (it records CUDA events), and a decode
# server that backs retracted requests up in plain host tensors (its default
# pool registers pinned pages with CUDA).
TRANSFER = ["--disaggregation-transfer-backend", "mooncake_tcp"]
PREFILL = ["--disaggregation-mode", "prefill", "--disable-overlap-schedule"]
DECODE = ["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "cpu_tensor"]


def _requests():
    prompts = chat_prompts(4)
    greedy = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    penalized = {**greedy, "frequency_penalty": 0.8, "presence_penalty": 0.5, "repetition_penalty": 1.2}
    # Prompt 1's greedy output repeats itself within MAX_NEW tokens, so the
    # penalties change it (the others' outputs repeat no token).
    return ([(p, greedy) for p in prompts] + [(prompts[1], penalized)]
            + [(prompts[0], {**greedy, "regex": r"(yes|no), [a-z]+ [0-9]{1,3}\."})])


class _Pair:
    """A prefill server and a decode server; a request goes to both (as SGLang's router sends it)."""

    def __init__(self, extra: list[str], decode_extra: list[str] = ()):
        self.bootstrap_port = free_port()
        args = ["--model-path", TARGET, "--dtype", "float32", *TRANSFER, *extra]
        self.args = ([*args, *PREFILL, "--disaggregation-bootstrap-port", str(self.bootstrap_port)],
                     [*args, *DECODE, *decode_extra])

    def start(self, prefill: Server, decode: Server):
        self.prefill, self.decode = prefill, decode
        return self

    def generate(self, text, sampling):
        body = {"text": text, "sampling_params": sampling, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": self.bootstrap_port, "bootstrap_room": random.randrange(2**62)}
        responses = {}

        def post(name, server):
            responses[name] = requests.post(server.url + "/generate", json=body, timeout=300)

        threads = [threading.Thread(target=post, args=(name, server))
                   for name, server in (("prefill", self.prefill), ("decode", self.decode))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in ("prefill", "decode"):
            assert responses[name].status_code == 200, (name, responses[name].text)
        return responses["decode"].json()


def _serve_all(pair_or_server, reqs):
    if isinstance(pair_or_server, _Pair):
        return [pair_or_server.generate(text, sampling) for text, sampling in reqs]
    url = pair_or_server.url + "/generate"
    return [requests.post(url, json={"text": text, "sampling_params": sampling}, timeout=300).json()
            for text, sampling in reqs]


def test_dflash_pd_identical_to_plain_pd_and_drafts_from_the_transferred_context():
    reqs = _requests()
    plain_pair, pd_pair = _Pair([], decode_extra=["--disable-overlap-schedule"]), _Pair(DFLASH)
    # Both pairs started together; the single server starts while the PD pair serves.
    servers = start_servers(*plain_pair.args, *pd_pair.args)
    try:
        plain = _serve_all(plain_pair.start(*servers[0:2]), reqs)
        stop_servers(*servers[0:2])
        servers.append(Server(["--model-path", TARGET, "--dtype", "float32", *DFLASH], wait=False))
        pd = _serve_all(pd_pair.start(*servers[2:4]), reqs)
        servers[4].wait()
        single = _serve_all(servers[4], reqs)
    finally:
        stop_servers(*servers)

    for i, (want, got) in enumerate(zip(plain, pd)):
        assert got["output_ids"] == want["output_ids"], f"request {i} ({reqs[i][1]}) differs from plain PD"
    # The penalties change this output, so the decode server applied them.
    assert plain[4]["output_ids"] != plain[1]["output_ids"], "the penalties do not change the output"

    got_steps = [r["meta_info"]["spec_verify_ct"] for r in pd]
    want_steps = [r["meta_info"]["spec_verify_ct"] for r in single]
    assert got_steps == want_steps, "the decode server drafted from another context than a single server"
    accept = sum(r["meta_info"]["completion_tokens"] for r in pd) / sum(got_steps)
    assert accept > 1.5, f"drafts too rarely accepted ({accept:.2f} tokens per verify)"
