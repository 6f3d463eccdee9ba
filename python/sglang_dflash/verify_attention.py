"""Attention for a verify block over paged KV, in plain torch (used by the CPU backend)."""

from __future__ import annotations

import torch


def verify_attention(q, k_cache, v_cache, token_rows, prefix_lens, width, *, scaling, sliding_window=None):
    """Causal attention of a `width`-token block on top of each request's prefix.

    Query i of request b sits at position prefix_b + i and sees keys 0..prefix_b + i
    (the block's own K/V are already in the cache). Batched over requests with
    the context padded to the longest: cost O(bs * width * L), not the
    O(bs * L^2) of treating the block as a full extend.

    Args:
        q: [bs * width, heads, d]; k_cache/v_cache: [slots, kv_heads, d];
        token_rows: [bs, max_context] slot ids; prefix_lens: [bs].
    Returns:
        [bs * width, heads, d_v].
    """
    bs = prefix_lens.shape[0]
    heads = q.shape[1]
    kv_len = int(prefix_lens.max()) + width
    slots = token_rows[:, :kv_len].long()
    keys = k_cache[slots].transpose(1, 2)  # [bs, kv_heads, L, d]
    values = v_cache[slots].transpose(1, 2)
    query = q.view(bs, width, heads, -1).transpose(1, 2)  # [bs, heads, width, d]
    qpos = prefix_lens.view(bs, 1, 1).long() + torch.arange(width, device=q.device).view(1, width, 1)
    kpos = torch.arange(kv_len, device=q.device).view(1, 1, kv_len)
    mask = kpos <= qpos
    if sliding_window is not None:
        mask &= kpos >= qpos - sliding_window
    out = torch.nn.functional.scaled_dot_product_attention(
        query, keys.to(query.dtype), values.to(query.dtype), attn_mask=mask.unsqueeze(1),
        scale=scaling, enable_gqa=keys.shape[1] != heads,
    )
    return out.transpose(1, 2).reshape(bs * width, heads, -1)
