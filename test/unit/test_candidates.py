"""Unit tests for the top-K candidates (candidates.py's pieces through
VocabHead.whole's top-K on one rank), the unary transform and the TP merge."""

import math

import pytest
import torch
from sglang_dflash.candidates import Candidates, merge_shard_topk, transform_unary
from sglang_dflash.vocab_head import VocabHead

torch.set_num_threads(1)


def topk_candidates(h, w, k, *, vocab_size=None, **kw):
    """One rank's candidates: the first `vocab_size` head rows are the vocabulary."""
    return VocabHead.whole(w, w.shape[0] if vocab_size is None else vocab_size).topk(h, k, **kw)


def _random_inputs(seed, bs=3, slots=5, hidden=16, vocab=40):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(bs, slots, hidden, generator=gen)
    w = torch.randn(vocab, hidden, generator=gen)
    return h, w


def _brute_force_topk(h, w, k, vocab):
    """Full descending sort of every position's logits, in plain Python order."""
    bs, slots, _ = h.shape
    ids = torch.empty(bs, slots, k, dtype=torch.int64)
    values = torch.empty(bs, slots, k)
    for b in range(bs):
        for e in range(slots):
            logits = [(float(h[b, e] @ w[v]), v) for v in range(vocab)]
            logits.sort(key=lambda pair: -pair[0])
            ids[b, e] = torch.tensor([v for _, v in logits[:k]])
            values[b, e] = torch.tensor([x for x, _ in logits[:k]])
    return ids, values


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_matches_full_sort(seed):
    h, w = _random_inputs(seed)
    cands = topk_candidates(h, w, 7)
    ids, values = _brute_force_topk(h, w, 7, w.shape[0])
    assert isinstance(cands, Candidates)
    assert cands.ids.dtype == torch.int64 and cands.unary.dtype == torch.float32
    assert torch.equal(cands.ids, ids)
    torch.testing.assert_close(cands.unary, values, rtol=1e-5, atol=1e-5)
    assert bool((cands.unary[..., :-1] >= cands.unary[..., 1:]).all())


def test_vocab_size_excludes_padded_rows():
    h, w = _random_inputs(3, vocab=40)
    # Make a padded row the best token everywhere: it must still never appear.
    w[38] = h.mean(dim=(0, 1)) * 100.0
    cands = topk_candidates(h, w, 5, vocab_size=36)
    ids, _ = _brute_force_topk(h, w, 5, 36)
    assert torch.equal(cands.ids, ids)
    assert int(cands.ids.max()) < 36


def test_multiplier_and_softcap_applied():
    h, w = _random_inputs(4)
    raw = topk_candidates(h, w, 6).unary
    scaled = topk_candidates(h, w, 6, output_multiplier=0.25).unary
    capped = topk_candidates(h, w, 6, output_multiplier=0.25, softcap=1.5)
    torch.testing.assert_close(scaled, raw * 0.25)
    expected = [1.5 * math.tanh(x * 0.25 / 1.5) for x in raw.flatten().tolist()]
    torch.testing.assert_close(capped.unary.flatten(), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    # The transform is increasing, so the candidate ids do not change.
    assert torch.equal(capped.ids, topk_candidates(h, w, 6).ids)


@pytest.mark.parametrize("softcap", [None, 0.0, -1.0])
def test_softcap_disabled_when_not_positive(softcap):
    x = torch.tensor([-3.0, 0.5, 40.0])
    torch.testing.assert_close(transform_unary(x, 2.0, softcap), x * 2.0)


def test_low_precision_inputs_scored_in_float32():
    """A bf16 head gives float32 scores equal to the exact product up to one bf16
    rounding of the output (the kernel accumulates in float32)."""
    h, w = _random_inputs(5)
    cands = topk_candidates(h.bfloat16(), w.bfloat16(), 4)
    assert cands.unary.dtype == torch.float32
    exact = h.bfloat16().double() @ w.bfloat16().double().t()  # [bs, S, V]
    chosen = torch.gather(exact, -1, cands.ids).float()
    torch.testing.assert_close(cands.unary, chosen, rtol=2 ** -8, atol=1e-6)
    # Ranked right up to that rounding: nothing left out beats the K-th kept score.
    kth = cands.unary[..., -1:].double()
    left_out = exact.scatter(-1, cands.ids, float("-inf"))
    assert (left_out <= kth * (1 + 2 ** -7) + 1e-6).all()


def test_low_precision_head_is_not_copied_to_float32():
    """No op of the candidate step materialises a [V, H] float32 tensor: for an
    8B target that copy would be ~2.5 GB per step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    h, w = _random_inputs(6, vocab=64)
    w = w.bfloat16()

    class Outputs(TorchDispatchMode):
        shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.shapes.append((tuple(t.shape), t.dtype))
            return out

    with Outputs() as seen:
        topk_candidates(h.bfloat16(), w, 4)
    assert seen.shapes, "the dispatch mode saw no ops"
    big = [s for s in seen.shapes if s[0] in {tuple(w.shape), tuple(w.t().shape)}]
    assert all(dtype == torch.bfloat16 for _, dtype in big), big


@pytest.mark.parametrize("seed,tp", [(0, 2), (1, 4), (2, 8)])
def test_merge_shard_topk_equals_full_topk(seed, tp):
    gen = torch.Generator().manual_seed(seed)
    bs, slots, shard_vocab, k = 3, 4, 24, 6
    logits = torch.randn(bs, slots, tp * shard_vocab, generator=gen)
    shards = logits.view(bs, slots, tp, shard_vocab).permute(2, 0, 1, 3)  # [tp, bs, S, V/tp]
    shard_values, local_ids = torch.topk(shards, k, dim=-1)
    offsets = (torch.arange(tp) * shard_vocab).view(tp, 1, 1, 1)
    values, ids = merge_shard_topk(shard_values, local_ids + offsets, k)
    full = torch.topk(logits, k, dim=-1)
    assert torch.equal(ids, full.indices)
    assert torch.equal(values, full.values)
    assert ids.dtype == torch.int64


@pytest.mark.parametrize(
    "make_args,match",
    [
        (lambda h, w: (h[0], w, 4), "hidden"),
        (lambda h, w: (h, w[0], 4), "LM head weight"),
        (lambda h, w: (h, w[:, :-1], 4), "hidden must be"),
        (lambda h, w: (h, w, 41), "k=41"),
        (lambda h, w: (h, w, 0), "k=0"),
    ],
)
def test_topk_bad_inputs_raise(make_args, match):
    h, w = _random_inputs(6)
    with pytest.raises(ValueError, match=match):
        topk_candidates(*make_args(h, w))


def test_topk_bad_options_raise():
    h, w = _random_inputs(7)
    with pytest.raises(ValueError, match="k=10"):
        topk_candidates(h, w, 10, vocab_size=8)
    with pytest.raises(ValueError, match="shard size 41"):
        topk_candidates(h, w, 4, vocab_size=41)
    with pytest.raises(ValueError, match="output_multiplier"):
        topk_candidates(h, w, 4, output_multiplier=0.0)


def test_merge_bad_inputs_raise():
    values = torch.randn(2, 1, 3, 4)
    ids = torch.zeros(2, 1, 3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="values"):
        merge_shard_topk(values[0], ids[0], 2)
    with pytest.raises(ValueError, match="ids shape"):
        merge_shard_topk(values, ids[:, :, :2], 2)
    with pytest.raises(ValueError, match="k=9"):
        merge_shard_topk(values, ids, 9)
