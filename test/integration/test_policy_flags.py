"""The speculation policy through SGLang's own flags: `--speculative-adaptive-config PATH`
configures it, `--speculative-adaptive` asks for adaptive, `SGLANG_DFLASH_POLICY` is an
alias; a bad setting fails start-up naming the key."""

import json
import os
import re

import pytest
import requests

from harness import PATHS, Server, launch_to_failure, run_together


def _launch(extra, env_policy=None):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DFLASH_POLICY"}
    if env_policy is not None:
        env["SGLANG_DFLASH_POLICY"] = env_policy
    return launch_to_failure(PATHS["drafter-random"], extra=extra, env=env)


def _config(tmp_path, data):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return str(path)


# name -> (policy file, --speculative-adaptive, SGLANG_DFLASH_POLICY, what the error must say)
BAD = {
    "unknown key": ({"mode": "adaptive", "swich_margin": 0.1}, False, None, "unknown config key(s) ['swich_margin']"),
    "bad value": ({"switch_patience": 0}, False, None, "switch_patience = 0"),
    "flag contradicts mode": ({"mode": "on"}, True, None,
                              "--speculative-adaptive contradicts the policy's mode = 'on'"),
    "file and alias": ({"mode": "on"}, False, '{"mode": "off"}',
                       "both --speculative-adaptive-config and SGLANG_DFLASH_POLICY"),
    "bad alias": (None, False, '{"mode": "sometimes"}', "SGLANG_DFLASH_POLICY: speculation policy: mode = 'sometimes'"),
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every bad setting's launch (run_together: two at a time), by name."""
    calls = {}
    for name, (config, adaptive, env, _) in BAD.items():
        extra = ["--speculative-adaptive"] if adaptive else []
        if config is not None:
            extra += ["--speculative-adaptive-config", _config(tmp_path_factory.mktemp("p"), config)]
        calls[name] = lambda extra=extra, env=env: _launch(extra, env_policy=env)
    return run_together(calls)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_policy_fails_startup_naming_the_problem(launches, name):
    proc, needle = launches[name], BAD[name][3]
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert needle in output, output[-3000:]


def test_config_file_reaches_the_worker_and_metrics_count_verified_drafts(tmp_path, monkeypatch):
    """A served config (fixed width 2, --speculative-adaptive absent) is the policy the
    worker runs; /get_server_info reports it. SGLang's accept rate would divide by
    B-1 = 7 drafts per step; meta_info and the Prometheus gauge divide by the 2
    drafts each step really verified (the demo drafter accepts most of them)."""
    from sglang_dflash.demo import demo_pair

    monkeypatch.delenv("SGLANG_DFLASH_POLICY", raising=False)
    target, drafter = demo_pair()
    path = _config(tmp_path, {"mode": "fixed", "fixed_width": 2})
    server = Server(["--model-path", target, "--speculative-algorithm", "DFLASH",
                     "--speculative-draft-model-path", drafter, "--speculative-adaptive-config", path,
                     "--dtype", "float32", "--enable-metrics", "--decode-log-interval", "5"],
                    log_level="info")
    try:
        reply = requests.post(server.url + "/generate", json={
            "text": "<|im_start|>user\nHow many legs has a cat?<|im_end|>\n<|im_start|>assistant\n",
            "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}, timeout=120)
        assert reply.status_code == 200, reply.text
        meta = reply.json()["meta_info"]
        assert meta["spec_num_proposed_drafts"] == 2 * meta["spec_verify_ct"]
        assert meta["spec_accept_rate"] == meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"]
        assert meta["spec_accept_rate"] > 0.5
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        state = info["internal_states"][0]["dflash"]
        assert state["policy"]["mode"] == "fixed" and state["policy"]["width"] == 2, state["policy"]
        assert state["draft_accept_rate"] > 0.5
        metrics = requests.get(server.url + "/metrics", timeout=30).text
        gauge = [line for line in metrics.splitlines() if line.startswith("sglang:spec_accept_rate")]
        assert gauge and 0.5 < float(gauge[0].split()[-1]) <= 1.0, gauge
        # The drafter's context pool is inside SGLang's KV budget: the bytes per
        # token its pool configurator set aside equal what the pool takes.
        pool = re.search(r"drafter context pool (\d+) slots x (\d+) B = .* counts (\d+) B/token",
                         server.output())
        assert pool, "no context pool line in the server log"
        # Every width on this backend (verify_widths.py), read from the resolved backend.
        assert "verify widths [0, 1, 2, 3, 4, 5, 6, 7] on attention backend 'torch_native'" \
            in server.output()
        assert int(pool.group(2)) == int(pool.group(3)) > 0, pool.group(0)
    finally:
        server.stop()
