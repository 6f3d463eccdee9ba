"""Attention for a verify block over paged KV, in plain torch (used by the CPU backend)."""

from __future__ import annotations

import torch

from sglang_dflash.ragged import gather_rows

# Requests per attention call. Requests are sorted by length and attended in
# groups, each padded only to its own longest context: with chat-like length
# spreads this gathers far fewer padded K/V rows than one batch padded to the
# global maximum, and a group's gathered K/V stays small enough to remain in
# cache instead of evicting the weights the next matmuls read.
GROUP_SIZE = 8


def verify_attention(q, k_cache, v_cache, token_rows, prefix_lens, width, *, scaling,
                     sliding_window=None, group_size=GROUP_SIZE, tree_mask=None):
    """Attention of a `width`-token block on top of each request's prefix.

    Chain (tree_mask None, DFLASH): query i of request b sits at position
    prefix_b + i and sees keys 0..prefix_b + i. Tree (NGRAM): block token j
    sits in slot column prefix_b + j; query i sees the whole prefix and the
    block tokens j with tree_mask[b, i, j] (its ancestors) and itself; its
    position is prefix_b + its depth (a sliding window must be >= width).
    The block's own K/V are already in the cache. Cost O(bs * width * L), not
    the O(bs * L^2) of treating the block as a full extend.

    Args:
        q: [bs * width, heads, d]; k_cache/v_cache: [slots, kv_heads, d];
        token_rows: [bs, max_context] slot ids; prefix_lens: [bs];
        tree_mask: None or [bs, width, width] bool (j ancestor of i).
    Returns:
        [bs * width, heads, d_v].
    """
    bs = prefix_lens.shape[0]
    heads = q.shape[1]
    query = q.view(bs, width, heads, -1)
    if bs <= group_size:
        out = _attend(query, k_cache, v_cache, token_rows, prefix_lens, width, scaling, sliding_window,
                      tree_mask)
        return out.reshape(bs * width, heads, -1)
    # Host-side grouping: one sync for the lengths (CPU backend: free).
    order = torch.argsort(prefix_lens)
    out = query.new_empty(bs, width, heads, v_cache.shape[-1])
    for start in range(0, bs, group_size):
        idx = order[start:start + group_size]
        out[idx] = _attend(query[idx], k_cache, v_cache, token_rows[idx], prefix_lens[idx], width,
                           scaling, sliding_window, None if tree_mask is None else tree_mask[idx])
    return out.reshape(bs * width, heads, -1)


def _attend(query, k_cache, v_cache, token_rows, prefix_lens, width, scaling, sliding_window, tree_mask):
    """query: [n, width, heads, d] -> [n, width, heads, d_v], padded to this group's longest context."""
    n, _, heads, _ = query.shape
    kv_len = int(prefix_lens.max()) + width
    # One request's one query (a decode row) sees a contiguous run of columns
    # (the window's, or all): gathered alone, it needs no mask, SDPA's cheapest call.
    single = n == 1 and width == 1 and tree_mask is None
    first = max(0, kv_len - 1 - sliding_window) if single and sliding_window is not None else 0
    slots = token_rows[:, first:kv_len].contiguous()  # one copy of the strided slice for K and V
    keys = gather_rows(k_cache, slots).transpose(1, 2)  # [n, kv_heads, L, d]
    values = gather_rows(v_cache, slots).transpose(1, 2)
    mask = None if single else _block_mask(prefix_lens, width, kv_len, sliding_window, tree_mask)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(1, 2), keys.to(query.dtype), values.to(query.dtype), attn_mask=mask,
        scale=scaling, enable_gqa=keys.shape[1] != heads,
    )
    return out.transpose(1, 2)


def _block_mask(prefix_lens, width, kv_len, sliding_window, tree_mask):
    """[n, 1, width, kv_len] bool: the keys each block query may see."""
    n = prefix_lens.shape[0]
    device = prefix_lens.device
    prefix = prefix_lens.view(n, 1, 1).long()
    kpos = torch.arange(kv_len, device=device).view(1, 1, kv_len)
    if tree_mask is None:
        qpos = prefix + torch.arange(width, device=device).view(1, width, 1)
        mask = kpos <= qpos
    else:
        tree = tree_mask.bool() | torch.eye(width, dtype=torch.bool, device=device)
        qpos = prefix + (tree.sum(-1, keepdim=True) - 1)  # depth in the tree
        rel = (kpos - prefix).expand(n, width, kv_len)  # block column of each key
        in_block = (rel >= 0) & (rel < width)
        mask = (rel < 0) | (in_block & tree.gather(2, rel.clamp(0, width - 1)))
    if sliding_window is not None:
        mask &= kpos >= qpos - sliding_window
    return mask.unsqueeze(1)
