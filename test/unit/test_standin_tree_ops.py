"""The CPU stand-in's tree-speculation ops (SGLang's NGRAM path) and tree-masked
verify attention, against plain Python references built from explicit trees."""

import math
import random
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.cpu_runtime.sgl_kernel import ops  # noqa: E402
from sglang_dflash.cpu_runtime.sgl_kernel import speculative  # noqa: E402
from sglang_dflash.verify_attention import verify_attention  # noqa: E402

torch.set_num_threads(1)


def random_tree(rng, n):
    """parents[i] < i (BFS order: depth never decreases with the index), parents[0] = -1."""
    parents, depth = [-1], [0]
    for i in range(1, n):
        cands = [j for j in range(i) if depth[j] >= depth[i - 1] - 1]
        p = rng.choice(cands)
        parents.append(p)
        depth.append(depth[p] + 1)
    order = sorted(range(n), key=lambda i: (depth[i], i))  # relabel into BFS order
    new = {old: k for k, old in enumerate(order)}
    return [-1 if parents[o] < 0 else new[parents[o]] for o in order]


def ancestors(parents, i):
    out = []
    while parents[i] >= 0:
        i = parents[i]
        out.append(i)
    return out


def tree_mask(parents):
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        m[i, i] = True
        for j in ancestors(parents, i):
            m[i, j] = True
    return m


def test_reconstruct_indices_matches_explicit_trees():
    rng = random.Random(0)
    bs, n = 5, 8
    trees = [random_tree(rng, n) for _ in range(bs)]
    mask = torch.stack([tree_mask(t) for t in trees]).reshape(-1)
    seq = torch.tensor([3, 10, 0, 7, 1])
    # Preallocated buffers larger than the batch (SGLang passes [:bs] slices).
    positions = torch.full((2 * bs * n,), -7, dtype=torch.int64)
    index, nxt, sib = (torch.full((2 * bs, n), -7, dtype=torch.int64) for _ in range(3))
    speculative.reconstruct_indices_from_tree_mask(
        mask, seq, positions[: bs * n], index[:bs], nxt[:bs], sib[:bs], bs, n)
    for b, parents in enumerate(trees):
        kids = {i: [k for k in range(n) if parents[k] == i] for i in range(n)}
        for i in range(n):
            assert positions[b * n + i] == seq[b] + len(ancestors(parents, i))
            assert index[b, i] == b * n + i
            assert nxt[b, i] == (kids[i][0] if kids[i] else -1)
            later = [k for k in kids.get(parents[i], []) if k > i] if parents[i] >= 0 else []
            assert sib[b, i] == (later[0] if later else -1)
    assert (positions[bs * n:] == -7).all() and (index[bs:] == -7).all()


def greedy_walk(parents, tokens, target, steps):
    """Reference: from the root, repeatedly take the first child (in index order)
    whose token is the target's choice at the current node."""
    path, cur = [0], 0
    for _ in range(steps - 1):
        match = [k for k in range(len(parents)) if parents[k] == cur and tokens[k] == target[cur]]
        if not match:
            break
        cur = match[0]
        path.append(cur)
    return path


@pytest.mark.parametrize("seed", range(4))
def test_verify_tree_greedy_matches_reference(seed):
    rng = random.Random(seed)
    bs, n, vocab = 6, 7, 3  # tiny vocabulary: many matches, sibling collisions too
    trees = [random_tree(rng, n) for _ in range(bs)]
    mask = torch.stack([tree_mask(t) for t in trees]).reshape(-1)
    index, nxt, sib = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.int64),
                                           torch.empty(bs * n, dtype=torch.int64), index, nxt, sib, bs, n)
    cand = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    target = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    for steps in (n, 3):
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
        accept_num = torch.empty(bs, dtype=torch.int32)
        ops.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                                   candidates=cand, retrive_index=index, retrive_next_token=nxt,
                                   retrive_next_sibling=sib, target_predict=target)
        want_predicts = torch.zeros(bs * n, dtype=torch.int32)
        for b, parents in enumerate(trees):
            path = greedy_walk(parents, cand[b].tolist(), target[b].tolist(), steps)
            assert accept_num[b] == len(path) - 1
            assert accept_index[b].tolist() == [b * n + i for i in path] + [-1] * (steps - len(path))
            for i in path:
                want_predicts[b * n + i] = target[b, i]
        assert torch.equal(predicts, want_predicts)


def test_assign_extend_cache_locs_int32_offsets():
    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10) + 100
    rpi = torch.tensor([2, 0, 3])
    start, end = torch.tensor([1, 4, 0], dtype=torch.int32), torch.tensor([3, 4, 5], dtype=torch.int32)
    out = torch.full((10,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, out, 10)
    want = [req_to_token[r, k].item() for r, s, e in zip(rpi, start, end) for k in range(int(s), int(e))]
    assert out.tolist() == want + [-1] * (10 - len(want))


def test_fill_accept_out_cache_loc_compacts_in_order():
    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.arange(9) * 10
    out = torch.zeros(9, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    assert out.tolist() == [0, 20, 30, 60, 70, 80, 0, 0, 0]


def test_fill_bonus_tokens():
    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 0]])
    bonus = torch.empty(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([3, 1]), bonus, 3)
    assert bonus.tolist() == [7, 8]


def test_missing_speculative_op_raises_by_name():
    with pytest.raises(NotImplementedError, match="build_tree_kernel_efficient"):
        speculative.build_tree_kernel_efficient()


def naive_tree_attention(q, k_cache, v_cache, rows, prefix, trees, scale, window=None):
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    width = len(trees[0])
    out = []
    for b, parents in enumerate(trees):
        p = int(prefix[b])
        for i in range(width):
            anc = ancestors(parents, i)
            pos = p + len(anc)
            cols = [j for j in range(p) if window is None or j >= pos - window]
            cols += [p + j for j in sorted(anc + [i])]
            keys = k_cache[rows[b, cols]].repeat_interleave(heads // kv_heads, dim=1)
            vals = v_cache[rows[b, cols]].repeat_interleave(heads // kv_heads, dim=1)
            s = torch.einsum("hd,jhd->hj", q[b * width + i], keys) * scale
            out.append(torch.einsum("hj,jhd->hd", s.softmax(-1), vals))
    return torch.stack(out)


@pytest.mark.parametrize("group_size", [2, 64])
def test_tree_attention_matches_naive(group_size):
    rng = random.Random(3)
    torch.manual_seed(3)
    slots, kv_heads, heads, d, width, bs = 256, 2, 4, 8, 6, 5
    k_cache, v_cache = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    prefix = torch.tensor([9, 0, 30, 4, 17])
    rows = torch.stack([torch.randperm(slots)[:40] for _ in range(bs)])
    trees = [random_tree(rng, width) for _ in range(bs)]
    mask = torch.stack([tree_mask(t) for t in trees])
    q = torch.randn(bs * width, heads, d)
    scale = 1 / math.sqrt(d)
    for window in (None, 8):
        got = verify_attention(q, k_cache, v_cache, rows, prefix, width, scaling=scale,
                               sliding_window=window, group_size=group_size, tree_mask=mask)
        want = naive_tree_attention(q, k_cache, v_cache, rows, prefix, trees, scale, window)
        assert torch.allclose(got, want, atol=1e-5), window


def test_chain_tree_equals_causal_block():
    torch.manual_seed(4)
    slots, width, bs = 128, 5, 3
    k_cache, v_cache = torch.randn(slots, 2, 8), torch.randn(slots, 2, 8)
    prefix = torch.tensor([3, 12, 0])
    rows = torch.stack([torch.randperm(slots)[:20] for _ in range(bs)])
    q = torch.randn(bs * width, 4, 8)
    chain = torch.tril(torch.ones(width, width, dtype=torch.bool)).expand(bs, width, width)
    for window in (None, 6):
        a = verify_attention(q, k_cache, v_cache, rows, prefix, width, scaling=0.4, sliding_window=window)
        b = verify_attention(q, k_cache, v_cache, rows, prefix, width, scaling=0.4, sliding_window=window,
                             tree_mask=chain)
        assert torch.allclose(a, b, atol=1e-6)
