"""Block attention over the drafter's paged context: the torch twin.

The drafter's B block queries of request b attend to (1) its committed
context, whose K/V rows sit in the drafter's cache at the target's slot ids
(`req_to_token[req_pool_indices[b], j]` for positions j < prefix_lens[b]), and
(2) the block's own B keys at the query positions. Visibility per layer:
causal keeps keys at k_pos <= q_pos; a window w keeps k_pos >= q_pos - w, and
k_pos <= q_pos + w too when not causal.

This twin gathers the context into a [bs, L] table (L = the longest prefix, a
host read of the lengths) and runs one masked SDPA; the Triton kernel
(`context_attention_triton.py`) reads each request's rows in place, up to its
own length, with no gather, no padding and no host read. Imports torch and
the package's torch-only bookkeeping (`draft`, `ragged`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from sglang_dflash.draft import context_slots
from sglang_dflash.ragged import gather_rows


@dataclass
class PagedLayer:
    """One layer's context K/V, read in place."""

    k_cache: torch.Tensor  # [slots, kv_heads, d] this layer's context keys
    v_cache: torch.Tensor  # [slots, kv_heads, d]
    req_to_token: torch.Tensor  # [R, T] slot id of each request row's position
    req_pool_indices: torch.Tensor  # [bs] each request's row of req_to_token
    prefix_lens: torch.Tensor  # [bs] committed context length (positions 0..len-1)


def block_context_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    ctx: PagedLayer,
    positions: torch.Tensor,
    *,
    causal: bool = False,
    window: Optional[int] = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over each request's visible context and block keys.

    Args:
        q: [bs, B, nh, d] block queries (RoPE applied); k_block, v_block:
            [bs, B, kvh, d] the block's own keys and values; positions: [bs, B]
            int64 absolute positions of the block rows. nh is a multiple of kvh
            (query head h reads kv head h // (nh / kvh)).
    Returns:
        [bs, B, nh, d] in q's dtype.
    """
    bs, block, heads, dim = q.shape
    prefix = ctx.prefix_lens.to(torch.int64)
    length = int(prefix.max()) if bs else 0
    # Only the first `length` columns of each request's row: the table is as wide as the model's context.
    rows = ctx.req_to_token[ctx.req_pool_indices.to(torch.int64), :length]
    slots, valid = context_slots(rows, prefix, length)  # [bs, L]
    k = torch.cat((gather_rows(ctx.k_cache, slots).to(k_block.dtype), k_block), dim=1)  # [bs, L + B, kvh, d]
    v = torch.cat((gather_rows(ctx.v_cache, slots).to(v_block.dtype), v_block), dim=1)
    cols = torch.arange(slots.shape[1], device=q.device)
    key_pos = torch.cat((cols.expand(bs, -1), positions.to(torch.int64)), dim=1)  # [bs, L + B]
    seen = torch.cat((valid, valid.new_ones(bs, block)), dim=1)  # [bs, L + B]
    mask = visibility(seen, positions.to(torch.int64), key_pos, causal=causal,
                      window=window)[:, None]  # [bs, 1, B, L + B]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        scale=1.0 / math.sqrt(dim), enable_gqa=True)
    return out.transpose(1, 2)


def visibility(valid, query_positions, key_positions, *, causal: bool,
               window: Optional[int]) -> torch.Tensor:
    """Per-query visibility [bs, B, S]: key j is seen by query i iff valid[j] and,
    when causal, k_pos <= q_pos and, when windowed, k_pos >= q_pos - window
    (and k_pos <= q_pos + window if not causal: a two-sided window).

    Args:
        valid: [bs, S] bool; query_positions: [bs, B]; key_positions: [bs, S] int64.
    """
    mask = valid[:, None, :]
    q_pos, k_pos = query_positions[:, :, None], key_positions[:, None, :]
    if causal:
        mask = mask & (k_pos <= q_pos)
    if window is not None:
        mask = mask & (k_pos >= q_pos - window)
        if not causal:
            mask = mask & (k_pos <= q_pos + window)
    return mask.expand(-1, query_positions.shape[1], -1)
