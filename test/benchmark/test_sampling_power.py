"""benchmark/sampling_power.py: the sampling tests' statistic and its exact power model."""

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
from sampling_power import (  # noqa: E402
    continuation_distribution,
    feature_probs,
    filtered_probs,
    goodness_of_fit_p,
    homogeneity_p,
    load_target,
    mean_accept,
    penalized,
    sampled_features,
    scaled,
    simulated_power,
)


def test_filtered_probs_cuts_rank_and_tail_then_renormalises():
    # softmax of log [0.5, 0.3, 0.15, 0.05] at T = 1 is the same list
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    p = filtered_probs(logits, 1.0, top_k=3, top_p=0.7)
    # top-p keeps a token while the mass before it is <= 0.7: 0.5 and 0.3, not 0.15
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]], dtype=torch.float64))
    p = filtered_probs(logits, 1.0, top_k=1, top_p=1.0)
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    hot = filtered_probs(logits, 0.5, top_k=4, top_p=1.0)  # T < 1 sharpens
    assert hot[0, 0] > 0.5 and torch.isclose(hot.sum(), torch.tensor(1.0, dtype=torch.float64))
    # min_p 0.25 cuts below 0.25 x 0.5 = 0.125: 0.05 goes, 0.15 stays
    p = filtered_probs(logits, 1.0, top_k=4, top_p=1.0, min_p=0.25)
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.0]], dtype=torch.float64) / 0.95)


def test_penalties_count_each_rows_own_history():
    logits = torch.zeros(2, 5)
    history = torch.tensor([[1, 1, 3], [4, 0, 0]])
    got = penalized(logits, history, frequency=0.5, presence=0.25)
    # row 0: token 1 twice -> -2 x 0.5 - 0.25, token 3 once -> -0.5 - 0.25
    assert got.tolist() == [[0.0, -1.25, 0.0, -0.75, 0.0], [-1.25, 0.0, 0.0, 0.0, -0.75]]
    assert penalized(logits, history[:, :0], 0.5, 0.25) is logits  # no output yet: no penalty


@pytest.fixture(scope="module")
def tiny():
    from sglang_dflash.demo import tiny_paths

    model, tok, stops = load_target(tiny_paths()["target"])
    return model, tok("one two three", add_special_tokens=False)["input_ids"], stops


def _brute_force(model, ids, stops, kw, penalize, depth=3):
    """Every continuation's probability by a full forward per path, with
    penalize(logits [1, V], path) applied by hand."""
    with torch.no_grad():
        frontier = {(): 1.0}
        for step in range(depth):
            nxt = {}
            for path, m in frontier.items():
                logits = model(torch.tensor([ids + list(path)])).logits[:, -1].clone()
                probs = filtered_probs(penalize(logits, path), **kw)[0]
                for t in probs.nonzero().flatten().tolist():
                    if t in stops and step < depth - 1:
                        continue
                    nxt[path + (t,)] = m * probs[t].item()
            frontier = nxt
    total = sum(frontier.values())
    return {p: m / total for p, m in frontier.items()}


def _additive(logits, path):
    for t in set(path):
        logits[0, t] += 2.0 * path.count(t) + 1.5
    return logits


def _scaling(logits, path):
    for t in set(path):
        logits[0, t] = logits[0, t] * 0.4 if logits[0, t] < 0 else logits[0, t] / 0.4
    return logits


# Penalties that favour repeats lift the tokens already drawn into the random
# target's top 4, where they change the distribution (ones against repeats
# only push out tokens that top-k would have cut anyway).
@pytest.mark.parametrize("penalties, penalize", [
    ({"frequency_penalty": -2.0, "presence_penalty": -1.5}, _additive),
    ({"repetition_penalty": 0.4}, _scaling),
], ids=["additive", "repetition"])
def test_continuation_distribution_equals_brute_force(tiny, penalties, penalize):
    """The shared-cache enumeration against a full forward per path, to depth 3,
    with min_p and penalties counted by hand along each path."""
    model, ids, stops = tiny
    kw = dict(temperature=0.7, top_k=4, top_p=0.9, min_p=0.1)
    paths, mass = continuation_distribution(model, ids, stops, {**kw, "max_new_tokens": 3, **penalties}, chunk=5)
    assert torch.isclose(mass.sum(), torch.tensor(1.0, dtype=torch.float64))
    got = dict(zip(map(tuple, paths.tolist()), mass.tolist()))
    want = _brute_force(model, ids, stops, kw, penalize)
    assert got.keys() == want.keys()
    assert any(len(set(path)) < len(path) for path in want)  # the penalties made repeats possible
    assert max(abs(got[k] - want[k]) for k in want) < 1e-6
    plain = _brute_force(model, ids, stops, kw, lambda logits, path: logits)
    assert max(abs(plain.get(k, 0.0) - want[k]) for k in want) > 1e-3  # and they matter


def test_paths_without_a_shareable_cache_run_whole_sequences(tiny):
    """A hybrid target's cache (linear-attention layers transformers cannot
    replicate) takes the full-sequence forward; its logits are the shared cache's."""
    from types import SimpleNamespace

    from sampling_power import _path_logits

    model, ids, _ = tiny
    with torch.no_grad():
        prompt = model(torch.tensor([ids]), use_cache=True)
        paths = torch.tensor([[5, 9], [7, 7], [100, 3]])
        shared = _path_logits(model, prompt, ids, paths)
        unshareable = SimpleNamespace(past_key_values=SimpleNamespace(layers=[object()]))
        whole = _path_logits(model, unshareable, ids, paths)
    torch.testing.assert_close(whole, shared, atol=1e-4, rtol=1e-4)


def test_repetition_beside_additive_penalties_is_refused(tiny):
    model, ids, stops = tiny
    sampling = {"max_new_tokens": 2, "temperature": 1.0, "top_k": 4, "top_p": 1.0,
                "repetition_penalty": 1.2, "frequency_penalty": 0.5}
    with pytest.raises(ValueError, match="not modelled"):
        continuation_distribution(model, ids, stops, sampling)


def test_scaling_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    got = scaled(logits, torch.tensor([[0, 1], [2, 2]]), repetition=2.0)
    assert got.tolist() == [[1.0, -4.0, 1.0], [2.0, -2.0, 0.5]]
    assert scaled(logits, torch.tensor([[0, 1]])[:, :0], 2.0) is logits


def test_homogeneity_p_separates_equal_from_different_samples():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 20, 5000).tolist(), rng.integers(0, 20, 5000).tolist()
    assert homogeneity_p(a, b) > 1e-3
    c = rng.integers(0, 10, 5000).tolist()  # half the categories
    assert homogeneity_p(a, c) < 1e-10
    assert homogeneity_p([1] * 50, [1] * 50) == 1.0  # one category: nothing to test
    # categories with fewer than 10 pooled observations are merged, not dropped
    rare = list(range(100, 200))
    assert homogeneity_p(a + rare, b) < 1e-3 < homogeneity_p(a + rare, b + list(range(200, 300)))


def test_sampled_features_drop_short_outputs():
    f = sampled_features([[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11]])
    assert f == {"token2": [2, 8], "token3": [3, 9], "token4": [4, 10], "pair23": [(2, 3), (8, 9)]}


def test_mean_accept_over_the_requests_the_features_use():
    results = [{"output_ids": [1, 2, 3, 4], "meta_info": {"spec_accept_length": 3.0}},
               {"output_ids": [5], "meta_info": {"spec_accept_length": 0.0}},  # stopped at once
               {"output_ids": [1, 2, 3, 4, 5], "meta_info": {"spec_accept_length": 2.0}}]
    assert mean_accept(results) == 2.5


def test_simulated_power_of_known_cases():
    paths = torch.tensor([[0, a, b, c] for a in range(4) for b in range(4) for c in range(4)])
    uniform = (paths, torch.full((64,), 1 / 64, dtype=torch.float64))
    skew = torch.where(paths[:, 1] == 0, 2.0, 1.0).double()
    skewed = (paths, skew / skew.sum())  # token 2 = 0 twice as likely
    assert simulated_power(uniform, uniform, 2000, reps=20) == 0.0
    assert simulated_power(uniform, skewed, 2000, reps=20) == 1.0
    assert simulated_power(uniform, skewed, 30, reps=20) < 0.5  # too few samples to see it
    assert simulated_power(uniform, uniform, 2000, reps=20, fit=True) == 0.0
    assert simulated_power(uniform, skewed, 2000, reps=20, fit=True) == 1.0


def test_goodness_of_fit_to_exact_probabilities():
    rng = np.random.default_rng(1)
    probs = {0: 0.5, 1: 0.3, 2: 0.15, 3: 0.04, 4: 0.01}
    fair = rng.choice(5, size=4000, p=list(probs.values())).tolist()
    assert goodness_of_fit_p(fair, probs) > 1e-3
    unfair = rng.choice(5, size=4000, p=[0.45, 0.35, 0.15, 0.04, 0.01]).tolist()
    assert goodness_of_fit_p(unfair, probs) < 1e-6
    # 4 and 3 (expected 40 and 160 of 4 000 at min_expected 200) are merged; an
    # unexpected category joins them, and where nothing was expected at all it fails
    assert goodness_of_fit_p(fair, probs, min_expected=200) > 1e-3
    assert goodness_of_fit_p(fair + [7] * 200, probs, min_expected=200) < 1e-6
    assert goodness_of_fit_p([0, 1, 9], {0: 0.5, 1: 0.5}, min_expected=1) == 0.0


def test_feature_probs_sum_paths():
    paths = torch.tensor([[0, 1, 2, 3], [0, 1, 5, 3], [0, 4, 2, 6]])
    mass = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    f = feature_probs((paths, mass))
    assert f["token2"] == {1: 0.75, 4: 0.25} and f["token3"] == {2: 0.75, 5: 0.25}
    assert f["token4"] == {3: 0.75, 6: 0.25} and f["pair23"] == {(1, 2): 0.5, (1, 5): 0.25, (4, 2): 0.25}
