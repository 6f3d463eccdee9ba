"""Torch implementations of the sgl_kernel CPU ops that SGLang's CPU path reaches
while serving DFLASH, and SGLang's own NGRAM speculation (tree verify). Each
mirrors the op's contract as SGLang calls it (argument order, dtypes and
in-place semantics, read off the callers and the CUDA/Triton versions), not its
implementation."""

from __future__ import annotations

import ctypes

import torch

from sglang_dflash.ragged import ragged_runs

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
    rows, cols = _run_cells(req_pool_indices, start_offset, end_offset)
    if rows.numel():
        req_to_token[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def _run_cells(req_pool_indices, start_offset, end_offset):
    """(rows, cols) [total] of the cells req_to_token[req_pool_indices[i],
    start[i]:end[i]], runs back to back in batch order. Any integer dtypes.
    Called once per decode step under spec-v2 scheduling (KV slot
    reservation), so it avoids `repeat_interleave` (see `ragged_runs`)."""
    run, cols = ragged_runs(start_offset, end_offset.long() - start_offset.long())
    return req_pool_indices.long()[run], cols


# ---- NGRAM / tree speculation -------------------------------------------------------


@_op
def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse of `assign_req_to_token_pool_cpu`: the i-th run of
    out_cache_loc (runs back to back) = req_to_token[req_pool_indices[i],
    start[i]:end[i]]. Any integer dtypes (SGLang passes int32 offsets in one
    call); entries past the runs are left as they are."""
    rows, cols = _run_cells(req_pool_indices, start_offset, end_offset)
    if rows.numel():
        out_cache_loc[: rows.numel()] = req_to_token[rows, cols].to(out_cache_loc.dtype)


@_op
def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Stable compaction: the c-th entry of accept_index (flattened) that is
    not -1 writes accept_out_cache_loc[c] = out_cache_loc[that entry]."""
    flat = accept_index.reshape(-1)
    picked = flat[flat >= 0].long()
    accept_out_cache_loc[: picked.numel()] = out_cache_loc[picked].to(accept_out_cache_loc.dtype)


@_op
def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]
    (accept_lens include the bonus)."""
    n = bonus_tokens.numel()
    idx = accept_stride * torch.arange(n, device=accept_lens.device) + accept_lens[:n].long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def tree_links(mask: torch.Tensor):
    """mask [bs, n, n] bool, mask[b, i, j] = j is i itself or an ancestor of i
    (ancestors have smaller indices, BFS order). Returns depth, parent,
    first child, next sibling, each [bs, n] int64 (-1 = none)."""
    bs, n, _ = mask.shape
    idx = torch.arange(n, device=mask.device)
    anc = mask & (idx[None, :] < idx[:, None])  # strict ancestors, j < i
    depth = anc.sum(-1)
    has_parent = anc.any(-1)
    parent = torch.where(has_parent, torch.where(anc, idx, -1).amax(-1), -1)
    # The first later node that has i as an ancestor is its first child (BFS order).
    child_of = anc.transpose(1, 2)  # [b, i, k]: i is an ancestor of k
    first_child = torch.where(child_of.any(-1), torch.where(child_of, idx, n).amin(-1), -1)
    same_parent = (parent[:, :, None] == parent[:, None, :]) & has_parent[:, :, None]
    later = same_parent & (idx[None, :] > idx[:, None])  # [b, i, k]: k a later sibling of i
    sibling = torch.where(later.any(-1), torch.where(later, idx, n).amin(-1), -1)
    return depth, parent, first_child, sibling


@_op
def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Tree layout of a batch of draft trees, written in place: positions
    [bs*n] = verified_seq_len + depth; retrive_index [bs, n] = b*n + i;
    retrive_next_token / retrive_next_sibling [bs, n] = first child / next
    sibling under the same parent (-1 = none)."""
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).bool()
    depth, _, first_child, sibling = tree_links(mask)
    pos = depth + verified_seq_len[:bs].long()[:, None]
    positions.view(-1)[: bs * n].copy_(pos.reshape(-1).to(positions.dtype))
    index = torch.arange(bs * n, device=mask.device).view(bs, n)
    retrive_index.view(-1)[: bs * n].view(bs, n).copy_(index.to(retrive_index.dtype))
    retrive_next_token.view(-1)[: bs * n].view(bs, n).copy_(first_child.to(retrive_next_token.dtype))
    retrive_next_sibling.view(-1)[: bs * n].view(bs, n).copy_(sibling.to(retrive_next_sibling.dtype))


IMPLEMENTED_OPS.add("reconstruct_indices_from_tree_mask_cpu")
reconstruct_indices_from_tree_mask_cpu = reconstruct_indices_from_tree_mask


@_op
def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree acceptance, written in place. Per request b, from the root:
    descend to the first child whose candidate equals the target's argmax at
    the last accepted node (trying siblings in order), at most
    accept_index.shape[1] - 1 times. accept_index[b, 0..m] = accepted global
    node indices (root first), accept_token_num[b] = m (drafts only),
    predicts[node] = target token for every accepted node and the last (bonus)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, index = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    accept_rows, counts, writes = accept_index.tolist(), [], {}
    for b in range(bs):
        last = index[b][0]
        accept_rows[b][0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1 and cand[b][cur] != target[last]:
                cur = sib[b][cur]
            if cur == -1:
                break
            writes[last] = target[last]
            num += 1
            accept_rows[b][num] = last = index[b][cur]
        counts.append(num)
        writes[last] = target[last]
    accept_index.copy_(torch.tensor(accept_rows, dtype=accept_index.dtype))
    accept_token_num[:bs].copy_(torch.tensor(counts, dtype=accept_token_num.dtype))
    if writes:
        keys = torch.tensor(list(writes), dtype=torch.int64)
        predicts.view(-1)[keys] = torch.tensor(list(writes.values()), dtype=predicts.dtype)


__all__ = sorted(IMPLEMENTED_OPS)
