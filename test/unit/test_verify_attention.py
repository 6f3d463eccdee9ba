"""verify_attention against a per-request loop with explicit positions."""

import math

import torch

from sglang_dflash.verify_attention import verify_attention

torch.set_num_threads(1)


def _naive(q, k_cache, v_cache, rows, prefix, width, scale, window=None):
    out = []
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    for b in range(len(prefix)):
        p = int(prefix[b])
        keys = k_cache[rows[b, : p + width]].repeat_interleave(heads // kv_heads, dim=1)
        vals = v_cache[rows[b, : p + width]].repeat_interleave(heads // kv_heads, dim=1)
        for i in range(width):
            qi = q[b * width + i]  # [heads, d]
            pos = p + i
            allowed = [j for j in range(p + width) if j <= pos and (window is None or j >= pos - window)]
            s = torch.einsum("hd,jhd->hj", qi, keys[allowed]) * scale
            out.append(torch.einsum("hj,jhd->hd", s.softmax(-1), vals[allowed]))
    return torch.stack(out)


def test_matches_naive_gqa_and_window():
    torch.manual_seed(0)
    slots, kv_heads, heads, d, width = 64, 2, 4, 8, 3
    k_cache, v_cache = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    prefix = torch.tensor([5, 0, 11])
    rows = torch.stack([torch.randperm(slots)[:20] for _ in range(3)])
    q = torch.randn(3 * width, heads, d)
    scale = 1 / math.sqrt(d)
    for window in (None, 4):
        got = verify_attention(q, k_cache, v_cache, rows, prefix, width, scaling=scale, sliding_window=window)
        want = _naive(q, k_cache, v_cache, rows, prefix, width, scale, window)
        assert torch.allclose(got, want, atol=1e-5), window


def test_length_groups_match_naive():
    """More requests than one group, with very different lengths: grouping by
    length (each group padded to its own longest) changes nothing."""
    torch.manual_seed(1)
    slots, kv_heads, heads, d, width, bs = 512, 2, 4, 8, 2, 11
    k_cache, v_cache = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    prefix = torch.tensor([40, 0, 3, 90, 17, 17, 64, 1, 120, 5, 33])
    rows = torch.stack([torch.randperm(slots)[:130] for _ in range(bs)])
    q = torch.randn(bs * width, heads, d)
    want = _naive(q, k_cache, v_cache, rows, prefix, width, 0.3)
    for group in (1, 3, 4, bs, 64):
        got = verify_attention(q, k_cache, v_cache, rows, prefix, width, scaling=0.3, group_size=group)
        assert torch.allclose(got, want, atol=1e-5), group
