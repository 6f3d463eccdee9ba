"""Speculation off (W = 0) as a one-row TARGET_VERIFY with its own captured graphs.

In a DFLASH server SGLang's decode graph runner holds TARGET_VERIFY graphs at
the full block only, so the worker's W = 0 step, the target's DECODE forward,
runs eagerly: on a GPU, below plain decoding's captured decode step by the
launch overhead of every kernel of the target. This module gives the W = 0 step
graphs of its own, the way SGLang's adaptive EAGLE worker captures the target at
other verify widths (`eagle_worker_v2.build_adaptive_runtime_state`): a second
attention backend of the target runner and a second `DecodeCudaGraphRunner`
on it, captured with one token per request, swapped onto the runner for the
step (`active`) and back.

Where it applies (`wanted`): a target attention backend that sizes
TARGET_VERIFY from the batch (`verify_widths`: triton, flashinfer,
torch_native, intel_xpu), so that one row per request is a width it verifies
losslessly; no recurrent state (a verify leaves GDN / Mamba state to a commit,
a DECODE step writes it); no LoRA or two-batch overlap (their graph buffers are
sized once, by SGLang's own runner, for its width). Elsewhere W = 0 stays the
eager DECODE forward. `SGLANG_DFLASH_ONE_ROW_OFF=1` runs the one-row verify
eagerly, on any device (how the CPU tests serve it), `=0` turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

logger = logging.getLogger(__name__)

ENV = "SGLANG_DFLASH_ONE_ROW_OFF"  # "1": always (eager off CUDA), "0": never, unset: auto
OVERRIDE_SOURCE = "sglang-dflash.one_row_verify"


def wanted(*, cuda_graphs: bool, any_width: bool, widths: tuple[int, ...],
           mode: str, linear_state: bool, lora: bool, two_batch_overlap: bool,
           prefill_server: bool = False, env: str | None = None) -> tuple[str | None, str]:
    """How W = 0 runs as a one-row verify, and why (for the log): "graphs"
    (captured), "eager" (forced), or None (the DECODE forward instead).

    Args:
        cuda_graphs: SGLang captures decode graphs on this CUDA server.
        any_width: the target backend verifies any width from the batch
            (`verify_widths` rule ANY).
        widths: the policy's widths; mode: its mode ("on" never runs W = 0).
        prefill_server: a PD prefill server, which never decodes (and whose
            pool lacks the verify scratch a capture needs).
    """
    env = os.environ.get(ENV) if env is None else env
    if env == "0":
        return None, f"{ENV}=0"
    if 0 not in widths or mode == "on" or prefill_server:
        return None, "no W = 0 steps"
    for blocked, why in ((not any_width, "the attention backend sizes the verify from the block"),
                         (linear_state, "a target with recurrent state"),
                         (lora, "LoRA"), (two_batch_overlap, "two-batch overlap")):
        if blocked:
            return None, why
    if env == "1":
        return "eager", f"{ENV}=1"
    if not cuda_graphs:
        return None, "no CUDA graphs (the DECODE forward is as fast eagerly)"
    return "graphs", "CUDA graphs"


class OneRowVerify:
    """The target's attention backend and graph runner for one-row verifies.

    `graphs` is None when forced eagerly (`SGLANG_DFLASH_ONE_ROW_OFF=1`): the
    step then runs the one-row verify eagerly on `attn_backend`."""

    def __init__(self, model_runner, attn_backend, graphs):
        self.model_runner = model_runner
        self.attn_backend = attn_backend
        self.graphs = graphs
        self.max_bs = None if graphs is None else int(max(graphs.capture_bs))
        self.steps = 0

    @classmethod
    def build(cls, model_runner, capture: bool) -> OneRowVerify:
        """A fresh attention backend of the target runner (its own metadata and
        graph buffers) and, with `capture`, its TARGET_VERIFY graphs at one
        token per request. Both are built while the resolved speculative width
        reads 1 (backends and SGLang's runner size buffers and the capture's
        verify input from it), as SGLang's adaptive EAGLE worker builds a
        width's backend and runner, and the width is restored after. A failed
        capture raises: the caller falls back to the DECODE forward."""
        from sglang.srt.runtime_context import get_context, get_spec

        block = get_spec().speculative_num_draft_tokens
        saved_workspace = model_runner.init_new_workspace
        get_context().override(OVERRIDE_SOURCE, speculative_num_draft_tokens=1)
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
            graphs = None
            if capture:
                runner_cls = model_runner._decode_cuda_graph_runner_cls()
                graphs = runner_cls(model_runner, attn_backend=backend, speculative_num_draft_tokens=1)
        finally:
            model_runner.init_new_workspace = saved_workspace
            get_context().override(OVERRIDE_SOURCE + ".restore", speculative_num_draft_tokens=block)
        return cls(model_runner, backend, graphs)

    def takes(self, bs: int) -> bool:
        """Run this batch as a one-row verify: always when forced eagerly, else
        when a graph covers it (a larger batch is eager either way, and the
        DECODE forward is the plainer eager step)."""
        return self.graphs is None or bs <= self.max_bs

    @contextlib.contextmanager
    def active(self):
        """The runner's attention backend and graph runner are this width's for
        the block (SGLang's `prepare_for_verify` and `ModelRunner.forward` read
        both from the runner), then the full block's again."""
        runner = self.model_runner
        saved = runner.attn_backend, runner.decode_cuda_graph_runner
        runner.attn_backend, runner.decode_cuda_graph_runner = self.attn_backend, self.graphs
        self.steps += 1
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = saved

    def snapshot(self) -> dict:
        return {"graphs": None if self.graphs is None else list(self.graphs.capture_bs),
                "steps": self.steps}


def build_logged(model_runner, capture: bool) -> OneRowVerify | None:
    """`OneRowVerify.build`, its time logged; a failed capture is logged and
    leaves W = 0 on the eager DECODE forward (None) rather than stopping the
    server."""
    start = time.perf_counter()
    try:
        built = OneRowVerify.build(model_runner, capture)
    except Exception as e:  # noqa: BLE001 - serve without it rather than not at all; say why
        logger.warning("sglang-dflash: one-row verify graphs for W = 0 failed (%s: %s); "
                       "speculation-off steps run the target's DECODE forward eagerly",
                       type(e).__name__, e)
        return None
    if built.graphs is not None:
        logger.info("sglang-dflash: W = 0 runs as a one-row verify, captured for batch sizes %s "
                    "in %.1fs", list(built.graphs.capture_bs), time.perf_counter() - start)
    else:
        logger.info("sglang-dflash: W = 0 runs as a one-row verify (eager)")
    return built
