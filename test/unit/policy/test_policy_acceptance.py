"""Online acceptance rates and E(W)."""

import math
import random

import pytest

from policy_helpers import (
    B, PROFILE_BS, make_policy, profile, run, sample_accept, split_settings, true_cost,
    true_draft, true_thr, true_verify, uniform_rate_at_threshold, uniform_rate_for_ratio,
)
from sglang_dflash.policy import (
    AcceptanceStats, CostModel, PolicyConfig, SpeculationPolicy, Tuning, best_width_bruteforce,
    bucket_of, bucket_range, expected_commits,
)


# ---------------------------------------------------------------------------
# Acceptance statistics
# ---------------------------------------------------------------------------


def test_position_counts_follow_reached_and_accepted_rule():
    stats = AcceptanceStats(4, prior_rate=0.5, min_weight=1e-9)
    # width 3: a=0 reaches 1 (rejected); a=1 reaches 1,2; a=3 reaches 1..3 all accepted.
    stats.observe(3, [0, 1, 3])
    assert stats.weight[:3] == pytest.approx([3, 2, 1])
    assert stats.rates()[:3] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert stats.rates()[3] == pytest.approx(1.0)  # position 4 not reached: its predecessor's rate
    assert AcceptanceStats(4, prior_rate=0.5).rates() == [0.5] * 4  # nothing reached: prior_rate
    with pytest.raises(ValueError, match=r"accept_lens\[0\]"):
        stats.observe(2, [3])


def test_rates_estimator_unbiased_on_geometric_like_acceptance():
    true = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4]
    rng = random.Random(6)
    stats = AcceptanceStats(7, prior_rate=0.5)
    for _ in range(3000):
        width = rng.randint(1, 7)
        stats.observe(width, [sample_accept(rng, true, width) for _ in range(8)])
    for est, p, n in zip(stats.rates(), true, stats.weight):
        assert abs(est - p) < 4 * math.sqrt(p * (1 - p) / n) + 4 / n
    assert stats.expected_commit(7) == pytest.approx(expected_commits(true)[-1], rel=0.02)


def test_decayed_rates_track_a_change_and_keep_unreached_positions():
    rng = random.Random(7)
    stats = AcceptanceStats(3, half_life=20.0, prior_rate=0.5, min_weight=4.0)
    for _ in range(300):
        stats.observe(3, [sample_accept(rng, [0.9] * 3, 3) for _ in range(8)])
    for _ in range(200):
        stats.observe(1, [sample_accept(rng, [0.3] * 3, 1) for _ in range(8)])
    assert stats.rates()[0] == pytest.approx(0.3, abs=0.08)
    assert stats.rates()[1] == pytest.approx(0.9, abs=0.08)  # unreached: last estimate kept
    assert stats.weight[1] == pytest.approx(4.0)  # ... at the floor weight


def test_rarely_reached_last_position_follows_its_predecessor_not_the_prior():
    """Seen in a serving trace (math, c1): the policy ran W = 6 and reached
    position 7 only in wider probes (one step per ~100); a fixed 0.7 prior held
    a_7 of a ~0.9 drafter near 0.8, so W = 7 was predicted 4% worse than W = 6
    and never chosen. The predecessor's rate is the better prior (conditional
    rates of a DFlash drafter are nearly flat in the position)."""
    true = [0.9] * 7
    rng = random.Random(8)
    stats = AcceptanceStats(7, half_life=50.0, prior_rate=0.7, min_weight=4.0)
    for step in range(400):
        width = 7 if step % 100 == 99 else 6  # bs 1, a wider probe every 100 steps
        stats.observe(width, [sample_accept(rng, true, width)])
    assert stats.rates()[6] == pytest.approx(0.9, abs=0.05), stats.rates()
    assert stats.expected_commit(7) > stats.expected_commit(6) + 0.4
