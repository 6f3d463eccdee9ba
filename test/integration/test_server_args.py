"""`--max-running-requests` as SGLang resolves it for a DFLASH server (our
`_handle_dflash`), against a plain server's resolution of the same arguments.

Resolution runs in the launching process before any worker starts, so it is
checked in one subprocess (SGLang imported through the CPU stand-in); CUDA
servers resolve on this host too (nothing there touches a device)."""

import json
import subprocess
import sys

from harness import PATHS
from sglang_dflash import cpu_runtime
from sglang_dflash.demo import demo_pair

RESOLVE = """
import json, sys
from sglang_dflash import cpu_runtime
if not cpu_runtime.cuda_available():
    cpu_runtime.activate()
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
load_plugins()
out = {}
for name, kwargs in json.loads(sys.argv[1]).items():
    args = ServerArgs(**kwargs)
    args.resolve_once()
    out[name] = resolving_view(args).max_running_requests
print(json.dumps(out))
"""


def _resolve(cases: dict, stderr: list | None = None) -> dict:
    """Each case's resolved value; a case names its pair (default the demo
    pair) and `dflash` for a DFLASH server. The resolution's log goes to `stderr`."""
    for kwargs in cases.values():
        target, drafter = kwargs.pop("pair", demo_pair())
        kwargs["model_path"] = target
        if kwargs.pop("dflash", False):
            kwargs.update(speculative_algorithm="DFLASH", speculative_draft_model_path=drafter)
    env = None if cpu_runtime.cuda_available() else cpu_runtime.cpu_env()
    proc = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(cases)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_max_running_requests_follows_plain_on_cpu_and_upstream_on_cuda():
    """On a CPU, unset as for plain decoding; SGLang's speculative 48 on CUDA and
    for targets with recurrent state."""
    cpu = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True)
    # A Gated DeltaNet hybrid (without a radix cache: its CPU default needs state snapshots).
    hybrid = dict(cpu, disable_radix_cache=True, pair=(PATHS["hybrid-target"], PATHS["hybrid-drafter-trained"]))
    got = _resolve({
        "plain_cpu": dict(cpu),
        "dflash_cpu": dict(cpu, dflash=True),
        "dflash_cpu_given": dict(cpu, dflash=True, max_running_requests=7),
        "plain_cuda": dict(device="cuda"),
        "dflash_cuda": dict(device="cuda", dflash=True),
        "dflash_cuda_given": dict(device="cuda", dflash=True, max_running_requests=200),
        "dflash_cpu_hybrid": dict(hybrid, dflash=True),
        "dflash_cpu_hybrid_given": dict(hybrid, dflash=True, max_running_requests=64),
    })
    # On a CPU a DFLASH server admits as many requests as a plain one (the
    # scheduler sizes it from the KV pool when unset), not the speculative 48.
    assert got["dflash_cpu"] == got["plain_cpu"]
    assert got["dflash_cpu_given"] == 7
    # On CUDA SGLang's speculative default stands; the user's value always wins.
    assert got["dflash_cuda"] == 48 and got["plain_cuda"] != 48
    assert got["dflash_cuda_given"] == 200
    # A target with recurrent state keeps it on a CPU too: SGLang sizes the state
    # pool's speculative buffers from it and requires a value.
    assert got["dflash_cpu_hybrid"] == 48 and got["dflash_cpu_hybrid_given"] == 64


def test_upstream_only_flags_are_accepted_and_said_not_applied():
    """Flags of SGLang's own worker that ours does not act on (a compact drafter
    cache, relaxed acceptance thresholds, block verification, the drafter's load
    format and KV dtype): a DFLASH server started with them, as a user switching
    over would, resolves as without them and says what it does instead."""
    log = []
    cpu = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True)
    got = _resolve({
        "window": dict(cpu, dflash=True, speculative_draft_window_size=64),
        "thresholds": dict(cpu, dflash=True, speculative_accept_threshold_single=0.5,
                           speculative_accept_threshold_acc=0.7),
        "block_verification": dict(device="cuda", dflash=True, speculative_use_block_verification=True),
        "formats": dict(cpu, dflash=True, speculative_draft_load_format="dummy",
                        speculative_draft_kv_cache_dtype="fp8_e4m3"),
        "none": dict(cpu, dflash=True),
    }, log)
    assert got["window"] == got["thresholds"] == got["none"]
    for said in ("--speculative-draft-window-size 64 is not applied",
                 "--speculative-accept-threshold-single 0.5 / -acc 0.7 is not applied",
                 "--speculative-use-block-verification is not applied",
                 "--speculative-draft-load-format dummy is not applied",
                 "--speculative-draft-kv-cache-dtype fp8_e4m3 is not applied"):
        assert said in log[0], said
    assert log[0].count("is not applied") == 5
