"""`--max-running-requests` as SGLang resolves it for a DFLASH server (our
`_handle_dflash`), against a plain server's resolution of the same arguments.

Resolution runs in the launching process before any worker starts, so it is
checked in one subprocess (SGLang imported through the CPU stand-in); CUDA
servers resolve on this host too (nothing there touches a device)."""

import json
import subprocess
import sys

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
target, drafter = sys.argv[1:3]
out = {}
for name, kwargs in json.loads(sys.argv[3]).items():
    args = ServerArgs(model_path=target, **kwargs)
    args.resolve_once()
    out[name] = resolving_view(args).max_running_requests
print(json.dumps(out))
"""


def _resolve(cases: dict) -> dict:
    target, drafter = demo_pair()
    for kwargs in cases.values():
        if kwargs.pop("dflash", False):
            kwargs.update(speculative_algorithm="DFLASH", speculative_draft_model_path=drafter)
    env = None if cpu_runtime.cuda_available() else cpu_runtime.cpu_env()
    proc = subprocess.run([sys.executable, "-c", RESOLVE, target, drafter, json.dumps(cases)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_max_running_requests_follows_plain_on_cpu_and_upstream_on_cuda():
    cpu = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True)
    got = _resolve({
        "plain_cpu": dict(cpu),
        "dflash_cpu": dict(cpu, dflash=True),
        "dflash_cpu_given": dict(cpu, dflash=True, max_running_requests=7),
        "plain_cuda": dict(device="cuda"),
        "dflash_cuda": dict(device="cuda", dflash=True),
        "dflash_cuda_given": dict(device="cuda", dflash=True, max_running_requests=200),
    })
    # On a CPU a DFLASH server admits as many requests as a plain one (the
    # scheduler sizes it from the KV pool when unset), not the speculative 48.
    assert got["dflash_cpu"] == got["plain_cpu"]
    assert got["dflash_cpu_given"] == 7
    # On CUDA SGLang's speculative default stands; the user's value always wins.
    assert got["dflash_cuda"] == 48 and got["plain_cuda"] != 48
    assert got["dflash_cuda_given"] == 200
