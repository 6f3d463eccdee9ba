"""Hybrid targets (Gated DeltaNet or short-convolution layers): commit the
accepted position's linear-attention state after a verify.

A full-attention layer keeps every verified row's K/V in the pool; a rejected
row's slot is simply overwritten later. A linear-attention layer instead keeps
one recurrent state and one conv window per request (an LFM2 conv layer: the
window only). SGLang's GDN and short-conv verifies keep the state after each
position in the pool's speculative buffers (row = the request's batch position, step = the
verify position); after acceptance the state after the last committed position
(commit_len - 1: the anchor is always committed) becomes the request's state.
A W = 0 step is a plain DECODE forward, which updates the state itself.

With SGLang's hybrid radix cache in its `extra_buffer` mode (the GPU default for
these targets) the cache also keeps a request's state at every multiple of a
grid length: a plain DECODE step copies it into the request's track slot when
the length reaches one, and after a verify the commit does, from the verify
step whose state is that length's (`steps_to_track`). Without it a later request
that hits the cached prefix would resume from a state that is not its prefix's.
"""

from __future__ import annotations

import torch


def has_linear_state(model_runner) -> bool:
    """Whether the target keeps per-request linear-attention state (a GDN hybrid)."""
    pool = getattr(model_runner, "req_to_token_pool", None)
    return callable(getattr(pool, "get_speculative_mamba2_params_all_layers", None))


def steps_to_track(prefix: torch.Tensor, new_lens: torch.Tensor, grid: int) -> torch.Tensor:
    """[bs] int64: the verify step after which a request's length is the last
    multiple of `grid` it reached in this verify, or -1 where it reached none.
    prefix / new_lens [bs]: committed lengths before / after the verify (step i
    leaves the state of length prefix + i + 1)."""
    prefix, new_lens = prefix.to(torch.int64), new_lens.to(torch.int64)
    reached = new_lens // grid * grid
    return torch.where(reached > prefix, reached - prefix - 1, torch.full_like(prefix, -1))


def prefix_cache_track(batch, prefix: torch.Tensor, new_lens: torch.Tensor):
    """(track slots [bs], steps [bs]) for the hybrid radix cache's extra buffer,
    or None where the batch tracks nothing."""
    slots = getattr(batch, "mamba_track_indices", None)
    if slots is None:
        return None
    from sglang.srt.runtime_context import mamba_track_grid

    return slots, steps_to_track(prefix, new_lens, mamba_track_grid(batch.tree_cache.page_size))


def commit_accepted_state(model_runner, commit_lens: torch.Tensor, track=None, req_pool_indices=None) -> None:
    """After a verify of bs requests (before any other target forward): each
    request's linear-attention state := the state after its last committed
    position. commit_lens [bs] int, >= 1; track: `prefix_cache_track`'s pair."""
    last_step = commit_lens.to(torch.int64) - 1
    backend = model_runner.attn_backend
    if last_step.device.type != "cpu":
        # SGLang's own commit (Triton scatter on CUDA / XPU, its slot layouts),
        # which also fills the track slots.
        slots, steps = track if track is not None else (None, None)
        backend.update_mamba_state_after_mtp_verify(last_step, slots, steps, model_runner.model,
                                                     req_pool_indices=req_pool_indices)
        return
    if track is not None:  # SGLang's CPU engine refuses extra_buffer at start-up
        raise RuntimeError("sglang-dflash: the hybrid radix cache's extra_buffer is not supported on CPU")
    bs = last_step.shape[0]
    slots = backend.linear_attn_backend.forward_metadata.mamba_cache_indices[:bs].to(torch.int64)
    caches = model_runner.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    if caches.temporal.numel():  # a short-conv hybrid (LFM2) keeps conv windows only
        copy_accepted(caches.temporal, caches.intermediate_ssm, slots, last_step)
    for conv, windows in zip(caches.conv, caches.intermediate_conv_window):
        copy_accepted(conv, windows, slots, last_step)


def copy_accepted(pool: torch.Tensor, per_step: torch.Tensor, slots: torch.Tensor, last_step: torch.Tensor):
    """pool [L, slots, ...][:, slots[i]] = per_step [L, rows, steps, ...][:, i, last_step[i]]."""
    rows = torch.arange(slots.shape[0], device=slots.device)
    pool[:, slots] = per_step[:, rows, last_step].to(pool.dtype)
