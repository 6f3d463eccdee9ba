"""Every SGLang symbol the plugin hooks exists in the installed SGLang: HookRegistry
logs a misspelt target and leaves the original in place, so a silent miss would
only show as a feature that quietly does nothing."""

import subprocess
import sys

from sglang_dflash import cpu_runtime

CHECK = """
import importlib, pkgutil
from sglang_dflash import cpu_runtime
if not cpu_runtime.cuda_available():
    cpu_runtime.activate()
import sglang_dflash.adapter as adapter
targets = []
for info in pkgutil.iter_modules(adapter.__path__):  # every adapter module: none can be left out
    module = importlib.import_module(f"sglang_dflash.adapter.{info.name}")
    targets += [v for k, v in vars(module).items() if k.endswith("_TARGET") and isinstance(v, str)]
for t in sorted(set(targets)):
    pkgutil.resolve_name(t)
print(len(set(targets)))
"""


def test_every_hook_target_resolves():
    env = None if cpu_runtime.cuda_available() else cpu_runtime.cpu_env(dict(__import__("os").environ))
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 25


REGISTRY = """
from sglang_dflash import cpu_runtime
if not cpu_runtime.cuda_available():
    cpu_runtime.activate()
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
print(" ".join(sorted(ATTENTION_BACKENDS)))
"""


def test_verify_width_table_names_every_registered_attention_backend():
    """A backend SGLang registers but the table does not name would be treated as
    full-block-only by guess; the table must rule on each one from its source."""
    from sglang_dflash.verify_widths import BACKENDS

    env = None if cpu_runtime.cuda_available() else cpu_runtime.cpu_env(dict(__import__("os").environ))
    proc = subprocess.run([sys.executable, "-c", REGISTRY], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    registered = set(proc.stdout.split())
    assert len(registered) > 10 and registered <= set(BACKENDS), registered - set(BACKENDS)


PENALTY_ORDER = """
from sglang_dflash import cpu_runtime
if not cpu_runtime.cuda_available():
    cpu_runtime.activate()
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.sampling import penaltylib


class Batch:
    device, reqs = "cpu", []


batch = Batch()
for given in ([penaltylib.BatchedRepetitionPenalizer, penaltylib.BatchedPresencePenalizer,
               penaltylib.BatchedMinNewTokensPenalizer, penaltylib.BatchedFrequencyPenalizer],
              {penaltylib.BatchedRepetitionPenalizer, penaltylib.BatchedFrequencyPenalizer}):
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(vocab_size=8, batch=batch, penalizers=given)
    print(" ".join(cls.__name__ for cls in orchestrator.penalizers))
"""


def test_sglang_applies_penalties_in_the_fixed_order():
    """SGLang's orchestrator, built as SGLang builds it (from a set, whose order
    varies between processes), holds the penalizers additive first under the
    plugin (adapter/penalty_order.py); the first case is given reversed."""
    env = None if cpu_runtime.cuda_available() else cpu_runtime.cpu_env(dict(__import__("os").environ))
    proc = subprocess.run([sys.executable, "-c", PENALTY_ORDER], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == [
        "BatchedFrequencyPenalizer BatchedMinNewTokensPenalizer BatchedPresencePenalizer BatchedRepetitionPenalizer",
        "BatchedFrequencyPenalizer BatchedRepetitionPenalizer"]
