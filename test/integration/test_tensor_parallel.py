"""Tensor and data parallelism on the CPU engine (two ranks, one core each).

The demo pair (a trained DFlash 2 drafter, so drafts are accepted and the
vocab-parallel candidate merge matters):

* greedy DFLASH at --tp 2 is token-identical to plain decoding at --tp 2 and
  to DFLASH at --tp 1 (32 prompts in batches of 8, the first 8 one at a time),
  with the adaptive policy (rank 0's widths broadcast) and
  SGLANG_DFLASH_TP_CHECK=1, which all-gathers every step's verified tokens and
  stops the server if the ranks ever disagree;
* return_hidden_states at --tp 2 returns plain --tp 2's final states;
* sampling at --tp 2 keeps the target's distribution (chi-square homogeneity
  against plain --tp 2 and fit to the exact distribution, as in test_sampling.py);
* an aborted request under --tp 2 leaves the server serving the same output;
* --dp-size 2 serves DFLASH, each replica with its own policy, identical to
  DFLASH on one rank;
* drafter weight updates reach both ranks' replicated drafters
  (update_weights_from_tensor and update_weights_from_distributed), and a
  target update from disk serves as plain --tp 2 on the new weights.
"""

import threading
import time

import pytest
import requests
import torch

from harness import Job, Server, assert_same_hidden_states, noised_copy, redrawn_copy, run_engine, run_engines
from sampling_power import (P_MIN, SAMPLING, exact_distributions, feature_probs, mean_accept, min_fit_p, min_p,
                            sampled_features, sampling_prompt, simulated_power)

NUM_PROMPTS = 32
# batch size -> prompts: one at a time is the slow part, and takes the path of 8
BATCH_SIZES = {1: 8, 8: NUM_PROMPTS}
GREEDY = {"max_new_tokens": 32, "temperature": 0.0}
N_SAMPLES = 5000
ADAPTIVE = '{"mode": "adaptive"}'


@pytest.fixture(scope="module")
def demo():
    from transformers import AutoTokenizer

    from sglang_dflash.demo import demo_pair
    from sglang_dflash.tools.prompts import chat_text, mixed_prompts

    target, drafter = demo_pair()
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [chat_text(tok, p) for p in mixed_prompts(NUM_PROMPTS)]
    return {"target": target, "drafter": drafter, "prompts": prompts, "tokenizer": tok,
            "sampled_prompt": sampling_prompt(target)}


def _engine(demo, **extra):
    return {"model_path": demo["target"], "max_running_requests": 64, **extra}


def _dflash(demo):
    return {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": demo["drafter"]}


def _greedy_runs(demo):
    return [{"name": f"bs{bs}", "prompts": demo["prompts"][:n], "batch_size": bs,
             "sampling_params": GREEDY} for bs, n in BATCH_SIZES.items()]


HIDDEN_ASKS = [True, "last", False, True]


def _hidden_states_run(demo):
    return {"name": "hidden", "prompts": demo["prompts"][-4:], "batch_size": 4, "sampling_params": GREEDY,
            "return_hidden_states": HIDDEN_ASKS}


def _sampling_run(demo):
    return {"name": "sampled", "prompts": [demo["sampled_prompt"]] * N_SAMPLES,
            "batch_size": 256, "sampling_params": SAMPLING}


@pytest.fixture(scope="module")
def engines(demo):
    """Plain --tp 2, DFLASH --tp 1 and DFLASH --tp 2 (adaptive, ranks checked
    against each other every step), started together."""
    tp2_env = {"SGLANG_DFLASH_POLICY": ADAPTIVE, "SGLANG_DFLASH_TP_CHECK": "1"}
    tp2 = dict(tp_size=2, enable_return_hidden_states=True)
    tp2_runs = _greedy_runs(demo) + [_sampling_run(demo), _hidden_states_run(demo)]
    return run_engines([
        Job(_engine(demo, **tp2), tp2_runs),
        Job(_engine(demo, **_dflash(demo)), _greedy_runs(demo)),
        Job(_engine(demo, **tp2, **_dflash(demo)), tp2_runs, True, tp2_env),
    ])


@pytest.fixture(scope="module")
def plain_tp2(engines):
    return engines[0]


@pytest.fixture(scope="module")
def dflash_tp1(engines):
    return engines[1]


@pytest.fixture(scope="module")
def dflash_tp2(engines):
    return engines[2]


def _ids(run):
    return [r["output_ids"] for r in run["results"]]


def _assert_same(want, got, label):
    for bs, n in BATCH_SIZES.items():
        name = f"bs{bs}"
        a, b = _ids(want[name]), _ids(got[name])
        assert len(a) == len(b) == n
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert not diff, f"{label} {name}: prompts {diff} differ"


def test_greedy_tp2_identical_to_plain_tp2_and_to_tp1(plain_tp2, dflash_tp1, dflash_tp2):
    runs, state = dflash_tp2
    _assert_same(plain_tp2, runs, "DFLASH tp2 vs plain tp2")
    _assert_same(dflash_tp1, runs, "DFLASH tp2 vs DFLASH tp1")
    lengths = [r["meta_info"]["spec_accept_length"] for r in runs["bs1"]["results"]]
    assert sum(lengths) / len(lengths) > 2.0, lengths  # the trained drafter really speculates
    assert state["policy"]["mode"] == "adaptive" and state["steps"] > 0


def test_returned_hidden_states_tp2_equal_plain_tp2(plain_tp2, dflash_tp2):
    """return_hidden_states under --tp 2 (True, "last", none in one batch): the
    target's final states as plain --tp 2 returns them, within float noise."""
    runs = dflash_tp2[0]
    assert _ids(runs["hidden"]) == _ids(plain_tp2["hidden"])
    assert_same_hidden_states(plain_tp2["hidden"], runs["hidden"], HIDDEN_ASKS, "tp2")


def test_sampling_tp2_matches_plain_tp2(demo, plain_tp2, dflash_tp2):
    """Tokens 2-4 and the pair (2, 3) of test_sampling.py's prompt, its statistics;
    p < 1e-4 fails. At N_SAMPLES the homogeneity test rejects a temperature
    change of 0.1 in >= 95% of simulated runs (`benchmark/sampling_power.py`);
    plain --tp 2 must fit the target's exact distribution too."""
    exact, hot = exact_distributions(demo["target"], demo["sampled_prompt"], SAMPLING,
                                     {**SAMPLING, "temperature": 1.0})
    power = simulated_power(exact, hot, N_SAMPLES, reps=40)
    assert power >= 0.95, f"the test at N = {N_SAMPLES} rejects T = 1.0 in only {power:.0%} of simulated runs"
    probs = feature_probs(exact)
    base = sampled_features(_ids(plain_tp2["sampled"]))
    got = sampled_features(_ids(dflash_tp2[0]["sampled"]))
    assert min(len(base["token2"]), len(got["token2"])) > 0.95 * N_SAMPLES
    key, p = min_p(base, got)
    assert p >= P_MIN, f"tp2: {key} differs from plain sampling (chi-square p = {p:.2e})"
    for label, sample in (("plain tp2", base), ("DFLASH tp2", got)):
        key, p = min_fit_p(sample, probs)
        assert p >= P_MIN, f"{label}: {key} does not fit the target's exact distribution (p = {p:.2e})"
    # drafts accepted under sampling: q and p both matter
    assert mean_accept(dflash_tp2[0]["sampled"]["results"]) > 1.2


def test_abort_under_tp2(demo, dflash_tp1):
    """A request aborted mid-generation under --tp 2: the ranks drop it together
    (no hang, no disagreement), and the server then serves every prompt as
    DFLASH at --tp 1 does."""
    srv = Server(["--model-path", demo["target"], "--speculative-algorithm", "DFLASH",
                  "--speculative-draft-model-path", demo["drafter"], "--tp-size", "2"])
    try:
        room = 500 - len(demo["tokenizer"](demo["prompts"][1])["input_ids"])  # context: 512
        body = {"text": demo["prompts"][1], "rid": "victim",
                "sampling_params": {"max_new_tokens": room, "temperature": 0.0, "ignore_eos": True}}
        reply = {}
        victim = threading.Thread(target=lambda: reply.update(
            r=requests.post(srv.url + "/generate", json=body, timeout=600)))
        victim.start()
        time.sleep(0.3)
        requests.post(srv.url + "/abort_request", json={"rid": "victim"}, timeout=60).raise_for_status()
        victim.join(timeout=600)
        r = reply["r"]
        r.raise_for_status()
        meta = r.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert meta["completion_tokens"] < room
        want = _ids(dflash_tp1["bs1"])
        for i in (0, 1):
            got = requests.post(srv.url + "/generate", timeout=600, json={
                "text": demo["prompts"][i], "sampling_params": GREEDY}).json()
            assert got["output_ids"] == want[i], i
    finally:
        srv.stop()


def test_dp2_serves_dflash(demo, dflash_tp1):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_DFLASH_POLICY", ADAPTIVE)
        runs = run_engine(_engine(demo, dp_size=2, **_dflash(demo)), _greedy_runs(demo)[1:])
    a, b = _ids(dflash_tp1["bs8"]), _ids(runs["bs8"])
    assert a == b
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in runs["bs8"]["results"])


def test_weight_updates_under_tp2(demo, dflash_tp1, tmp_path):
    """A --tp 2 server started with a random drafter of the demo drafter's shape
    takes the demo drafter's tensors (update_weights_from_tensor, selector
    "draft"), then the random ones again (update_weights_from_distributed, from a
    trainer broadcasting to both ranks over gloo). Output stays DFLASH --tp 1's;
    both ranks report the same drafter checksums after each update; the trained
    tensors make drafts accepted, the random ones restore the start's checksums.
    Then the target's weights from disk (a noised copy, both ranks loading their
    shards; the drafter keeps its own and reads the target's embedding and head):
    output equals plain --tp 2 started on that copy, which differs from the
    original's. Then the original target's tensors (update_weights_from_tensor,
    selector "all": full tensors, each rank taking its shard; the drafter takes
    none of the target's names): DFLASH --tp 1's output again. The engine drafts
    on the static buffers (SGLANG_DFLASH_STATIC_DRAFT=1, the path a CUDA graph
    replays, eager here), which must see every update in place."""
    random_drafter = redrawn_copy(demo["drafter"], tmp_path / "random", torch.Generator().manual_seed(0))
    target2 = noised_copy(demo["target"], tmp_path / "target2", 0.3, torch.Generator().manual_seed(1))
    check = {"op": "check", "selector": "draft"}

    def run(name, *ops):
        return {"name": name, "prompts": demo["prompts"][:8], "batch_size": 8, "sampling_params": GREEDY,
                "weights": list(ops)}

    (runs, state), plain2 = run_engines([
        Job(_engine(demo, tp_size=2, speculative_algorithm="DFLASH", speculative_draft_model_path=random_drafter), [
            run("random", check),
            run("trained", {"op": "tensor", "path": demo["drafter"], "selector": "draft"}, check),
            run("back", {"op": "distributed", "path": random_drafter, "selector": "draft"}, check),
            run("target2", {"op": "tensor", "path": demo["drafter"], "selector": "draft"},
                {"op": "disk", "path": target2}, check),
            run("target-back", {"op": "tensor", "path": demo["target"], "selector": "all"}, check)],
            with_state=True, env={"SGLANG_DFLASH_STATIC_DRAFT": "1"}),
        Job({**_engine(demo, tp_size=2), "model_path": target2}, [run("target2")])])
    want = _ids(dflash_tp1["bs8"])[:8]
    sums, accept = {}, {}
    for name, result in runs.items():
        assert _ids(result) == (_ids(plain2["target2"]) if name == "target2" else want), name
        *updates, (ok, _, ranks) = result["weights"]
        assert ok and all(u[0] for u in updates), result["weights"]
        assert len(ranks) == 2 and ranks[0] == ranks[1], f"{name}: the ranks' drafters differ"
        sums[name] = ranks[0]
        lengths = [r["meta_info"]["spec_accept_length"] for r in result["results"]]
        accept[name] = sum(lengths) / len(lengths)
    assert sums["trained"] != sums["random"] == sums["back"] and sums["target2"] == sums["trained"] == \
        sums["target-back"]
    assert accept["trained"] > 1.5 > max(accept["random"], accept["back"]), accept
    assert _ids(plain2["target2"]) != want  # the new target's output is its own
    assert state["static_draft"]["steps"] > 0, state
