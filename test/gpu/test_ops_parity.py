"""Triton kernels against their torch twins on CUDA, and CUDA-graph capture.

Runs the interpreter checks of test/unit/test_ops_interpret.py on CUDA tensors
(kernel vs the same-device twin), then sizes the interpreter cannot afford:
vocabulary 151,936 and batch 256, with poisoned outputs. Skipped without CUDA
by test/conftest.py.
"""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "unit"))

import test_ops_interpret as shared  # noqa: E402
from sglang_dflash import ops, select  # noqa: E402
from sglang_dflash.ops.rejection_ref import chain_rejection_sample_uniforms  # noqa: E402

CUDA = "cuda"
VOCAB_QWEN3 = 151_936


@pytest.mark.parametrize("name", sorted(shared.KERNEL_CHECKS))
def test_kernel_matches_twin_on_cuda(name):
    pytest.importorskip("triton")
    shared.KERNEL_CHECKS[name](device=CUDA)


def test_dispatch_picks_triton_on_cuda(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv(ops.DISABLE_TRITON_ENV, raising=False)
    ops.reset_backend_cache()
    try:
        assert ops.backend(CUDA) == ops.BACKEND_TRITON
        monkeypatch.setenv(ops.DISABLE_TRITON_ENV, "1")
        ops.reset_backend_cache()
        assert ops.backend(CUDA) == ops.BACKEND_TORCH
    finally:
        ops.reset_backend_cache()


def test_walk_large_batch_poisoned_outputs():
    from sglang_dflash.ops import walk_triton

    args = shared._to(CUDA, shared._walk_inputs(40, bs=256, slots=7, k=16, nonfinite=True))
    tokens = torch.full((256, 7), -9, dtype=torch.int64, device=CUDA)
    choice = torch.full_like(tokens, -9)
    q = torch.full((256, 7, 16), float("nan"), device=CUDA)
    walk_triton.walk_into(*args, tokens, choice, q)
    got = select.Path(tokens=tokens, choice=choice, q=q)
    assert not bool(q.isnan().any()) and bool((choice >= 0).all())
    shared._assert_paths_equal(got, select.walk(*args))


@pytest.mark.parametrize("bs", [1, 16])
def test_rejection_qwen3_vocab_poisoned_outputs(bs):
    from sglang_dflash.ops import rejection_triton

    args = shared._to(CUDA, shared._chain_inputs(50 + bs, bs=bs, slots=7, vocab=VOCAB_QWEN3))
    accept_len = torch.full((bs,), -9, dtype=torch.int64, device=CUDA)
    tokens = torch.full((bs, 8), -9, dtype=torch.int64, device=CUDA)
    rejection_triton.chain_rejection_into(*args, accept_len, tokens)
    want = chain_rejection_sample_uniforms(*args)
    assert torch.equal(accept_len, want.accept_len)
    assert torch.equal(tokens, want.tokens)


def _capture(fn, warmup_stream_runs=2):
    """Capture fn() in a CUDA graph after warm-up on a side stream; return (graph, out)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_stream_runs):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("use_triton", [True, False])
def test_selector_walk_graph_replay_equals_eager(monkeypatch, use_triton):
    if use_triton:
        pytest.importorskip("triton")
        monkeypatch.delenv(ops.DISABLE_TRITON_ENV, raising=False)
    else:
        monkeypatch.setenv(ops.DISABLE_TRITON_ENV, "1")
    ops.reset_backend_cache()
    try:
        static = [t.clone() for t in shared._to(CUDA, shared._walk_inputs(60, 8, 7, 16))]
        graph, out = _capture(lambda: ops.selector_walk(*static))
        assert ops.backend(CUDA) == (ops.BACKEND_TRITON if use_triton else ops.BACKEND_TORCH)
        for seed in range(61, 65):  # new inputs copied into the static buffers, then replay
            fresh = shared._to(CUDA, shared._walk_inputs(seed, 8, 7, 16, nonfinite=seed % 2 == 0))
            for buf, value in zip(static, fresh):
                buf.copy_(value)
            graph.replay()
            torch.cuda.synchronize()
            shared._assert_paths_equal(out, select.walk(*fresh))
    finally:
        ops.reset_backend_cache()


@pytest.mark.parametrize("use_triton", [True, False])
def test_chain_rejection_graph_replay_equals_eager(monkeypatch, use_triton):
    if use_triton:
        pytest.importorskip("triton")
        monkeypatch.delenv(ops.DISABLE_TRITON_ENV, raising=False)
    else:
        monkeypatch.setenv(ops.DISABLE_TRITON_ENV, "1")
    ops.reset_backend_cache()
    try:
        static = [t.clone() for t in shared._to(CUDA, shared._chain_inputs(70, 8, 7, 1000))]
        graph, out = _capture(lambda: ops.chain_rejection(*static))
        assert ops.backend(CUDA) == (ops.BACKEND_TRITON if use_triton else ops.BACKEND_TORCH)
        for seed in range(71, 74):
            fresh = shared._to(CUDA, shared._chain_inputs(seed, 8, 7, 1000))
            for buf, value in zip(static, fresh):
                buf.copy_(value)
            graph.replay()
            torch.cuda.synchronize()
            shared._assert_results_equal(out, chain_rejection_sample_uniforms(*fresh))
    finally:
        ops.reset_backend_cache()
