"""Hybrid targets (Gated DeltaNet layers): commit the accepted position's
linear-attention state after a verify.

A full-attention layer keeps every verified row's K/V in the pool; a rejected
row's slot is simply overwritten later. A linear-attention layer instead keeps
one recurrent state and one conv window per request. SGLang's GDN verify runs
the block without updating them and keeps the state after each position in the
pool's speculative buffers (row = the request's batch position, step = the
verify position); after acceptance the state after the last committed position
(commit_len - 1: the anchor is always committed) becomes the request's state.
A W = 0 step is a plain DECODE forward, which updates the state itself.
"""

from __future__ import annotations

import torch


def has_linear_state(model_runner) -> bool:
    """Whether the target keeps per-request linear-attention state (a GDN hybrid)."""
    pool = getattr(model_runner, "req_to_token_pool", None)
    return callable(getattr(pool, "get_speculative_mamba2_params_all_layers", None))


def commit_accepted_state(model_runner, commit_lens: torch.Tensor) -> None:
    """After a verify of bs requests (before any other target forward): each
    request's linear-attention state := the state after its last committed
    position. commit_lens [bs] int, >= 1."""
    last_step = commit_lens.to(torch.int64) - 1
    backend = model_runner.attn_backend
    if last_step.device.type != "cpu":
        # SGLang's own commit (Triton scatter on CUDA / XPU, its slot layouts).
        backend.update_mamba_state_after_mtp_verify(last_step, None, None, model_runner.model)
        return
    bs = last_step.shape[0]
    slots = backend.linear_attn_backend.forward_metadata.mamba_cache_indices[:bs].to(torch.int64)
    caches = model_runner.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    copy_accepted(caches.temporal, caches.intermediate_ssm, slots, last_step)
    for conv, windows in zip(caches.conv, caches.intermediate_conv_window):
        copy_accepted(conv, windows, slots, last_step)


def copy_accepted(pool: torch.Tensor, per_step: torch.Tensor, slots: torch.Tensor, last_step: torch.Tensor):
    """pool [L, slots, ...][:, slots[i]] = per_step [L, rows, steps, ...][:, i, last_step[i]]."""
    rows = torch.arange(slots.shape[0], device=slots.device)
    pool[:, slots] = per_step[:, rows, last_step].to(pool.dtype)
