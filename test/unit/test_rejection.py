"""Unit tests for rejection.py: target probabilities, chain rejection sampling
(lossless, checked statistically) and greedy acceptance."""

import math

import pytest
import torch
from sglang_dflash.rejection import (
    _filtered,
    PAD_TOKEN_ID,
    AcceptResult,
    chain_rejection_sample,
    greedy_accept,
    target_probs,
)

torch.set_num_threads(1)

TOP_K_ALL = 1 << 30  # SGLang's "no top-k" value

# --------------------------------------------------------------------------
# target_probs
# --------------------------------------------------------------------------


def _reference_target_probs(logits, temperature, top_p, top_k, min_p):
    """One row at a time in plain Python floats, following SGLang's torch sampler."""
    out = []
    for row, temp, tp, tk, mp in zip(logits.tolist(), temperature.tolist(), top_p.tolist(),
                                     top_k.tolist(), min_p.tolist(), strict=True):
        vocab = len(row)
        if temp < 1e-6:  # SamplingParams: greedy is T = 1 with top_k = 1
            temp, tk = 1.0, 1
        if tk <= 0 or tk >= vocab:
            tk = vocab
        peak = max(row)
        weights = [math.exp((x - peak) / temp) for x in row]
        probs = [w / sum(weights) for w in weights]
        order = sorted(range(vocab), key=lambda i: (-probs[i], i))  # ties: lower id first
        kept, before = {}, 0.0
        for rank, tok in enumerate(order):
            if rank < tk and before <= tp and probs[tok] >= probs[order[0]] * mp:
                kept[tok] = probs[tok]
            before += probs[tok]
        total = sum(kept.values())
        out.append([kept.get(i, 0.0) / total for i in range(vocab)])
    return torch.tensor(out, dtype=torch.float64)


def _sampling_params(n, temperature=1.0, top_p=1.0, top_k=TOP_K_ALL, min_p=0.0):
    return (torch.full((n,), float(temperature)), torch.full((n,), float(top_p)),
            torch.full((n,), top_k, dtype=torch.int64), torch.full((n,), float(min_p)))


def test_target_probs_matches_reference_on_handmade_logits():
    logits = torch.tensor([
        [2.0, 1.0, 0.5, 0.0, -1.0, -3.0],  # plain softmax
        [2.0, 1.0, 0.5, 0.0, -1.0, -3.0],  # top-k 3
        [0.1, 3.0, 2.5, -1.0, 0.0, 1.0],  # top-p 0.8
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],  # ties at the top-k 2 boundary
        [4.0, 3.0, 1.0, 0.9, -2.0, 0.0],  # min-p 0.1 at T 0.7
        [0.3, -0.2, 0.9, 0.1, 0.5, 0.4],  # all filters at T 1.7
        [0.3, -0.2, 0.9, 0.9, 0.5, 0.4],  # temperature 0: greedy, first max
        [5.0, float("-inf"), 1.0, 0.0, float("-inf"), 2.0],  # grammar-masked tokens
    ])
    temperature = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.7, 1.7, 0.0, 0.5])
    top_p = torch.tensor([1.0, 1.0, 0.8, 1.0, 1.0, 0.7, 1.0, 0.9])
    top_k = torch.tensor([TOP_K_ALL, 3, TOP_K_ALL, 2, TOP_K_ALL, 4, TOP_K_ALL, -1])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.0, 0.0])
    probs = target_probs(logits, temperature, top_p, top_k, min_p)
    expected = _reference_target_probs(logits, temperature, top_p, top_k, min_p)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.double(), expected, rtol=0, atol=1e-6)
    assert probs[3].tolist()[:3] == pytest.approx([0.5, 0.5, 0.0])  # ties kept by token id
    assert probs[6].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_target_probs_random_rows_sum_to_one():
    gen = torch.Generator().manual_seed(0)
    n, vocab = 64, 50
    logits = torch.randn(n, vocab, generator=gen) * 3
    temperature = torch.rand(n, generator=gen) * 2 + 0.05
    top_p = torch.rand(n, generator=gen) * 0.9 + 0.1
    top_k = torch.randint(-1, vocab + 5, (n,), generator=gen)
    min_p = torch.rand(n, generator=gen) * 0.3
    probs = target_probs(logits, temperature, top_p, top_k, min_p)
    torch.testing.assert_close(probs.sum(-1), torch.ones(n))
    assert bool((probs >= 0).all())
    torch.testing.assert_close(
        probs.double(), _reference_target_probs(logits, temperature, top_p, top_k, min_p),
        rtol=0, atol=1e-6)


def test_target_probs_top_k_one_is_one_hot_argmax():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 20, generator=gen)
    probs = target_probs(logits, *_sampling_params(16, temperature=1.3, top_k=1))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 20).float())


@pytest.mark.parametrize("disabled", [-1, 0, 20, TOP_K_ALL])
def test_target_probs_top_k_disabled_values(disabled):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 20, generator=gen)
    probs = target_probs(logits, *_sampling_params(4, temperature=0.8, top_k=disabled))
    torch.testing.assert_close(probs, torch.softmax(logits / 0.8, dim=-1))


def test_target_probs_bad_shapes_raise():
    logits = torch.randn(3, 5)
    temperature, top_p, top_k, min_p = _sampling_params(3)
    with pytest.raises(ValueError, match="logits"):
        target_probs(logits[0], temperature, top_p, top_k, min_p)
    with pytest.raises(ValueError, match="top_k"):
        target_probs(logits, temperature, top_p, top_k[:2], min_p)


def _mixed_filter_rows(n, vocab, gen, top_k_max):
    """n rows of every kind: unfiltered, greedy (T = 0), top-k <= top_k_max
    (alone or with top-p / min-p), at random temperatures; peaked logits (a
    real model's nucleus is small) with no exact ties."""
    logits = torch.randn(n, vocab, generator=gen) * 4
    kind = torch.arange(n) % 5
    temperature = torch.where(kind == 1, 0.0, torch.rand(n, generator=gen) + 0.3)
    top_k = torch.where(kind >= 2, torch.randint(2, top_k_max + 1, (n,), generator=gen), TOP_K_ALL)
    top_p = torch.where(kind == 3, torch.rand(n, generator=gen) * 0.8 + 0.1, 1.0)
    min_p = torch.where(kind == 4, torch.rand(n, generator=gen) * 0.3, 0.0)
    return logits, temperature, top_p, top_k, min_p


def test_target_probs_ranks_bound_gives_the_full_sorts_result():
    """With a host-known bound on what filtering rows keep, ranking only that
    many tokens (unfiltered rows: the softmax) gives the full sort's p."""
    gen = torch.Generator().manual_seed(5)
    params = _mixed_filter_rows(60, 300, gen, top_k_max=12)
    full = target_probs(*params)
    bounded = target_probs(*params, ranks=12)
    torch.testing.assert_close(bounded, full, rtol=0, atol=1e-6)
    assert torch.equal(bounded > 0, full > 0)
    # The reference (row by row, plain Python) agrees as well.
    torch.testing.assert_close(bounded.double(), _reference_target_probs(*params), rtol=0, atol=1e-6)


def test_target_probs_no_filters_is_the_softmax():
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(8, 50, generator=gen)
    temperature = torch.rand(8, generator=gen) + 0.2
    _, top_p, top_k, min_p = _sampling_params(8)
    probs = target_probs(logits, temperature, top_p, top_k, min_p, ranks=0)
    torch.testing.assert_close(probs, torch.softmax(logits / temperature.unsqueeze(-1), dim=-1))
    torch.testing.assert_close(probs, target_probs(logits, temperature, top_p, top_k, min_p), rtol=0, atol=1e-7)


@pytest.mark.parametrize("probe", [4, 16, 64])
def test_target_probs_probe_falls_back_where_the_kept_set_passes_it(probe):
    """Top-p and min-p rows (no host bound): the probe's p is the full sort's
    whether or not a row's kept set ends within the probed tokens (flat rows
    reach past the smaller probes; those rows alone are sorted again)."""
    gen = torch.Generator().manual_seed(7)
    n, vocab = 40, 200
    logits = torch.randn(n, vocab, generator=gen) * torch.linspace(0.2, 6, n).unsqueeze(-1)
    temperature = torch.rand(n, generator=gen) + 0.5
    top_p = torch.where(torch.arange(n) % 2 == 0, torch.rand(n, generator=gen) * 0.9 + 0.05, 1.0)
    min_p = torch.where(torch.arange(n) % 2 == 1, torch.rand(n, generator=gen) * 0.2, 0.0)
    top_k = torch.full((n,), TOP_K_ALL)
    full = target_probs(logits, temperature, top_p, top_k, min_p)
    probed = target_probs(logits, temperature, top_p, top_k, min_p, probe=probe)
    torch.testing.assert_close(probed, full, rtol=0, atol=1e-6)


def test_target_probs_probe_kept_when_every_row_fits():
    """Peaked rows whose nuclei all end within the probe: the probe's own result
    (no sort) is returned, and it is the full sort's."""
    gen = torch.Generator().manual_seed(9)
    n, vocab, probe = 16, 500, 32
    logits = torch.randn(n, vocab, generator=gen) * 8
    temperature, top_p, top_k, min_p = _sampling_params(n, temperature=0.8, top_p=0.9, min_p=0.05)
    probs = torch.softmax(logits / 0.8, dim=-1)
    assert bool(_filtered(probs, torch.full((n,), vocab), top_p, min_p, probe)[1].all())
    full = target_probs(logits, temperature, top_p, top_k, min_p)
    torch.testing.assert_close(target_probs(logits, temperature, top_p, top_k, min_p, probe=probe), full,
                               rtol=0, atol=1e-6)


def test_filtered_rows_covered_only_when_the_kept_set_ends_within_the_ranks():
    """`_filtered`'s per-row flag: a covered row equals the full sort's; a row
    whose full kept set is larger than the ranked tokens is never covered."""
    gen = torch.Generator().manual_seed(8)
    n, vocab, ranks = 300, 120, 10
    logits = torch.randn(n, vocab, generator=gen) * torch.rand(n, 1, generator=gen) * 8
    temperature = torch.ones(n)
    top_k = torch.where(torch.arange(n) % 3 == 0, torch.randint(1, 20, (n,), generator=gen), vocab)
    top_p = torch.where(torch.arange(n) % 3 == 1, torch.rand(n, generator=gen), 1.0)
    min_p = torch.where(torch.arange(n) % 3 == 2, torch.rand(n, generator=gen) * 0.5, 0.0)
    probs = torch.softmax(logits, dim=-1)
    full = target_probs(logits, temperature, top_p, top_k, min_p)
    part, covered = _filtered(probs, top_k, top_p, min_p, ranks)
    kept_count = (full > 0).sum(-1)
    assert covered.any() and not covered.all()
    torch.testing.assert_close(part[covered], full[covered], rtol=0, atol=1e-6)
    assert not covered[kept_count > ranks].any()


# --------------------------------------------------------------------------
# greedy_accept and chain_rejection_sample on hand-made cases
# --------------------------------------------------------------------------


def test_greedy_accept_early_mismatch():
    res = greedy_accept(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 5, 3, 4]]))
    assert res.accept_len.tolist() == [1]
    assert res.tokens.tolist() == [[1, 5, PAD_TOKEN_ID, PAD_TOKEN_ID]]
    assert res.bonus.tolist() == [5] and res.commit_len.tolist() == [2]


def test_greedy_accept_full_accept_and_first_position_mismatch():
    drafts = torch.tensor([[1, 2, 3], [7, 8, 9], [4, 4, 4]])
    target = torch.tensor([[1, 2, 3, 4], [6, 8, 9, 1], [4, 4, 4, 4]])
    res = greedy_accept(drafts, target)
    assert res.accept_len.dtype == torch.int64
    assert res.accept_len.tolist() == [3, 0, 3]
    assert res.tokens.tolist() == [[1, 2, 3, 4], [6, PAD_TOKEN_ID, PAD_TOKEN_ID, PAD_TOKEN_ID],
                                   [4, 4, 4, 4]]


def test_greedy_accept_bad_shape_raises():
    with pytest.raises(ValueError, match="target_argmax"):
        greedy_accept(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, dtype=torch.int64))


def _one_hot(tokens, vocab):
    return torch.nn.functional.one_hot(torch.as_tensor(tokens), vocab).float()


def test_chain_one_hot_target_matches_greedy_accept():
    # p one-hot (top_k = 1) and q one-hot: chain rejection reduces to greedy accept.
    gen = torch.Generator().manual_seed(0)
    drafts = torch.tensor([[1, 2, 3], [7, 8, 9], [4, 4, 4]])
    target = torch.tensor([[1, 2, 3, 4], [6, 8, 9, 1], [4, 0, 4, 4]])
    res = chain_rejection_sample(drafts, _one_hot(drafts, 10), _one_hot(target, 10),
                                 torch.rand(3, 3, generator=gen), gen)
    assert torch.equal(res.tokens, greedy_accept(drafts, target).tokens)
    assert res.accept_len.tolist() == [3, 0, 1]


def test_chain_never_accepts_zero_target_mass():
    p = torch.zeros(1, 3, 4)
    p[0, :, 2] = 1.0  # the target only ever emits token 2
    q = torch.full((1, 2, 4), 0.25)
    res = chain_rejection_sample(torch.tensor([[1, 2]]), q, p, torch.zeros(1, 2))
    assert res.accept_len.tolist() == [0]
    assert res.tokens.tolist() == [[2, PAD_TOKEN_ID, PAD_TOKEN_ID]]


def test_chain_empty_residual_falls_back_to_target():
    # q slightly above p everywhere (rounding): a rejection leaves no residual
    # mass, so the emitted token must come from p itself.
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25] * 4]])
    q = p[:, :1] * 1.001
    res = chain_rejection_sample(torch.tensor([[1]]), q, p, torch.tensor([[0.9995]]),
                                 torch.Generator().manual_seed(0))
    assert res.accept_len.tolist() == [0] and res.tokens[0, 0].item() in (1, 2)


def test_chain_is_reproducible_with_seeded_generator():
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(64, 5, 11, generator=gen), -1)
    q = torch.softmax(torch.randn(64, 4, 11, generator=gen), -1)
    drafts = torch.multinomial(q.view(-1, 11), 1, generator=gen).view(64, 4)
    u = torch.rand(64, 4, generator=gen)
    first = chain_rejection_sample(drafts, q, p, u, torch.Generator().manual_seed(9))
    second = chain_rejection_sample(drafts, q, p, u, torch.Generator().manual_seed(9))
    assert isinstance(first, AcceptResult)
    assert torch.equal(first.tokens, second.tokens)
    assert torch.equal(first.accept_len, second.accept_len)
    # Layout: accepted drafts, the bonus at accept_len, then padding.
    for row in range(64):
        n = int(first.accept_len[row])
        assert first.tokens[row, :n].tolist() == drafts[row, :n].tolist()
        assert first.tokens[row, n] >= 0 and bool((first.tokens[row, n + 1:] == PAD_TOKEN_ID).all())


def test_chain_bad_shapes_raise():
    drafts = torch.zeros(2, 3, dtype=torch.int64)
    q, p, u = torch.rand(2, 3, 8), torch.rand(2, 4, 8), torch.rand(2, 3)
    with pytest.raises(ValueError, match="p must"):
        chain_rejection_sample(drafts, q, p[:, :3], u)
    with pytest.raises(ValueError, match="q must"):
        chain_rejection_sample(drafts, q[..., :7], p, u)
    with pytest.raises(ValueError, match="uniforms"):
        chain_rejection_sample(drafts, q, p, u[:, :2])


# --------------------------------------------------------------------------
# Losslessness, statistically
# --------------------------------------------------------------------------

VOCAB = 32
NUM_SLOTS = 7  # drafted positions: block size 8
NUM_CANDIDATES = 16
NUM_ROWS = 200_000  # independent speculative steps per case
ANCHOR = 3  # verified token every step starts from
TV_THRESHOLD = 0.01
NOISE_SDS = 4.0  # tolerance is never tighter than E[TV] + 4 sd under the null
MIN_ROWS = 5_000  # fewer rows than this: the check is skipped


def _chain_case(seed, temperature, top_p, top_k, q_temperature):
    """Target chain P [V, V] and draft tables for one case.

    Target: p(. | prev) = target_probs(random logits[prev], case params).
    Draft: a different random table (target logits plus noise, so that drafts
    are often but not always accepted), sampled at `temperature` and
    restricted, per slot and predecessor, to 16 candidates: the top 16 of the
    draft logits plus Gumbel noise, like a selector (q is zero outside them).
    `q_temperature` is the temperature of the q handed to the verifier: equal
    to `temperature` when correct.

    Returns:
        (P [V, V], sample_cdf [S, V, V], q_table [S, V, V]), float32.
    """
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(VOCAB, VOCAB, generator=gen) * 3.0
    draft_logits = target_logits + torch.randn(VOCAB, VOCAB, generator=gen) * 0.5
    target = target_probs(target_logits, *_sampling_params(VOCAB, temperature, top_p, top_k))
    gumbel = -torch.log(-torch.log(torch.rand(NUM_SLOTS, VOCAB, VOCAB, generator=gen)))
    top = torch.topk(draft_logits + gumbel, NUM_CANDIDATES, dim=-1).indices
    outside = torch.ones(NUM_SLOTS, VOCAB, VOCAB, dtype=torch.bool).scatter_(-1, top, False)
    sampled = torch.softmax((draft_logits / temperature).masked_fill(outside, -math.inf), -1)
    q_table = torch.softmax((draft_logits / q_temperature).masked_fill(outside, -math.inf), -1)
    return target, sampled.cumsum(-1), q_table


def _one_hot_case(seed, temperature, top_p, top_k):
    """Same target; the draft is the deterministic argmax of the draft table (DFlash v1)."""
    target, _, q_table = _chain_case(seed, temperature, top_p, top_k, temperature)
    one_hot = torch.nn.functional.one_hot(q_table.argmax(-1), VOCAB).float()  # [S, V, V]
    return target, one_hot.cumsum(-1), one_hot


def _speculative_counts(target, sample_cdf, q_table, seed):
    """One speculative step for NUM_ROWS rows from ANCHOR; count what was emitted.

    Returns:
        [S+1, V, V] int64 counts[i, c, t]: rows whose emitted block reached
        position i, with token c before it (ANCHOR at i = 0) and t at it.
    """
    gen = torch.Generator().manual_seed(seed)
    prev = torch.full((NUM_ROWS,), ANCHOR, dtype=torch.int64)
    drafts = []
    for slot in range(NUM_SLOTS):  # inverse-CDF draw from the draft table
        u = torch.rand(NUM_ROWS, 1, generator=gen)
        prev = (sample_cdf[slot, prev] <= u).sum(-1).clamp(max=VOCAB - 1)
        drafts.append(prev)
    drafts = torch.stack(drafts, dim=1)  # [n, S]
    context = torch.cat([torch.full((NUM_ROWS, 1), ANCHOR), drafts], dim=1)  # [n, S+1]
    q = q_table[torch.arange(NUM_SLOTS), context[:, :NUM_SLOTS]]  # [n, S, V]
    p = target[context]  # [n, S+1, V]
    res = chain_rejection_sample(drafts, q, p, torch.rand(NUM_ROWS, NUM_SLOTS, generator=gen), gen)
    positions = torch.arange(NUM_SLOTS + 1).expand(NUM_ROWS, -1)
    reached = positions <= res.accept_len.unsqueeze(1)
    flat = (positions * VOCAB + context) * VOCAB + res.tokens
    counts = torch.bincount(flat[reached], minlength=(NUM_SLOTS + 1) * VOCAB * VOCAB)
    return counts.view(NUM_SLOTS + 1, VOCAB, VOCAB)


def _tv_checks(counts, target):
    """TV of every position's emitted-token distribution against the target.

    Leviathan et al.: given that position i was reached and its previous token
    c, the token emitted at i is distributed exactly as p(. | c), whatever
    happened before. Two kinds of check per position:
      * pooled: all rows reaching i, against the mixture sum_c n_c p(.|c) / n;
      * per context c: rows reaching i after c, against p(. | c).

    Returns:
        list of (label, tv, tolerance) for the checks that ran.
    """
    checks = []
    for i in range(counts.shape[0]):
        per_context = counts[i].double()  # [V(c), V(t)]
        weights = per_context.sum(-1)  # [V]
        checks += _check(f"pos {i} pooled", per_context.sum(0), weights, target)
        for c in torch.nonzero(weights).flatten().tolist():
            one = torch.zeros_like(weights)
            one[c] = weights[c]
            checks += _check(f"pos {i} after {c}", per_context[c], one, target)
    return checks


def _check(label, observed, weights, target):
    """[(label, TV(observed / n, mixture), tolerance)], or [] below MIN_ROWS.

    Under the null each of the n draws comes from p(. | its context), so cell
    t has variance v_t = sum_c n_c p_ct (1 - p_ct) / n^2. With normal cells,
    E[TV] = 0.5 * sum_t sqrt(2 v_t / pi) and sd(TV) ~ 0.5 * sqrt((1 - 2/pi) *
    sum_t v_t) (the cells' weak negative correlation only lowers it). The
    tolerance is 0.01, or E[TV] + 4 sd where the sample is too small for 0.01,
    so a correct sampler exceeds it with probability about 3e-5 per check.
    """
    n = float(weights.sum())
    if n < MIN_ROWS:
        return []
    p = target.double()
    mixture = (weights @ p) / n
    variance = (weights @ (p * (1 - p))) / n ** 2
    mean = 0.5 * float(torch.sqrt(2 * variance / math.pi).sum())
    sd = 0.5 * math.sqrt((1 - 2 / math.pi) * float(variance.sum()))
    tolerance = max(TV_THRESHOLD, mean + NOISE_SDS * sd)
    tv = 0.5 * float((observed / n - mixture).abs().sum())
    return [(label, tv, tolerance)]


def _assert_lossless(checks, strict_positions):
    """Every check within tolerance; the listed positions checked at exactly 0.01."""
    strict = {label for label, _, tol in checks if tol == TV_THRESHOLD and "pooled" in label}
    missing = [i for i in strict_positions if f"pos {i} pooled" not in strict]
    assert not missing, f"positions {missing} lack a pooled check at TV {TV_THRESHOLD}"
    failed = [(label, round(tv, 4), round(tol, 4)) for label, tv, tol in checks if tv > tol]
    assert not failed, f"{len(failed)} of {len(checks)} checks above tolerance: {failed}"


FILTERS = {"none": (1.0, TOP_K_ALL), "top_p_0.9": (0.9, TOP_K_ALL), "top_k_8": (1.0, 8),
           "top_p_0.9_top_k_8": (0.9, 8)}


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("filters", ["none", "top_p_0.9", "top_k_8", "top_p_0.9_top_k_8"])
def test_chain_rejection_is_lossless(temperature, filters):
    """Emitted tokens follow the target chain at every block position.

    200k independent speculative steps per case, V = 32, 7 drafted slots
    (block 8), draft q over 16 candidates, sampled at the target temperature.
    Tolerance (see `_check`): TV <= 0.01 wherever E[TV] + 4 sd under the null
    allows it, which covers positions 0-2 in every case; deeper positions and
    sparse contexts are checked at E[TV] + 4 sd instead. Every position
    0..7, the bonus included, gets at least a pooled check.
    """
    top_p, top_k = FILTERS[filters]
    target, sample_cdf, q_table = _chain_case(11, temperature, top_p, top_k, temperature)
    checks = _tv_checks(_speculative_counts(target, sample_cdf, q_table, seed=5), target)
    pooled = {label for label, _, _ in checks if "pooled" in label}
    assert pooled == {f"pos {i} pooled" for i in range(NUM_SLOTS + 1)}, pooled
    _assert_lossless(checks, strict_positions=range(3))


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_chain_rejection_detects_wrong_temperature_q(temperature):
    """The vLLM pitfall (docs/design.md §6.5): drafts sampled at T, q computed at 1.0.

    The checks of `test_chain_rejection_is_lossless` must flag it: most of
    them above tolerance, and position 0, where all 200k rows share one
    context, at several times 0.01.
    """
    target, sample_cdf, q_table = _chain_case(11, temperature, 1.0, TOP_K_ALL, q_temperature=1.0)
    checks = _tv_checks(_speculative_counts(target, sample_cdf, q_table, seed=5), target)
    flagged = [label for label, tv, tol in checks if tv > tol]
    assert len(flagged) > len(checks) // 2, (len(flagged), len(checks))
    first = dict((label, tv) for label, tv, _ in checks)["pos 0 pooled"]
    assert first > 3 * TV_THRESHOLD, first


@pytest.mark.parametrize(
    "temperature,filters", [(0.5, "none"), (1.0, "top_k_8"), (1.7, "top_p_0.9")]
)
def test_one_hot_draft_is_lossless(temperature, filters):
    """A deterministic argmax draft (DFlash v1) with one-hot q, by the same checks."""
    top_p, top_k = FILTERS[filters]
    target, sample_cdf, q_det = _one_hot_case(13, temperature, top_p, top_k)
    checks = _tv_checks(_speculative_counts(target, sample_cdf, q_det, seed=7), target)
    _assert_lossless(checks, strict_positions=[0])
