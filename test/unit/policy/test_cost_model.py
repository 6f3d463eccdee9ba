"""CostModel: profile fit, online correction, buckets."""

import itertools
import json
import random
import time

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
# Cost model
# ---------------------------------------------------------------------------


def test_cost_model_fits_profile_and_separates_draft_term():
    model = CostModel.from_profile(profile())
    for bs in PROFILE_BS:
        for w in range(B):
            assert model.predict(bs, w) == pytest.approx(true_cost(bs, w), rel=1e-9)
    assert model.predict(48, 3) == pytest.approx((true_cost(32, 3) + true_cost(64, 3)) / 2)


@pytest.mark.parametrize("qs", [range(1, B + 1), (1, B), (1,), (2, 5)])
def test_cost_model_is_monotone_in_tokens(qs):
    model = CostModel.from_profile(profile(qs))
    for bs in list(range(1, 40)) + [100, 300, 512, 1000]:
        row = [model.predict(bs, w) for w in range(B + 4)]  # includes W beyond the profile
        assert all(x <= y + 1e-15 for x, y in itertools.pairwise(row)), (bs, row)
    for w in range(B):
        col = [model.predict(bs, w) for bs in range(1, 600, 7)]
        assert all(x <= y + 1e-15 for x, y in itertools.pairwise(col)), (w, col)
        assert all(c > 0 for c in col)


def test_cost_model_pads_batch_to_profiled_size():
    model = CostModel.from_profile(profile(), pad_batch=True)
    for w in range(B):
        assert model.predict(17, w) == pytest.approx(true_cost(32, w))  # a bs-32 graph replay
        assert model.predict(32, w) == pytest.approx(true_cost(32, w))
    assert model.predict(300, 0) > model.predict(256, 0)  # beyond the profile: extrapolated


def test_cost_model_total_token_extrapolation_from_plain_only_profile():
    samples = [(bs, 1, False, true_verify(bs, 1)) for bs in PROFILE_BS]
    samples += [(bs, 1, True, true_verify(bs, 1) + true_draft(bs)) for bs in PROFILE_BS]
    model = CostModel.from_profile(samples)
    assert model.predict(32, 3) == pytest.approx(true_cost(32, 3))  # 128 tokens = bs 128 at q 1


def test_online_correction_learns_uniformly_slower_device():
    model = CostModel.from_profile(profile())
    rng = random.Random(8)
    for _ in range(300):  # only batch sizes < 64 and widths <= 3 observed
        bs, w = rng.randint(1, 63), rng.randint(0, 3)
        model.observe(bs, w, 2.0 * true_cost(bs, w) * (1 + 0.05 * rng.uniform(-1, 1)))
    # Observed cells (a cell pools a power-of-two bucket of batch sizes, over
    # which the profile's interpolation error varies by up to ~12%).
    for bs, w in [(4, 0), (16, 2), (40, 3)]:
        assert model.predict(bs, w) == pytest.approx(2.0 * true_cost(bs, w), rel=0.1)
    # Unseen widths and batch sizes far beyond the observed ones (8x the profiled
    # cost): extrapolated by the nearest bucket's affine fit.
    for bs, w in [(40, 7), (200, 7), (100, 5)]:
        assert model.predict(bs, w) == pytest.approx(2.0 * true_cost(bs, w), rel=0.1)
    snap = json.loads(json.dumps(model.snapshot()))
    assert snap["buckets"]["bs33-64"]["scale"] > 1.5


def test_online_fit_separates_fixed_overhead_from_compute():
    """A server whose every step pays 20 ms the profile cannot see (scheduler,
    Python): observed only at full width, the model must not inflate the other
    widths by the same factor (that turned speculation off where it paid)."""
    model = CostModel.from_profile(profile())
    for _ in range(100):
        model.observe(4, 7, true_cost(4, 7) + 0.020)
    for w in range(B):
        assert model.predict(4, w) == pytest.approx(true_cost(4, w) + 0.020, rel=0.03), w
    assert model.snapshot()["buckets"]["bs3-4"]["overhead_ms"] == pytest.approx(20, rel=0.1)
    # With a fixed overhead, full width wins where a multiplicative fit would pick W = 0.
    rates = [0.5] * (B - 1)
    thr = [4 * e / model.predict(4, w) for w, e in enumerate(expected_commits(rates))]
    assert max(range(B), key=thr.__getitem__) > 0


def test_unobserved_larger_batch_borrows_the_overhead_per_request():
    """What the profile misses grows with the batch on a real server (the
    scheduler's per-request work, attention over each context): a W = 0 step
    of the CPU demo server took 20 / 34 / 81 ms at batch 16 / 32 / 64.
    Timed only around batch 30, the model must predict batch 64-250 with
    that overhead per request, not unscaled (42 ms predicted at batch 64
    turned speculation off where it was 1.4x ahead); below, it keeps F
    (erring high on W = 0 there errs toward speculation)."""
    per_request = 0.001

    def served(bs, w):
        return true_cost(bs, w) + per_request * bs

    model = CostModel.from_profile(profile())
    for bs in (28, 29, 30, 31, 32) * 20:
        for w in (0, 7):
            model.observe(bs, w, served(bs, w))
    for bs in (64, 100, 250):
        for w in (0, 7):
            assert model.predict(bs, w) == pytest.approx(served(bs, w), rel=0.1), (bs, w)
    assert model.predict(8, 0) >= served(8, 0) + 0.8 * per_request * (30 - 8)
    # The fit's weak prior at a new bucket starts from the same per-request F.
    model.observe(64, 0, served(64, 0))
    assert model.predict(64, 7) == pytest.approx(served(64, 7), rel=0.1)


def test_online_fit_stays_sane_with_a_bad_profile_and_outliers():
    """The start-up profile taken on a busy host (wide widths 5x too expensive),
    steps measured with a fixed overhead the profile does not see, and
    occasional 10x outliers (GC pauses, other processes): the fit must keep
    F >= 0 and predictions positive, and the policy must still find that full
    width pays (the grid once saw an unconstrained fit run away to F = -75 ms
    and turn speculation off where it doubled throughput)."""
    bad = [(bs, q, False, true_verify(bs, q) * (5.0 if q > 2 else 1.0)) for bs in PROFILE_BS
           for q in range(1, B + 1)]
    bad += [(bs, B, True, 5.0 * true_cost(bs, B - 1)) for bs in PROFILE_BS]
    policy = SpeculationPolicy.from_profile(PolicyConfig(probe_interval=10), B, bad)
    rng = random.Random(11)
    rates = [0.9] * (B - 1)

    def real(bs, w):  # 15 ms per step outside the profile's view
        return 0.015 + true_cost(bs, w)

    for step in range(1500):
        w = policy.choose_width(1)
        seconds = real(1, w) * (10.0 if step % 97 == 0 else 1 + 0.1 * rng.uniform(-1, 1))
        lens = [sample_accept(rng, rates, w)] if w else [0]
        policy.observe_verify(w, lens, None, 1)
        policy.observe_step_time(w, seconds, 1)
        f, scale = policy.cost.params(1)
        assert f >= 0 and scale > 0
    best = best_width_bruteforce(rates, real, 1, B - 1)
    assert best == B - 1
    assert policy.width >= B - 2, policy.snapshot()
    assert policy.spec_steps / policy.steps > 0.9


def test_profile_spikes_do_not_inflate_other_widths():
    """One profile sample 10x too slow (the host was busy for that shape) must
    not make every wider width look expensive: the monotone envelope is taken
    from the right, so the spike is replaced by a larger knot's value."""
    samples = profile()
    spiked = [(bs, q, d, sec * (10.0 if (bs, q, d) == (1, 3, False) else 1.0))
              for bs, q, d, sec in samples]
    model = CostModel.from_profile(spiked)
    for w in range(B):
        assert model.predict(1, w) == pytest.approx(true_cost(1, w), rel=1e-9), w
        assert model.predict(4, w) == pytest.approx(true_cost(4, w), rel=1e-9), w


def test_observed_width_is_learned_from_few_steps():
    """A width seen only in a few probe steps is predicted close to what was measured."""
    model = CostModel.from_profile(profile())
    for _ in range(3):
        model.observe(1, 7, 3.0 * true_cost(1, 7))
    assert model.predict(1, 7) == pytest.approx(3.0 * true_cost(1, 7), rel=0.25)


def test_rarely_measured_width_follows_a_change():
    """Seen in the serving grid: a full-width cell measured while another process
    loaded the host stayed 2x too expensive while the server ran off (the width
    is then measured only by probes, one step in ~100): at a fixed ema it would
    take ~40 probes to recover. Aged by the steps since its last sample, a
    rarely measured cell follows the change within a few probes, while a width
    measured every step keeps its ema window."""
    model = CostModel.from_profile(profile())
    bs, wide = 16, B - 1

    def stretch(wide_cost, probes):
        for _ in range(probes):
            for _ in range(99):
                model.observe(bs, 0, true_cost(bs, 0))
            model.observe(bs, wide, wide_cost)

    stretch(2.0 * true_cost(bs, wide), 30)  # a disturbed stretch: converged on 2x
    assert model.predict(bs, wide) == pytest.approx(2.0 * true_cost(bs, wide), rel=0.1)
    stretch(true_cost(bs, wide), 5)  # the host is quiet again: five probes
    assert model.predict(bs, wide) == pytest.approx(true_cost(bs, wide), rel=0.25)
    # An every-step width still averages over ~1/ema steps: one 2x step moves it < 10%.
    model.observe(bs, 0, 2.0 * true_cost(bs, 0))
    assert model.predict(bs, 0) == pytest.approx(true_cost(bs, 0), rel=0.1)


def test_no_flapping_when_the_profile_is_far_off():
    """Seen in the serving grid: a profile taken while other servers started
    made W = 0 look 3-4x cheaper than it is; the policy flapped between 0 and
    7 (410 switches in 1500 steps). Measured cells must override the profile
    and the width must settle on full speculation."""
    bad = [(bs, q, False, true_verify(bs, q) * (0.25 if q == 1 else 4.0)) for bs in PROFILE_BS
           for q in range(1, B + 1)]
    bad += [(bs, B, True, 4.0 * true_cost(bs, B - 1)) for bs in PROFILE_BS]
    policy = SpeculationPolicy.from_profile(PolicyConfig(), B, bad)
    rng = random.Random(12)
    rates = [0.9] * (B - 1)

    def real(bs, w):  # a CPU server: 8 ms plain step, 17 ms full-width step at bs 1
        return 0.008 + (0.005 + 0.004 * w / (B - 1) if w else 0.0)

    assert best_width_bruteforce(rates, real, 1, B - 1) == B - 1
    for _ in range(1500):
        w = policy.choose_width(1)
        policy.observe_verify(w, [sample_accept(rng, rates, w)] if w else [0], None, 1)
        policy.observe_step_time(w, real(1, w) * (1 + 0.1 * rng.uniform(-1, 1)), 1)
    assert policy.switches <= 4, policy.snapshot()
    assert policy.width == B - 1
    assert policy.spec_steps / policy.steps > 0.95


@pytest.mark.parametrize("seed", range(6))
def test_noisy_steps_do_not_pick_a_narrower_width_of_the_same_cost(seed):
    """Seen in the served grid at concurrency 1: on a CPU server every W > 0 step at batch 1 costs
    the same (the target's forward is flat in tokens there), yet some launches
    ran W = 6 or 5 on up to 40% of the steps. Each (bucket, W) cell learned
    from its own few probe samples, and one lucky cheap probe at W = 6 made it
    look 5% cheaper than W = 7 (the winner's curse among equal-cost widths);
    once there, W = 7's gain of about one accepted token in a hundred stayed
    below the switch margin. Widths whose costs differ only by noise must
    share what was measured, so the widest keeps winning on acceptance."""
    rates = [0.9] * (B - 1)
    assert len({round(true_cost(1, w), 12) for w in range(1, B)}) == 1  # equal cost by design
    policy = make_policy()
    executed = run(policy, rates, 1, 3000, random.Random(seed), noise=0.3)
    assert executed[500:].count(B - 1) / len(executed[500:]) > 0.99, policy.snapshot()


def test_online_correction_clips_outliers():
    model = CostModel.from_profile(profile(), ema=1.0, outlier_ratio=3.0)
    model.observe(8, 0, 1000.0 * true_cost(8, 0))  # e.g. a step that hit a GC pause
    assert 1.0 < model.correction(8, 0) <= 9.0 + 1e-9  # outlier_ratio**2 before a cell has data
    for _ in range(5):
        model.observe(8, 0, true_cost(8, 0))
    model.observe(8, 0, 1000.0 * true_cost(8, 0))  # ... then outlier_ratio of the cell's estimate
    assert model.correction(8, 0) <= 3.0 + 1e-9


def test_cost_profile_validation():
    with pytest.raises(ValueError, match="undrafted and one drafted"):
        CostModel.from_profile([(1, 1, False, 0.01)])
    with pytest.raises(ValueError, match="sample 0"):
        CostModel.from_profile([(0, 1, False, 0.01)])
    with pytest.raises(ValueError, match="sample 1"):
        CostModel.from_profile([(1, 1, False, 0.01), (1, 2, True)])
    with pytest.raises(ValueError, match="step_seconds"):
        CostModel.from_profile(profile()).observe(1, 0, -1.0)


def test_speculation_only_overhead_is_not_charged_to_plain_decoding():
    """A loaded GPU: every W > 0 step pays 30 ms the profile cannot see (draft
    launch, verify bookkeeping) that a plain step does not. Timed mostly at
    full width, with three early W = 0 steps and a rare neighbour probe, the
    model must predict W = 0 as measured and the unrun widths with the
    overhead, not spread it over W = 0 (plain decoding looked ~1.4x dearer
    than measured) or into the scale (wide widths overcharged)."""
    extra = 0.030

    def served(bs, w):
        return true_cost(bs, w) + (extra if w > 0 else 0.0)

    model = CostModel.from_profile(profile())
    bs = 4
    for _ in range(16):
        model.observe(bs, 7, served(bs, 7))
    for _ in range(3):
        model.observe(bs, 0, served(bs, 0))
    for step in range(2000):  # a long stretch on: W = 0 is not timed again
        w = 6 if step % 200 == 0 else 7
        model.observe(bs, w, served(bs, w))
    for w in range(B):
        assert model.predict(bs, w) == pytest.approx(served(bs, w), rel=0.03), w
    assert model.spec_overhead(bs) == pytest.approx(extra, rel=0.05)
    assert model.snapshot()["buckets"]["bs3-4"]["spec_overhead_ms"] == pytest.approx(30, rel=0.05)


def test_speculation_only_overhead_carries_to_an_unobserved_bucket():
    """A batch-size bucket timed only at W = 0 (the policy is off there) takes
    G from the nearest bucket that measured it, so the W > 0 widths there are
    not predicted at their profiled cost plus W = 0's overhead alone."""
    extra = 0.030

    def served(bs, w):
        return true_cost(bs, w) + (extra if w > 0 else 0.0)

    model = CostModel.from_profile(profile())
    for _ in range(50):
        for w in (0, 7):
            model.observe(4, w, served(4, w))
    for _ in range(50):
        model.observe(16, 0, served(16, 0))
    for w in (0, 3, 7):
        assert model.predict(16, w) == pytest.approx(served(16, w), rel=0.05), w


def test_a_refresh_lets_the_new_off_samples_decide_the_fit_too():
    """`forget` caps the fit's steps of the refreshed class as it caps the
    cell: three new W = 0 samples of another load move the W = 0 intercept
    (what neighbours borrow) most of the way, not 3 / 80 of it."""
    model = CostModel.from_profile(profile())
    for _ in range(200):
        for w in (0, 7):
            model.observe(8, w, 0.02 + true_cost(8, w) * (1.5 if w == 0 else 1.0))
    f_old, _ = model.params(8)
    model.forget(8, 0, 1.0)
    for _ in range(3):
        model.observe(8, 0, 0.02 + true_cost(8, 0))
    f_new, scale = model.params(8)
    moved = (f_old - f_new) / (f_old - (0.02 + true_cost(8, 0) * (1 - scale)))
    assert moved > 0.6, (f_old, f_new)
