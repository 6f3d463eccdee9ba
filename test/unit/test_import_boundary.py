"""Only `sglang_dflash.adapter` may import SGLang (or Triton): the algorithm
modules must import with both made unimportable, and the package root must not
pull in torch."""

import json
import subprocess
import sys

import pytest

CORE_MODULES = [
    "sglang_dflash.checks",
    "sglang_dflash.config",
    "sglang_dflash.model",
    "sglang_dflash.checkpoint",
    "sglang_dflash.draft",
    "sglang_dflash.context",
    "sglang_dflash.candidates",
    "sglang_dflash.select",
    "sglang_dflash.rejection",
    "sglang_dflash.policy",
    "sglang_dflash.stats",
    "sglang_dflash.verify",
    "sglang_dflash.verify_attention",
    "sglang_dflash.propose",
    "sglang_dflash.vocab_head",
    "sglang_dflash.patches",
    "sglang_dflash.ops",
    "sglang_dflash.demo",
    "sglang_dflash.cli",
    "sglang_dflash.cpu_runtime",
    "sglang_dflash.train.objective",
    "sglang_dflash.train.trainer",
    "sglang_dflash.train.cli",
    "sglang_dflash.train.selector_loss",
    "sglang_dflash.reference",
    "sglang_dflash.hub",
    "sglang_dflash.penalties",
    "sglang_dflash.target_support",
    "sglang_dflash.tools.acceptance_report",
    "sglang_dflash.tools.prompts",
    "sglang_dflash.tools.random_target",
    "sglang_dflash.tools.chat_tokenizer",
    "sglang_dflash.tools.tiny_models",
    "sglang_dflash.tools.tiny_hybrid",
    "sglang_dflash.tools.tiny_swa",
    "sglang_dflash.adapter.linear_state",
]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# One interpreter imports the modules in turn (one each took ~2 s of start-up
# apiece). The attribution stays exact: whatever a module pulls in that an
# earlier one had not is imported, with SGLang and Triton blocked, by its import.
_IMPORT_EACH = """
import importlib, json, sys, traceback
sys.modules['sglang'] = None
sys.modules['triton'] = None
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        errors[name] = traceback.format_exc()[-2000:]
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def import_errors():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *CORE_MODULES], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_without_sglang_or_triton(import_errors, module):
    assert module not in import_errors, import_errors[module]


def test_package_root_is_light():
    proc = _run("import sys, sglang_dflash; assert 'torch' not in sys.modules, 'torch imported'")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_policy_is_host_arithmetic_only():
    """The policy runs once per decode step on the host: no torch, no SGLang."""
    proc = _run("import sys, sglang_dflash.policy; "
                "assert 'torch' not in sys.modules and 'sglang' not in sys.modules")
    assert proc.returncode == 0, proc.stderr[-2000:]
