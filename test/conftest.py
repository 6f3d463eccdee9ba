"""Test tiers: test/unit (CPU, no SGLang import), test/integration (the real SGLang
engine and HTTP server on the CPU engine, in subprocesses), test/gpu (skipped
without CUDA)."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))


def pytest_configure(config):
    """The slowest tests at the end of every run (CI keeps its log): where CI time goes."""
    if not config.option.durations:
        config.option.durations = 15


def pytest_terminal_summary(terminalreporter):
    """Time per test file (setup, call and teardown together), the slowest first."""
    per_file = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if hasattr(report, "duration") and hasattr(report, "nodeid") and report.nodeid:
                path = report.nodeid.split("::")[0]
                per_file[path] = per_file.get(path, 0.0) + report.duration
    slow = sorted(per_file.items(), key=lambda item: -item[1])[:25]
    if slow:
        terminalreporter.write_sep("=", "time per test file")
        for path, seconds in slow:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "test/gpu" in str(item.fspath).replace(os.sep, "/") and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _autograd_mode_is_not_leaked():
    """A test must not leave autograd disabled for the tests after it."""
    yield
    import torch

    assert torch.is_grad_enabled(), "this test left torch autograd disabled (global set_grad_enabled)"
