"""Unit tests for select.py: DFlash 2 lattice scores, the path walk and dense q."""

import math

import pytest
import torch
from sglang_dflash.candidates import Candidates
from sglang_dflash.select import (
    MIN_TEMPERATURE,
    lattice_scores,
    walk,
)

torch.set_num_threads(1)

NEG_INF = float("-inf")
F32_MIN_TEMPERATURE = float(torch.tensor(MIN_TEMPERATURE, dtype=torch.float32))


def _random_candidates(gen, bs, slots, k, vocab):
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(bs * slots)])
    unary = torch.randn(bs, slots, k, generator=gen).sort(dim=-1, descending=True).values
    return Candidates(ids=ids.view(bs, slots, k), unary=unary)


def _random_lattice_inputs(seed, bs=2, slots=3, k=4, hidden=6, rank=5, vocab=12):
    gen = torch.Generator().manual_seed(seed)
    cands = _random_candidates(gen, bs, slots, k, vocab)
    h = torch.randn(bs, slots, hidden, generator=gen)
    anchor = torch.randint(vocab, (bs,), generator=gen)
    wp = torch.randn(vocab, rank, generator=gen)
    ws = torch.randn(vocab, rank, generator=gen)
    wh = torch.randn(rank, hidden, generator=gen)
    return cands, h, anchor, wp, ws, wh


def _reference_lattice(cands, h, anchor, wp, ws, wh):
    """s_e[p, c] = unary_e[c] + sum_j Wp[pred][j] * (Wh h_e)[j] * Ws[cand][j], as loops."""
    bs, slots, k = cands.ids.shape
    rank, hidden = wh.shape
    out = torch.empty(bs, slots, k, k, dtype=torch.float64)
    for b in range(bs):
        for e in range(slots):
            proj = [sum(float(wh[j, i]) * float(h[b, e, i]) for i in range(hidden))
                    for j in range(rank)]
            for p in range(k):
                pred = int(anchor[b]) if e == 0 else int(cands.ids[b, e - 1, p])
                for c in range(k):
                    succ = int(cands.ids[b, e, c])
                    dot = sum(float(wp[pred, j]) * proj[j] * float(ws[succ, j])
                              for j in range(rank))
                    out[b, e, p, c] = float(cands.unary[b, e, c]) + dot
    return out


def _reference_walk(scores, cand_ids, temperature, greedy, uniforms):
    """The walk rule in plain Python floats: returns (tokens, choice, q) lists."""
    bs, slots, k, _ = scores.shape
    tokens, choices, qs = [], [], []
    for b in range(bs):
        row, tok_b, choice_b, q_b = 0, [], [], []
        temp = max(float(temperature[b]), F32_MIN_TEMPERATURE)
        for e in range(slots):
            choice, q = _reference_slot(scores[b, e, row].tolist(), temp, bool(greedy[b]),
                                        float(uniforms[b, e]))
            tok_b.append(int(cand_ids[b, e, choice]))
            choice_b.append(choice)
            q_b.append(q)
            row = choice
        tokens.append(tok_b)
        choices.append(choice_b)
        qs.append(q_b)
    return tokens, choices, qs


def _reference_slot(row, temp, greedy, u):
    big = torch.finfo(torch.float32).max
    row = [NEG_INF if math.isnan(x) else (big if x == math.inf else x) for x in row]
    peak = max(row)
    k = len(row)
    if peak == NEG_INF or greedy:
        choice = 0 if peak == NEG_INF else row.index(peak)
        return choice, [1.0 if j == choice else 0.0 for j in range(k)]
    weights = [math.exp((x - peak) / temp) for x in row]
    total = sum(weights)
    q = [w / total for w in weights]
    cdf, acc = [], 0.0
    for value in q:
        acc += value
        cdf.append(acc)
    count = sum(1 for c in cdf if c <= u)
    last_positive = max(j for j in range(k) if q[j] > 0)
    return min(count, last_positive), q


def _walk_case(seed, bs=6, slots=7, k=8, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(bs, slots, k, k, generator=gen) * scale
    scores[:, 0] = scores[:, 0, :1]  # slot 0: every row is the anchor's row
    cand_ids = torch.randint(100, (bs, slots, k), generator=gen)
    uniforms = torch.rand(bs, slots, generator=gen)
    return scores, cand_ids, uniforms


def _assert_walk_matches_reference(scores, cand_ids, temperature, greedy, uniforms):
    path = walk(scores, cand_ids, temperature, greedy, uniforms)
    tokens, choices, qs = _reference_walk(scores, cand_ids, temperature, greedy, uniforms)
    assert path.tokens.dtype == torch.int64 and path.choice.dtype == torch.int64
    assert path.tokens.tolist() == tokens
    assert path.choice.tolist() == choices
    torch.testing.assert_close(path.q, torch.tensor(qs, dtype=torch.float32), rtol=0, atol=1e-6)
    return path


@pytest.mark.parametrize("seed", [0, 1])
def test_lattice_scores_match_triple_loop(seed):
    inputs = _random_lattice_inputs(seed)
    scores = lattice_scores(*inputs)
    assert scores.shape == (2, 3, 4, 4) and scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), _reference_lattice(*inputs), rtol=1e-5, atol=1e-4)
    # Slot 0's predecessor is the anchor for every row.
    assert torch.equal(scores[:, 0], scores[:, 0, :1].expand_as(scores[:, 0]))


def test_lattice_bad_shapes_raise():
    cands, h, anchor, wp, ws, wh = _random_lattice_inputs(0)
    with pytest.raises(ValueError, match="hidden"):
        lattice_scores(cands, h[:, :2], anchor, wp, ws, wh)
    with pytest.raises(ValueError, match="anchor"):
        lattice_scores(cands, h, anchor[:1], wp, ws, wh)
    with pytest.raises(ValueError, match="successor_codebook"):
        lattice_scores(cands, h, anchor, wp, ws[:, :2], wh)
    with pytest.raises(ValueError, match="hidden_projection"):
        lattice_scores(cands, h, anchor, wp, ws, wh.t())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walk_greedy_matches_reference(seed):
    scores, cand_ids, uniforms = _walk_case(seed)
    bs = scores.shape[0]
    path = _assert_walk_matches_reference(
        scores, cand_ids, torch.zeros(bs), torch.ones(bs, dtype=torch.bool), uniforms)
    assert bool((path.q.sum(-1) == 1).all()) and bool(((path.q == 0) | (path.q == 1)).all())


@pytest.mark.parametrize("seed,temp", [(0, 0.5), (1, 1.0), (2, 1.7)])
def test_walk_sampled_matches_reference(seed, temp):
    scores, cand_ids, uniforms = _walk_case(seed)
    bs = scores.shape[0]
    _assert_walk_matches_reference(
        scores, cand_ids, torch.full((bs,), temp), torch.zeros(bs, dtype=torch.bool), uniforms)


def test_walk_mixed_batch_matches_per_row_calls():
    scores, cand_ids, uniforms = _walk_case(3, bs=8)
    temperature = torch.tensor([0.0, 0.7, 1.3, 0.0, 2.0, 0.4, 1.0, 0.0])
    greedy = temperature == 0
    path = _assert_walk_matches_reference(scores, cand_ids, temperature, greedy, uniforms)
    for b in range(8):
        alone = walk(scores[b:b + 1], cand_ids[b:b + 1], temperature[b:b + 1], greedy[b:b + 1],
                     uniforms[b:b + 1])
        assert torch.equal(alone.tokens[0], path.tokens[b])
        assert torch.equal(alone.q[0], path.q[b])


def test_walk_temperature_is_clamped():
    scores, cand_ids, uniforms = _walk_case(4, bs=4)
    greedy = torch.zeros(4, dtype=torch.bool)
    at_zero = walk(scores, cand_ids, torch.zeros(4), greedy, uniforms)
    at_floor = walk(scores, cand_ids, torch.full((4,), MIN_TEMPERATURE), greedy, uniforms)
    assert torch.isfinite(at_zero.q).all()
    assert torch.equal(at_zero.q, at_floor.q) and torch.equal(at_zero.tokens, at_floor.tokens)
    _assert_walk_matches_reference(scores, cand_ids, torch.zeros(4), greedy, uniforms)


def test_walk_q_is_the_distribution_sampled_from():
    """Slot 0 and slot 1 choices over 200k rows match the returned q.

    K = 8 outcomes: the expected TV of an empirical histogram over n draws is
    about 0.5 * sum_j sqrt(2 p_j (1 - p_j) / (pi n)) <= 0.5 * sqrt(2 * 7 / (pi n)),
    i.e. <= 0.0024 at n = 200k and <= 0.0047 at n = 50k, with a standard
    deviation near 0.3 / sqrt(n); 0.01 is several deviations above both.
    """
    scores, cand_ids, _ = _walk_case(5, bs=1, slots=2)
    n = 200_000
    gen = torch.Generator().manual_seed(123)
    expand = (n,) + tuple(scores.shape[1:])
    path = walk(scores.expand(expand), cand_ids.expand(n, -1, -1), torch.full((n,), 1.3),
                torch.zeros(n, dtype=torch.bool), torch.rand(n, 2, generator=gen))
    q0 = torch.softmax(scores[0, 0, 0] / 1.3, dim=-1)
    torch.testing.assert_close(path.q[:, 0], q0.expand(n, -1), rtol=0, atol=1e-6)
    assert _tv(torch.bincount(path.choice[:, 0], minlength=8) / n, q0) < 0.01
    # Slot 1, for the most frequent slot-0 pick: q is that predecessor's row.
    top = int(q0.argmax())
    rows = path.choice[:, 0] == top
    q1 = torch.softmax(scores[0, 1, top] / 1.3, dim=-1)
    assert int(rows.sum()) > 50_000
    torch.testing.assert_close(path.q[rows, 1], q1.expand(int(rows.sum()), -1), rtol=0, atol=1e-6)
    assert _tv(torch.bincount(path.choice[rows, 1], minlength=8) / rows.sum(), q1) < 0.01


@pytest.mark.parametrize("greedy_row", [True, False])
def test_walk_non_finite_scores(greedy_row):
    k = 4
    scores = torch.zeros(1, 4, k, k)
    scores[0, 0] = torch.tensor([1.0, float("nan"), 0.5, NEG_INF])  # NaN never picked
    scores[0, 1] = NEG_INF  # every row dead: fall back to candidate 0
    scores[0, 2] = float("nan")  # all NaN counts as all -inf: fall back too
    scores[0, 3] = torch.tensor([0.0, float("inf"), 1e30, -1e30])  # +inf dominates
    cand_ids = torch.arange(16).view(1, 4, k)
    uniforms = torch.tensor([[0.999, 0.5, 0.5, 0.3]])
    greedy = torch.tensor([greedy_row])
    path = _assert_walk_matches_reference(scores, cand_ids, torch.tensor([0.8]), greedy, uniforms)
    assert torch.isfinite(path.q).all()
    assert path.choice[0, 0] in (0, 2) and path.q[0, 0, 1] == 0 and path.q[0, 0, 3] == 0
    assert path.choice[0, 1:3].tolist() == [0, 0]
    assert path.q[0, 1:3].tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2
    assert path.choice[0, 3] == 1 and path.q[0, 3, 1] == 1.0
    # Every chosen candidate carries positive q, so the verifier can test it.
    assert bool((path.q.gather(-1, path.choice.unsqueeze(-1)) > 0).all())


def test_walk_never_picks_zero_q_candidate_on_cdf_rounding():
    # Trailing -inf candidates have q = 0; u just below 1 may exceed the float
    # CDF total, and the plain clamp to K - 1 would pick a q = 0 candidate.
    live = torch.tensor([-1.6293259859085083, -0.54974365234375, -0.47983425855636597,
                         -0.4996815323829651, -1.0669803619384766])
    scores = torch.full((1, 1, 8, 8), NEG_INF)
    scores[0, 0, :, :5] = live
    u = 1.0 - 2 ** -24
    assert float(torch.softmax(scores[0, 0, 0], -1).cumsum(-1)[-1]) <= u  # the rounding case
    path = walk(scores, torch.arange(8).view(1, 1, 8), torch.tensor([1.0]),
                torch.tensor([False]), torch.tensor([[u]]))
    assert path.choice.item() == 4 and path.q[0, 0, 4] > 0


def test_walk_bad_shapes_raise():
    scores, cand_ids, uniforms = _walk_case(0, bs=2)
    temp, greedy = torch.ones(2), torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="scores"):
        walk(scores[..., :3], cand_ids, temp, greedy, uniforms)
    with pytest.raises(ValueError, match="cand_ids"):
        walk(scores, cand_ids[:, :3], temp, greedy, uniforms)
    with pytest.raises(ValueError, match="greedy"):
        walk(scores, cand_ids, temp, greedy.long(), uniforms)
    with pytest.raises(ValueError, match="uniforms"):
        walk(scores, cand_ids, temp, greedy, uniforms[:, :2])


def _tv(a, b):
    return 0.5 * float((a.double() - b.double()).abs().sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walk_all_greedy_shortcut_equals_the_general_walk(seed):
    """The host flag `all_greedy` only skips work: same tokens, choices and q."""
    scores, cand_ids, uniforms = _walk_case(seed)
    bs = scores.shape[0]
    args = (scores, cand_ids, torch.zeros(bs), torch.ones(bs, dtype=torch.bool), uniforms)
    fast, general = walk(*args, all_greedy=True), walk(*args)
    assert torch.equal(fast.tokens, general.tokens) and torch.equal(fast.choice, general.choice)
    assert torch.equal(fast.q, general.q)
