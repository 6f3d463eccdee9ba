"""Torch implementations of the sgl_kernel CPU ops that SGLang's CPU path reaches
while serving DFLASH. Each mirrors the op's contract as SGLang calls it
(argument order and in-place semantics), not its implementation."""

from __future__ import annotations

import ctypes

import torch

IMPLEMENTED_OPS: set[str] = set()


def _op(fn):
    IMPLEMENTED_OPS.add(fn.__name__)
    return fn


def _byte_rows(address: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    """A [num_rows, row_bytes] uint8 view of memory SGLang passes by address."""
    buf = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8).view(num_rows, row_bytes)


@_op
def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer b (base address data_ptrs[b], row size strides[b]
    bytes), copy row src_loc[i] to row tgt_loc[i]. Safe when ranges overlap."""
    if tgt_loc.numel() == 0:
        return
    num_rows = int(torch.maximum(tgt_loc.max(), src_loc.max())) + 1
    tgt, src = tgt_loc.long(), src_loc.long()
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _byte_rows(int(address), int(row_bytes), num_rows)
        rows[tgt] = rows[src].clone()


@_op
def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th run of
    out_cache_loc (runs laid out back to back in batch order)."""
    lens = (end_offset - start_offset).long()
    total = int(lens.sum())
    if total == 0:
        return
    rows = torch.repeat_interleave(req_pool_indices.long(), lens)
    run_start = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    cols = torch.repeat_interleave(start_offset.long(), lens) + (
        torch.arange(total, device=lens.device) - run_start
    )
    req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


__all__ = sorted(IMPLEMENTED_OPS)
