"""verify_block: greedy rows on hand-made cases, mixed batches, and losslessness
of the one-hot (DFlash v1) sampled path by a statistical test."""

import pytest
import torch

from sglang_dflash.rejection import target_probs
from sglang_dflash.verify import SamplingRows, VerifyUniforms, verify_block

torch.set_num_threads(1)
V = 16


def _logits_for(argmax_rows):
    """[bs, S+1, V] logits whose argmax at each position is the given token."""
    t = torch.tensor(argmax_rows)
    logits = torch.zeros(*t.shape, V)
    logits.scatter_(-1, t.unsqueeze(-1), 5.0)
    return logits


@pytest.mark.parametrize(
    "drafts, target, accept, bonus",
    [
        ([[4, 5, 6]], [[9, 5, 6, 7]], 0, 9),  # early mismatch
        ([[4, 5, 6]], [[4, 5, 8, 7]], 2, 8),  # mismatch in the middle
        ([[4, 5, 6]], [[4, 5, 6, 7]], 3, 7),  # full accept, bonus after the last draft
        ([[4, 5, 6]], [[4, 0, 6, 7]], 1, 0),  # a later match after a mismatch does not count
    ],
)
def test_greedy_hand_made(drafts, target, accept, bonus):
    res = verify_block(torch.tensor(drafts), _logits_for(target), rows=None)
    assert res.accept_len.tolist() == [accept]
    assert res.bonus.tolist() == [bonus]
    assert res.tokens[0, :accept].tolist() == drafts[0][:accept]


def _uniforms(bs, num_drafts, seed):
    g = torch.Generator().manual_seed(seed)
    return VerifyUniforms(torch.rand(bs, num_drafts, generator=g), torch.rand(bs, num_drafts + 1, generator=g))


def _rows(bs, greedy_mask, temperature=1.0):
    greedy = torch.tensor(greedy_mask)
    return SamplingRows(
        temperature=torch.full((bs,), temperature),
        top_p=torch.ones(bs),
        top_k=torch.where(greedy, 1, V).long(),
        min_p=torch.zeros(bs),
    )


def test_mixed_batch_greedy_rows_match_argmax():
    torch.manual_seed(0)
    bs, S = 64, 3
    logits = torch.randn(bs, S + 1, V)
    drafts = logits[:, :-1].argmax(-1)  # greedy rows will accept everything
    mask = [i % 2 == 0 for i in range(bs)]
    res = verify_block(drafts, logits, _rows(bs, mask), uniforms=_uniforms(bs, S, 1))
    greedy = torch.tensor(mask)
    assert (res.accept_len[greedy] == S).all()
    assert (res.bonus[greedy] == logits[greedy, -1].argmax(-1)).all()


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_one_hot_draft_is_lossless(temperature):
    """First emitted token of a sampled row ~ p_0 whatever the (deterministic) draft.

    200k rows; V = 16; the TV bound 0.01 is > 4 standard deviations of the
    empirical TV at this count (expected TV ~ sqrt(V / (2 pi N)) ~ 0.004)."""
    torch.manual_seed(2)
    n, S = 200_000, 2
    row_logits = torch.randn(S + 1, V) * 2
    logits = row_logits.expand(n, S + 1, V)
    drafts = torch.full((n, S), int(row_logits[0].argmax()))  # a likely but not certain draft
    rows = _rows(n, [False] * n, temperature)
    res = verify_block(drafts, logits, rows, uniforms=_uniforms(n, S, 3))
    first = res.tokens[:, 0]
    empirical = torch.bincount(first, minlength=V).float() / n
    p0 = target_probs(row_logits[:1], torch.tensor([temperature]), torch.ones(1), torch.tensor([V]), torch.zeros(1))[0]
    assert 0.5 * (empirical - p0).abs().sum() < 0.01


def test_width_one_is_plain_decoding():
    """No drafts: greedy rows take the argmax, sampled rows draw from p."""
    torch.manual_seed(4)
    n = 100_000
    row_logits = torch.randn(1, V)
    logits = row_logits.expand(n, 1, V)
    mask = [i < 10 for i in range(n)]
    res = verify_block(torch.zeros(n, 0, dtype=torch.long), logits, _rows(n, mask), uniforms=_uniforms(n, 0, 5))
    assert res.accept_len.eq(0).all()
    assert (res.tokens[:10, 0] == row_logits.argmax()).all()
    empirical = torch.bincount(res.tokens[10:, 0], minlength=V).float() / (n - 10)
    assert 0.5 * (empirical - row_logits[0].softmax(-1)).abs().sum() < 0.01


TOP_K_ALL = 1 << 30


@pytest.mark.parametrize("filters, bound", [
    ([(TOP_K_ALL, 1.0, 0.0), (TOP_K_ALL, 1.0, 0.0)], 0),  # temperature only: no ranking
    ([(1, 1.0, 0.0), (TOP_K_ALL, 1.0, 0.0)], 1),  # a greedy row among unfiltered ones
    ([(12, 0.9, 0.0), (5, 1.0, 0.1), (1, 1.0, 0.0)], 12),  # every filtering row has a top-k
    ([(12, 1.0, 0.0), (TOP_K_ALL, 0.9, 0.0)], None),  # top-p alone: no host bound
    ([(TOP_K_ALL, 1.0, 0.05)], None),  # min-p alone
    ([(V, 0.95, 0.0)], None),  # a top-k of the whole vocabulary does not bound
])
def test_rank_bound(filters, bound):
    rows = _rows(len(filters), [False] * len(filters))
    rows.host_filters = tuple(filters)
    assert rows.rank_bound(V) == bound
    rows.host_filters = None
    assert rows.rank_bound(V) is None


def test_host_bound_and_probe_give_the_same_tokens():
    """verify_block with the host's filters (ranked top-k / softmax only) and
    with the probe emits what the full sort does, same uniforms, mixed rows."""
    torch.manual_seed(10)
    bs, S = 300, 3
    logits = torch.randn(bs, S + 1, V) * 3
    drafts = torch.randint(0, V, (bs, S))
    kinds = torch.arange(bs) % 4  # 0 greedy, 1 temperature only, 2 top-k 4 (+ top-p), 3 top-k 6 (+ min-p)
    top_k = torch.tensor([1, TOP_K_ALL, 4, 6])[kinds]
    top_p = torch.tensor([1.0, 1.0, 0.8, 1.0])[kinds]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1])[kinds]
    rows = SamplingRows(torch.full((bs,), 0.9), top_p, top_k, min_p)
    uniforms = _uniforms(bs, S, 11)
    full = verify_block(drafts, logits, rows, uniforms)
    rows.host_filters = tuple(zip(top_k.tolist(), top_p.tolist(), min_p.tolist()))
    assert rows.rank_bound(V) == 6
    for probe in (None, 3):
        fast = verify_block(drafts, logits, rows, uniforms, probe=probe)
        assert torch.equal(fast.tokens, full.tokens) and torch.equal(fast.accept_len, full.accept_len)


def _top_k_batch(bs, S, K, vocab, seed):
    """Rows that all have a top-k (<= 8; some greedy, some with top-p / min-p on
    top), drafts drawn from a sparse q over K distinct candidates per slot."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, S + 1, vocab, generator=g) * 2
    kind = torch.arange(bs) % 4
    temperature = torch.where(kind == 0, 0.0, torch.rand(bs, generator=g) + 0.4)
    top_k = torch.randint(1, 9, (bs,), generator=g)
    top_p = torch.where(kind == 2, 0.7, 1.0)
    min_p = torch.where(kind == 3, 0.1, 0.0)
    q_ids = torch.stack([torch.randperm(vocab, generator=g)[:K] for _ in range(bs * S)] or
                        [torch.zeros(0, K, dtype=torch.long)]).view(bs, S, K)
    q_probs = torch.rand(bs, S, K, generator=g).softmax(-1)
    pick = torch.multinomial(q_probs.view(-1, K), 1, generator=g).view(bs, S)
    drafts = q_ids.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    rows = SamplingRows(temperature, top_p, top_k, min_p,
                        host_filters=tuple(zip(top_k.tolist(), top_p.tolist(), min_p.tolist())))
    return logits, drafts, q_ids, q_probs, rows


@pytest.mark.parametrize("S", [0, 1, 4])
def test_sparse_p_draws_the_dense_tokens(S):
    """Rows that all have a top-k take p sparse (its ranked ids only): the same
    accept lengths and tokens as the dense p, from the same uniforms; and the
    sparse p scattered over the vocabulary is the dense one."""
    from sglang_dflash.ops.rejection_ref import chain_rejection_sample_uniforms, chain_rejection_sparse_p
    from sglang_dflash.rejection import target_probs_sparse

    bs, K, vocab = 400, 4, 40
    logits, drafts, q_ids, q_probs, rows = _top_k_batch(bs, S, K, vocab, seed=12 + S)
    uniforms = _uniforms(bs, S, 13)
    flat = rows.repeat(S + 1)
    args = (logits.view(-1, vocab), flat.temperature, flat.top_p, flat.top_k, flat.min_p)
    dense_p = target_probs(*args).view(bs, S + 1, vocab)
    ids, probs = target_probs_sparse(*args, ranks=rows.sparse_bound(vocab))
    assert bool((ids.diff(dim=-1) > 0).all())
    scattered = torch.zeros(bs * (S + 1), vocab).scatter_(-1, ids, probs)
    torch.testing.assert_close(scattered.view(bs, S + 1, vocab), dense_p, rtol=0, atol=1e-6)
    dense = chain_rejection_sample_uniforms(drafts, q_ids, q_probs, dense_p, uniforms.accept, uniforms.sample)
    sparse = chain_rejection_sparse_p(drafts, q_ids, q_probs, ids.view(bs, S + 1, -1), probs.view(bs, S + 1, -1),
                                      uniforms.accept, uniforms.sample)
    assert torch.equal(sparse.accept_len, dense.accept_len) and torch.equal(sparse.tokens, dense.tokens)
    if S:
        assert 0 < int(dense.accept_len.sum()) < bs * S  # accepts and rejections both seen
    # verify_block takes the sparse path from the host filters: the same result as without them.
    via_host = verify_block(drafts, logits, rows, uniforms, q_ids=q_ids, q_probs=q_probs)
    rows.host_filters = None
    without = verify_block(drafts, logits, rows, uniforms, q_ids=q_ids, q_probs=q_probs)
    assert torch.equal(via_host.tokens, without.tokens) and torch.equal(via_host.accept_len, without.accept_len)


def test_sparse_bound():
    rows = _rows(3, [False] * 3)
    rows.host_filters = ((5, 1.0, 0.0), (1, 1.0, 0.0), (12, 0.9, 0.1))
    assert rows.sparse_bound(V) == 12
    rows.host_filters = ((5, 1.0, 0.0), (TOP_K_ALL, 1.0, 0.0))
    assert rows.sparse_bound(V) is None
    rows.host_filters = ((V, 1.0, 0.0),)
    assert rows.sparse_bound(V) is None
