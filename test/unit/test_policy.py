"""Speculation policy: synthetic acceptance and step cost, no SGLang, no torch.

The simulator draws accept lengths from true per-position conditional rates and
step times from a true cost (target verify: flat until 64 tokens, then linear
in total tokens, i.e. memory- then compute-bound; drafter: affine in bs) with
optional multiplicative noise, and feeds them back exactly as the worker does.
"""

import itertools
import json
import math
import random
import time

import pytest
from sglang_dflash.cost_model import CostModel, bucket_of, bucket_range
from sglang_dflash.policy import (
    AcceptanceStats,
    PolicyConfig,
    SpeculationPolicy,
    best_width_bruteforce,
    expected_commits,
)

B = 8
PROFILE_BS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def true_verify(bs, q):
    return 0.010 + 0.0002 * max(0, bs * q - 64)


def true_draft(bs):
    return 0.002 + 0.00005 * bs


def true_cost(bs, w):
    return true_verify(bs, w + 1) + (true_draft(bs) if w > 0 else 0.0)


def profile(qs=range(1, B + 1), scale=1.0):
    samples = [(bs, q, False, scale * true_verify(bs, q)) for bs in PROFILE_BS for q in qs]
    samples += [(bs, B, True, scale * true_cost(bs, B - 1)) for bs in PROFILE_BS]
    return samples


def true_thr(rates, bs, w):
    return bs * expected_commits(rates[:w])[-1] / true_cost(bs, w)


def make_policy(**overrides):
    return SpeculationPolicy.from_profile(PolicyConfig(**overrides), B, profile())


def sample_accept(rng, rates, width):
    a = 0
    while a < width and rng.random() < rates[a]:
        a += 1
    return a


def run(policy, rates, bs, steps, rng, noise=0.0):
    """Simulate `steps` decode steps, fed back as the worker does (step index,
    period); returns the executed widths."""
    executed = []
    for _ in range(steps):
        w = policy.choose_width(bs)
        step = policy.steps - 1
        seconds = true_cost(bs, w) * (1.0 + noise * rng.uniform(-1.0, 1.0))
        if w == 0:
            policy.observe_plain(seconds, bs, step)
        else:
            lens = [sample_accept(rng, rates, w) for _ in range(bs)]
            policy.observe_verify(w, lens, seconds, bs, step=step)
        policy.observe_period(seconds)
        executed.append(w)
    return executed


def uniform_rate_for_ratio(bs, on_over_off, cost=true_cost):
    """Uniform a_j at which the best W > 0 runs at `on_over_off` x plain decode's throughput."""
    def thr(rates, w):
        return bs * expected_commits(rates[:w])[-1] / cost(bs, w)

    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        best_on = max(thr([a] * (B - 1), w) for w in range(1, B))
        lo, hi = (a, hi) if best_on < on_over_off * thr([a] * (B - 1), 0) else (lo, a)
    return (lo + hi) / 2


def uniform_rate_at_threshold(bs, spec_margin=0.0):
    """Uniform a_j such that the best W > 0 ties with plain decode at this bs
    (with `spec_margin`: beats it by exactly that fraction)."""
    return uniform_rate_for_ratio(bs, 1.0 + spec_margin)


# ---------------------------------------------------------------------------
# Decision
# ---------------------------------------------------------------------------


def test_turns_off_under_load_and_back_on_when_load_drops():
    rng = random.Random(0)
    policy = make_policy(probe_interval=20)
    run(policy, [0.8] * 7, 2, 200, rng)
    assert policy.width == best_width_bruteforce([0.8] * 7, true_cost, 2, B - 1) == 7
    # High load, low acceptance: every W > 0 costs more than it commits.
    assert best_width_bruteforce([0.4] * 7, true_cost, 128, B - 1) == 0
    first = run(policy, [0.4] * 7, 128, 1, rng)
    assert first == [0] and policy.width == 0  # a >30% predicted gain switches at once (no patience wait)
    executed = first + run(policy, [0.4] * 7, 128, 299, rng)
    assert policy.width == 0
    assert sum(w > 0 for w in executed[50:]) <= len(executed[50:]) / 20 + 1  # probes only
    run(policy, [0.8] * 7, 4, 100, rng)
    assert policy.width > 0


def test_probes_while_off_and_turns_back_on_when_acceptance_improves():
    rng = random.Random(1)
    bs, interval = 16, 25
    # probe_share None: every probe on the interval, however costly (see the share test).
    policy = make_policy(probe_interval=interval, probe_width=2, probe_backoff=1, probe_share=None)
    executed = run(policy, [0.1] * 7, bs, 400, rng)
    assert policy.width == 0
    probes = [i for i, w in enumerate(executed[100:]) if w > 0]
    probed = [executed[100 + i] for i in probes]
    assert probes and set(probed) == {2, B - 1}  # alternately probe_width and the widest
    assert all(a != b for a, b in itertools.pairwise(probed))
    assert len(probes) == pytest.approx(300 / interval, abs=2)
    assert best_width_bruteforce([0.9] * 7, true_cost, bs, B - 1) > 0
    executed = run(policy, [0.9] * 7, bs, 3 * interval + 10, rng)
    assert policy.width > 0
    assert executed[-1] > 0


@pytest.mark.parametrize("share", [0.02, None])
def test_costly_probes_take_a_bounded_share_of_the_time(share):
    """Off at bs 64 a probe at the widest width costs ~10 plain steps per step:
    on the plain interval (50 x backoff 4, two steps a probe as under the
    overlap scheduler) probes took ~6% of the time; with `probe_share` each
    waits until its extra time is at most that share of the time since the
    last probe. Both probe widths still run."""
    rng = random.Random(4)
    bs, rates = 64, [0.3] * 7
    policy = make_policy(probe_share=share, probe_length=2, trial_steps=0)
    executed = run(policy, rates, bs, 6000, rng)
    assert policy.width == 0
    tail = executed[1000:]
    extra = sum(true_cost(bs, w) - true_cost(bs, 0) for w in tail)
    total = sum(true_cost(bs, w) for w in tail)
    assert {w for w in tail if w > 0} == {2, B - 1}
    if share is None:
        assert extra / total > 0.045  # the test can tell
    else:
        assert extra / total <= 1.25 * share


def test_probes_while_on_include_the_off_cost():
    """While on, every 4th probe runs W = 0 so the off cost is measured, the
    others a neighbouring width; the decided width does not move."""
    rng = random.Random(13)
    policy = make_policy(probe_interval=10)
    executed = run(policy, [0.9] * 7, 1, 800, rng)
    assert policy.width == B - 1
    probes = [w for w in executed[10:] if w != B - 1]
    assert probes.count(0) == pytest.approx(len(probes) / 4, abs=1)
    assert set(probes) == {0, B - 2}


def test_probes_last_probe_length_steps():
    """probe_length = 2 (what the worker uses under SGLang's overlap scheduler,
    where only a probe's second step is timed cleanly): every probe is a run of
    exactly two steps at the probe width, still one probe per interval."""
    rng = random.Random(13)
    policy = make_policy(probe_interval=10, probe_length=2, probe_backoff=1)
    executed = run(policy, [0.9] * 7, 1, 800, rng)
    assert policy.width == B - 1
    runs = [(w, len(list(g))) for w, g in itertools.groupby(executed)][:-1]  # last may be cut
    probe_runs = [(w, n) for w, n in runs if w != B - 1]
    # The first is the early off probe of a bucket never measured off: 2 steps longer.
    assert probe_runs[0] == (0, 4)
    probe_runs = probe_runs[1:]
    assert probe_runs and all(n == 2 for _, n in probe_runs), probe_runs
    assert {w for w, _ in probe_runs} == {0, B - 2}
    assert len(probe_runs) == pytest.approx(800 / 11, rel=0.1)  # 9 decided steps + 2 probe steps
    with pytest.raises(ValueError, match="probe_length"):
        make_policy(probe_length=0)


def probe_starts(executed, decided):
    """Indices where a run of steps at a width other than `decided` begins."""
    return [i for i, w in enumerate(executed) if w != decided and (i == 0 or executed[i - 1] == decided)]


def test_probe_interval_backs_off_while_nothing_changes_and_resets_on_a_new_load():
    """Probes cost throughput (at c1 a W = 0 probe commits 1 token where W = 7
    commits ~6), so while the decision holds the interval doubles after each
    probe up to probe_backoff x probe_interval; a switch, or the batch settling
    in another batch-size bucket, brings the base interval back. One-step dips
    of the batch size (a finished request being replaced) do not."""
    rng = random.Random(5)
    policy = make_policy(probe_interval=10, probe_backoff=4)
    executed = run(policy, [0.9] * 7, 1, 400, rng)
    assert policy.width == B - 1
    gaps = [b - a for a, b in itertools.pairwise(probe_starts(executed, B - 1))]
    assert gaps[-3:] == [40, 40, 40], gaps  # capped at 4 x 10 (1 step of each probe counted)
    assert gaps.index(40) <= 4 and min(gaps[1:]) < 40, gaps  # grew from the base interval
    assert policy.snapshot()["probe_interval"] == 40

    # One-step dips to bs 2 (bucket 2) keep the backed-off interval.
    for _ in range(5):
        run(policy, [0.9] * 7, 2, 1, rng)
        run(policy, [0.9] * 7, 1, 30, rng)
    assert policy.probe_interval == 40

    # A new load settles in another bucket: back to the base interval at once...
    run(policy, [0.9] * 7, 8, 5, rng)
    assert policy.probe_interval in (10, 20)
    # ... and so does a switch: speculation off when acceptance collapses.
    run(policy, [0.9] * 7, 8, 100, rng)
    assert policy.width == B - 1 and policy.probe_interval == 40
    for _ in range(300):
        run(policy, [0.1] * 7, 8, 1, rng)
        if policy.width == 0:
            break
    assert policy.width == 0 and policy.probe_interval == 10
    # Off and backed off to 40 steps: when acceptance recovers, the probes
    # still turn it back on within a few backed-off intervals.
    run(policy, [0.1] * 7, 8, 300, rng)
    assert policy.width == 0 and policy.probe_interval == 40
    assert best_width_bruteforce([0.9] * 7, true_cost, 8, B - 1) > 0
    executed = run(policy, [0.9] * 7, 8, 3 * 40 + 10, rng)
    assert policy.width > 0 and executed[-1] > 0


def test_probe_backoff_is_validated():
    with pytest.raises(ValueError, match="probe_backoff"):
        make_policy(probe_backoff=0)


def test_off_cost_is_measured_early_in_a_new_batch_bucket():
    """Seen in the serving grid (chat, c32): on at bs 32, the off cost of that
    batch-size bucket was never timed (W = 0 probes come every 4th probe, ~200
    steps), so W = 0 was predicted by the bucket's affine fit of wide steps,
    which charges it the wide steps' unexplained time (here: the real server's
    compute grows 2x faster with tokens than the profile's). Speculation stayed
    on where it lost ~20%. An early off probe in a new bucket measures it."""
    policy = make_policy()  # probe_interval 50

    def real(bs, w):
        return 0.004 + 2.0 * true_cost(bs, w)

    rates = [0.45] * (B - 1)
    rng = random.Random(5)
    for bs in (1, 40):
        for _ in range(60):
            w = policy.choose_width(bs)
            lens = [sample_accept(rng, rates, w) for _ in range(bs)] if w else [0] * bs
            policy.observe_verify(w, lens, real(bs, w), bs)
        if bs == 1:
            assert best_width_bruteforce(rates, real, 1, B - 1) > 0 and policy.width > 0
    assert best_width_bruteforce(rates, real, 40, B - 1) == 0
    assert policy.width == 0, policy.snapshot()
    # Bounded: only a few early probes per bucket, then the ordinary interval.
    # (No on/off trials here: a trial would run W = 0 for its own reasons.)
    on = SpeculationPolicy.from_profile(PolicyConfig(trial_steps=0), B, profile())
    widths = []
    for _ in range(200):
        w = on.choose_width(40)
        widths.append(w)
        on.observe_verify(w, [w] * 40, None, 40)  # never timed: the cell stays unmeasured
    assert widths.count(0) == 3 * 3  # three early probes of 3 steps, then none (interval 50)


def _cpu_server_cost(bs, w):
    """A CPU server's step (the demo pair on an Intel host, code c64's traces):
    plain ~26 ms at bs 64, the full width ~2.8x that."""
    plain = 0.001 + 0.0004 * bs
    return plain + (0.003 + 0.0007 * bs * (0.5 + 0.5 * w / (B - 1)) if w else 0.0)


def _profile_overstating_the_drafter():
    """The verify curves as `profile()`, the drafter at 2 ms per request: seen
    in a served trace, a profile put the demo drafter at 80-130 ms for bs
    16-64 (a float16 server; 7-27 ms in float32)."""
    samples = [(bs, q, False, true_verify(bs, q)) for bs in PROFILE_BS for q in range(1, B + 1)]
    return samples + [(bs, B, True, true_verify(bs, B) + 0.002 * bs) for bs in PROFILE_BS]


@pytest.mark.parametrize("probe", [True, False])
def test_on_cost_is_measured_early_in_a_new_batch_bucket(probe, monkeypatch):
    """Off in a batch-size bucket where no W > 0 step was ever timed, W > 0 is
    predicted from the profile, and the periodic probes there wait in
    proportion to that prediction (probe_share); a profile that overstates
    speculation kept it off for good (served code c64: W = 7 predicted at ~9x
    a plain step, always-on measured ~2.9x, 1.4x off's tokens per second in
    decode steps). An early on probe in the bucket measures it; bounded like
    the early off probe. `probe=False` removes that probe: the same run stays
    off (the test can tell)."""
    import sglang_dflash.policy as policy_module

    if not probe:
        monkeypatch.setattr(policy_module, "_EARLY_ON_PROBES", 0)
    rates = [0.85] * (B - 1)
    assert best_width_bruteforce(rates, _cpu_server_cost, 64, B - 1) == B - 1
    policy = SpeculationPolicy.from_profile(PolicyConfig(probe_length=2), B,
                                            _profile_overstating_the_drafter())
    rng = random.Random(7)
    executed = {}
    for bs, steps in ((1, 30), (4, 30), (64, 300)):  # a closed-loop ramp, then the full batch
        executed[bs] = []
        for _ in range(steps):
            w = policy.choose_width(bs)
            lens = [sample_accept(rng, rates, w) for _ in range(bs)] if w else [0] * bs
            policy.observe_verify(w, lens, _cpu_server_cost(bs, w), bs)
            executed[bs].append(w)
    at_64 = executed[64]
    assert at_64[:2] == [0, 0]  # the profile's call at first: off
    if probe:
        assert policy.width > 0, policy.snapshot()
        assert sum(w > 0 for w in at_64[100:]) >= 0.9 * len(at_64[100:])
    else:
        assert policy.width == 0 and sum(w > 0 for w in at_64) == 0

    # Bounded: a bucket whose W > 0 steps are never timed gets a few early probes only.
    off = SpeculationPolicy.from_profile(PolicyConfig(mode="adaptive", trial_steps=0), B,
                                         _profile_overstating_the_drafter())
    widths = []
    for step in range(400):
        w = off.choose_width(64)
        widths.append(w)
        off.observe_verify(w, [0] * 64, None if w else 0.026, 64)  # W > 0 never timed
    first_off = widths.index(0)  # the cold start holds the widest width until a step is timed
    expected = 3 * 3 if probe else 0  # three early probes of 3 steps, then none until...
    assert sum(w > 0 for w in widths[first_off:300]) == expected, widths
    assert any(widths[300:])  # ... the periodic probe, held back by its predicted cost


@pytest.mark.parametrize("steady, dip", [(4, 3), (5, 4)])
def test_no_early_off_probe_in_one_step_batch_dips(steady, dip):
    """A closed-loop load dips one request below its batch for one step whenever
    a request finishes and its replacement is prefilled. Those dips must not
    count as a new bucket worth an early off probe (seen in a serving trace:
    three 4-step probes, ~10% of the cell's steps, off in the bucket below).
    A load at a power of two (4) and its dip (3) share a bucket (`bucket_of`);
    one just above (5) dips across the bucket's lower edge (4)."""
    policy = SpeculationPolicy.from_profile(PolicyConfig(probe_length=2), B, profile())
    dips = []
    for step in range(160):
        bs = dip if step % 16 == 15 else steady
        w = policy.choose_width(bs)
        if bs == dip:
            dips.append(w)
        policy.observe_verify(w, [min(w, 5)] * bs if w else [0] * bs, 0.02 if w else 0.01, bs)
    assert policy.cost.observed(steady, 0)  # the steady bucket's off cost was measured early
    assert 0 not in dips, dips
    assert policy.cost.observed(dip, 0) == (bucket_of(dip) == bucket_of(steady))


def test_buckets_end_at_powers_of_two():
    assert [bucket_of(bs) for bs in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 63, 64, 65)] == \
        [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 7]
    for b in range(10):
        lo, hi = bucket_range(b)
        assert bucket_of(lo) == bucket_of(hi) == b and bucket_of(hi + 1) == b + 1


@pytest.mark.parametrize("refresh", [True, False])
def test_stale_off_estimate_is_remeasured_when_the_decision_is_close(refresh, monkeypatch):
    """Seen in the serving grid (chat, c32, late in a long-running server): the
    off cost of bs 16-31 came from a few samples taken long before, so
    speculation, predicted ~20% ahead, stayed on although off was ~6% faster.
    Here: on wins clearly at first, and its early off probe is timed in a
    disturbed moment (1.6x); then acceptance drops so that off is 15% faster.
    A stale off estimate is re-measured while the decision is close; without
    that (the control case) the old samples keep it on until the ordinary
    probes (every 4th runs W = 0) come around."""
    import sglang_dflash.policy as policy_module
    if not refresh:
        monkeypatch.setattr(policy_module, "_REFRESH_CLOSE", -1.0)  # never close: no refresh

    def real(bs, w):  # a CPU server's per-step overhead, which the profile misses
        return 0.02 + true_cost(bs, w)

    bs = 40
    high, low = uniform_rate_for_ratio(bs, 1.5, real), uniform_rate_for_ratio(bs, 0.87, real)
    # An on/off trial would re-measure W = 0 too; probes on the plain interval
    # (probe_share None) keep the control's ordinary W = 0 probe where it was.
    policy = make_policy(trial_steps=0, probe_share=None)
    rng = random.Random(3)
    executed = []
    for step in range(700):
        rates = [high if step < 150 else low] * (B - 1)
        w = policy.choose_width(bs)
        seconds = real(bs, w) * (1.6 if step < 150 and w == 0 else 1.0)
        lens = [sample_accept(rng, rates, w) for _ in range(bs)] if w else [0] * bs
        policy.observe_verify(w, lens, seconds, bs)
        executed.append(w)
    assert best_width_bruteforce([low] * (B - 1), real, bs, B - 1) == 0
    assert 0 not in executed[100:150]  # on while it wins
    if refresh:
        assert policy.width == 0 and executed[-80:].count(0) > 70, policy.snapshot()
    else:
        assert policy.width > 0 and executed[-80:].count(0) < 10, policy.snapshot()


@pytest.mark.parametrize("refresh", [True, False])
def test_off_estimate_from_another_load_is_remeasured(refresh, monkeypatch):
    """Seen in the serving grid (code c16 right after code c64): W = 0 in the
    bs 16-31 bucket was last timed during the previous load's drain, where long
    contexts made every step dearer; those samples were recent, so not stale,
    and speculation ran on ~11% ahead by the model while the off server was
    ahead. Here: an off load (phase A) whose W = 0 steps cost 1.3x, a burst at
    another batch size (B), then a load in A's bucket (C) where off is truly
    ~8% faster but A's W = 0 estimate makes speculation look ahead. The new
    load's first close call re-measures W = 0 and goes off; the control
    (refreshes disabled) stays on."""
    import sglang_dflash.policy as policy_module
    if not refresh:
        monkeypatch.setattr(policy_module, "_REFRESH_CLOSE", -1.0)

    def real(bs, w, inflated=False):
        return (0.02 + true_cost(bs, w)) * (1.3 if inflated and w == 0 else 1.0)

    bs = 40
    low = uniform_rate_for_ratio(bs, 0.5, real)
    close = uniform_rate_for_ratio(bs, 0.92, real)
    # Close by the true cost, ~15% ahead by the inflated W = 0 estimate.
    assert close < uniform_rate_for_ratio(bs, 1.2, lambda b, w: real(b, w, True))
    policy = make_policy(trial_steps=0, probe_share=None)
    rng = random.Random(11)
    phases = [(bs, low, True, 300), (4, 0.9, False, 60), (bs, close, False, 150)]
    executed = []
    for batch, rate, inflated, steps in phases:
        for _ in range(steps):
            w = policy.choose_width(batch)
            lens = [sample_accept(rng, [rate] * (B - 1), w) for _ in range(batch)] if w else [0] * batch
            policy.observe_verify(w, lens, real(batch, w, inflated), batch)
            executed.append((batch, w))
    c = [w for _, w in executed[360:]]
    assert [w for _, w in executed[200:300]].count(0) > 90  # A: off
    assert [w for _, w in executed[320:360]].count(0) < 10  # B: on
    assert best_width_bruteforce([close] * (B - 1), real, bs, B - 1) == 0
    assert c[0] > 0  # C starts on (the width from B, A's estimate)
    if refresh:
        assert policy.width == 0 and c.index(0) < 30 and c[-100:].count(0) > 90, c
    else:
        assert policy.width > 0 and c[-100:].count(0) < 10, c


def test_no_off_refresh_while_speculation_wins_clearly():
    """Refresh probes are for close decisions only: where speculation is
    predicted far ahead, W = 0 runs only in the ordinary probes."""
    bs = 8
    rates = [uniform_rate_for_ratio(bs, 1.6)] * (B - 1)
    policy = make_policy()
    executed = run(policy, rates, bs, 1500, random.Random(4))
    assert policy.width > 0
    assert executed.count(0) <= 3 + 2  # the early off probe, then every 4th ordinary probe


def test_cold_start_holds_the_widest_width_until_a_step_is_timed():
    """The start-up profile times the model's forwards, not the CPU server's
    per-step scheduler work (~10 ms here): by the profile alone, off beats W = 7
    5x at prior acceptance, and a server switched off on its second step and
    stayed off for a probe interval. Held until the first timed step (the
    overlap scheduler times the third), the measured overhead keeps it on."""
    samples = [(bs, q, False, 0.0005 * bs * q) for bs in (1, 4) for q in (1, 8)]
    samples += [(bs, 8, True, 0.008 * bs) for bs in (1, 4)]
    policy = SpeculationPolicy.from_profile(PolicyConfig(probe_length=2), B, samples)

    def real(w):
        return 0.010 + (0.008 if w else 0.0005)

    rng = random.Random(9)
    decided = []
    for step in range(30):
        w = policy.choose_width(1)
        decided.append(policy.width)
        lens = [sample_accept(rng, [0.9] * (B - 1), w)] if w else [0]
        policy.observe_verify(w, lens, real(w) if step >= 2 else None, 1)
    assert 0 not in decided, decided


@pytest.mark.parametrize("spec_margin", [0.0, 0.1])
def test_no_flapping_at_threshold_with_noise(spec_margin):
    # The decision threshold: where the best W > 0 beats off by exactly spec_margin.
    bs = 32
    a = uniform_rate_at_threshold(bs, spec_margin)
    rates = [a] * (B - 1)
    best_on = max(true_thr(rates, bs, w) for w in range(1, B))
    assert best_on == pytest.approx((1 + spec_margin) * true_thr(rates, bs, 0), rel=1e-6)
    rng = random.Random(2)
    # probe_share None: every probe on the interval, in both (flapping follows probes).
    policy = make_policy(spec_margin=spec_margin, probe_share=None)
    run(policy, rates, bs, 2000, rng, noise=0.05)
    # Without hysteresis, and without regime trials (whose flap trials would
    # measure the tie and damp the flapping: trials.py).
    naive = make_policy(spec_margin=spec_margin, switch_margin=0.0, urgent_margin=0.0,
                        switch_patience=1, probe_share=None, trial_steps=0)
    run(naive, rates, bs, 2000, random.Random(2), noise=0.05)
    assert policy.switches <= 6, policy.snapshot()
    assert naive.switches > 3 * max(policy.switches, 1)  # the test would catch flapping


@pytest.mark.parametrize("gain,expect_on", [(0.05, False), (0.20, True)])
def test_spec_margin_keeps_off_unless_speculation_gains_more(gain, expect_on):
    # Rates at which the best W > 0 beats plain decoding by `gain` (true costs):
    # with a 10% margin a 5% gain stays off, a 20% gain turns on;
    # with no margin both turn on.
    bs = 32
    rates = [uniform_rate_at_threshold(bs, gain)] * (B - 1)
    for margin, on in ((0.1, expect_on), (0.0, True)):
        policy = make_policy(spec_margin=margin, probe_interval=10, acceptance_half_life=400.0,
                             probe_share=None)  # every 10 steps, also the widest
        run(policy, rates, bs, 800, random.Random(6))
        assert (policy.width > 0) == on, (margin, gain, policy.snapshot())


def test_load_window_judges_off_at_the_recent_peak_batch():
    # The batch dips to 20 between refills to 32 (as speculating makes it do
    # under a fixed number of clients). At bs 20 speculating (a = 0.33) beats
    # plain decoding by ~10%; plain decoding at the refilled bs 32 beats it by
    # far more. Judged at the current batch the policy speculates; with
    # load_window it turns off.
    rates = [0.33] * (B - 1)
    assert max(true_thr(rates, 20, w) for w in range(1, B)) > 1.05 * true_thr(rates, 20, 0)
    assert true_thr(rates, 32, 0) > 1.2 * max(true_thr(rates, 20, w) for w in range(1, B))
    pattern = [32, 20, 20, 20]
    for window, off in ((0, False), (16, True)):
        policy = make_policy(load_window=window, spec_margin=0.0, probe_interval=10,
                             acceptance_half_life=400.0)
        rng = random.Random(7)
        for step in range(400):
            run(policy, rates, pattern[step % 4], 1, rng)
        assert (policy.width == 0) == off, (window, policy.snapshot())


def test_no_flapping_when_batch_size_straddles_threshold():
    rates = [0.6] * 7
    crossing = next(bs for bs in range(1, 200)
                    if best_width_bruteforce(rates, true_cost, bs, B - 1) == 0)
    rng = random.Random(3)
    policy = make_policy()
    for step in range(1000):
        run(policy, rates, crossing - 1 + step % 2, 1, rng, noise=0.05)
    assert policy.switches <= 4


def decaying(a):
    return [a * 0.93**j for j in range(B - 1)]


@pytest.mark.parametrize("bs,rates", [
    (1, decaying(0.9)),  # optimum 7
    (16, decaying(0.95)),  # 3
    (12, decaying(0.8)),  # 4: the cold start picks 3; probes must find 4
    (24, [0.6] * 7),  # 2
    (32, [0.9] * 7),  # 1
    (64, [0.7, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1]),  # 0
    (2, [0.2] * 7),  # 7 at low acceptance: verify is free below 64 tokens
])
def test_converges_to_bruteforce_optimum(bs, rates):
    best = best_width_bruteforce(rates, true_cost, bs, B - 1)
    # Exact: no hysteresis, and no on/off trials (their measured bias carries a
    # few % of sampling noise, which may flip a 3% call; the model is exact here).
    exact = make_policy(spec_margin=0.0, switch_margin=0.0, urgent_margin=0.0, switch_patience=1,
                        probe_interval=10, acceptance_half_life=400.0, trial_steps=0)
    run(exact, rates, bs, 600, random.Random(4))
    assert exact.width == best
    # Default hysteresis: may rest on a width within the 5% switch margin.
    default = make_policy(probe_interval=10)
    run(default, rates, bs, 800, random.Random(5))
    assert true_thr(rates, bs, default.width) >= true_thr(rates, bs, best) / 1.05
    # A spec margin may also rest off where speculating gains less than it.
    margin = make_policy(probe_interval=10, spec_margin=0.1)
    run(margin, rates, bs, 800, random.Random(5))
    assert true_thr(rates, bs, margin.width) >= true_thr(rates, bs, best) / (1.05 * 1.10)


def test_bruteforce_reference_matches_closed_form():
    rates = [0.9, 0.5, 0.2]

    def cost(bs, w):
        return 1.0 + 0.3 * w

    by_hand = [e / cost(1, w) for w, e in enumerate([1.0, 1.9, 2.35, 2.44])]
    assert best_width_bruteforce(rates, cost, 1, 3) == max(range(4), key=by_hand.__getitem__)
    assert expected_commits(rates) == pytest.approx([1.0, 1.9, 2.35, 2.44])


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
    """Seen in the served grid at concurrency 1 (benchmark/RESULTS.md,
    grid-eos-c1-restart): on a CPU server every W > 0 step at batch 1 costs
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


# ---------------------------------------------------------------------------
# Modes, config, metrics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg,expected", [
    (PolicyConfig(mode="fixed", fixed_width=3), 3),
    (PolicyConfig(mode="on"), B - 1),
    (PolicyConfig(mode="off"), 0),
])
def test_static_modes_ignore_load_and_acceptance(cfg, expected):
    policy = SpeculationPolicy(cfg, B)  # no cost model needed
    rng = random.Random(9)
    for bs, rates in [(1, [0.9] * 7), (256, [0.05] * 7)]:
        assert set(run(policy, rates, bs, 60, rng)) == {expected}
    snap = json.loads(json.dumps(policy.snapshot()))
    assert snap["spec_fraction"] == (1.0 if expected else 0.0)
    assert snap["switches"] == 0


def test_restricted_widths_and_probe_width_resolution():
    policy = make_policy(widths=(0, 3, 7), probe_width=2, probe_interval=5)
    assert policy.probe_width == 3  # no candidate <= 2 except 0: smallest positive
    executed = run(policy, [0.2] * 7, 200, 200, random.Random(10))
    assert set(executed) <= {0, 3, 7}


def test_per_request_rates_report_and_weight_dragging_requests():
    policy = make_policy()
    rng = random.Random(11)
    for _ in range(100):
        ids = ["good", "bad"]
        lens = [sample_accept(rng, [0.95] * 7, 7), sample_accept(rng, [0.1] * 7, 7)]
        policy.observe_verify(7, lens, true_cost(2, 7), 2, request_ids=ids)
    snap = json.loads(json.dumps(policy.snapshot()))
    assert [r["request"] for r in snap["dragging_requests"]] == ["bad", "good"]
    pooled = policy.throughputs(2)
    only_bad = policy.throughputs(2, request_ids=["bad", "bad"])
    assert only_bad[7] < pooled[7] / 2
    policy.release_request("bad")
    assert [r["request"] for r in policy.snapshot()["dragging_requests"]] == ["good"]


def test_snapshot_is_json_and_reports_state():
    policy = make_policy()
    run(policy, [0.8] * 7, 4, 20, random.Random(12))
    snap = json.loads(json.dumps(policy.snapshot()))
    assert snap["width"] == policy.width and snap["steps"] == 20
    assert len(snap["acceptance_rates"]) == B - 1 and len(snap["expected_commit"]) == B
    assert set(snap["predicted_tokens_per_s"]) == {str(w) for w in range(B)}


def test_config_validation_and_from_dict():
    cfg = PolicyConfig.from_dict({"mode": "adaptive", "widths": [0, 1, 3], "switch_margin": 0.1})
    assert cfg.widths == (0, 1, 3)
    assert PolicyConfig.from_dict(json.loads('{"probe_share": null}')).probe_share is None
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['swich_margin'\]"):
        PolicyConfig.from_dict({"swich_margin": 0.1})
    bad = [
        {"mode": "auto"}, {"mode": "fixed"}, {"fixed_width": 2}, {"switch_margin": -0.1},
        {"switch_patience": 0}, {"switch_patience": True}, {"urgent_margin": 0.01},
        {"probe_interval": -1}, {"probe_width": 0}, {"acceptance_half_life": 0},
        {"prior_rate": 1.5}, {"cost_ema": 0.0}, {"cost_outlier_ratio": 1.0},
        {"widths": [3, 1]}, {"widths": []}, {"min_weight": float("nan")},
        {"pad_batch_to_profile": 1}, {"spec_margin": -0.05}, {"spec_margin": 1.0},
        {"load_window": -1}, {"load_window": 2.5}, {"probe_share": 0}, {"probe_share": 1.5},
        {"trial_steps": 4}, {"trial_close": -0.1},
    ]
    for overrides in bad:
        with pytest.raises(ValueError, match="speculation policy"):
            PolicyConfig(**overrides)
    with pytest.raises(ValueError, match="fixed_width"):
        SpeculationPolicy(PolicyConfig(mode="fixed", fixed_width=8), B)
    with pytest.raises(ValueError, match="widths"):
        SpeculationPolicy(PolicyConfig(widths=(0, 8)), B, CostModel.from_profile(profile()))
    with pytest.raises(ValueError, match="needs a CostModel"):
        SpeculationPolicy(PolicyConfig(), B)
    with pytest.raises(ValueError, match="batch_size"):
        make_policy().observe_verify(2, [1, 1], 0.01, 3)


def test_choose_width_is_cheap():
    policy = make_policy()
    start = time.perf_counter()
    for i in range(5000):
        policy.choose_width(1 + i % 64)
    assert (time.perf_counter() - start) / 5000 < 200e-6  # generous on a loaded CI core


def test_last_decision_reports_the_models_call():
    """The step trace's view of a decision: the best W > 0 over W = 0, as the
    throughputs the policy compared (before any trial bias)."""
    policy = make_policy(trial_steps=0)
    assert policy.last_decision(8) is None  # no adaptive step yet
    policy.choose_width(8)
    thr = policy.throughputs(8)
    best = max(range(1, len(thr)), key=thr.__getitem__)
    ratio, width, commits, cost_ratio, off_ms = policy.last_decision(8)
    assert width == policy.widths[best] and ratio == pytest.approx(thr[best] / thr[0], rel=1e-3)
    assert cost_ratio == pytest.approx(true_cost(8, width) / true_cost(8, 0), rel=0.05)
    assert 1.0 <= commits <= width + 1 and off_ms > 0
    assert make_policy(mode="on").last_decision(8) is None


def test_truncated_requests_do_not_count_as_rejections():
    """Ragged verify: a request that accepted all n < W drafts it verified never
    reached draft n + 1; counting it as rejected there would pull a_{n+1} down
    by exactly the share of truncated requests."""
    from sglang_dflash.policy import _position_counts

    # Three requests at W = 3: verified 3 (accepted 1), 1 (accepted 1), 2 (accepted 0).
    reached, accepted = _position_counts(3, [1, 1, 0], limits=[3, 1, 2])
    assert reached == [3, 1, 0] and accepted == [2, 0, 0]
    # Without limits the second request would have reached draft 2 and been rejected.
    assert _position_counts(3, [1, 1, 0]) == ([3, 2, 0], [2, 0, 0])
    stats = AcceptanceStats(4, prior_rate=0.5, min_weight=1e-6)
    for _ in range(200):  # every request accepts all its verified drafts, limits 1..4
        stats.observe(4, [1, 2, 3, 4], limits=[1, 2, 3, 4])
    assert min(stats.rates()) > 0.99
    with pytest.raises(ValueError):
        _position_counts(3, [2], limits=[1])  # more accepted than verified


def test_auto_truncation_threshold_rises_with_the_cost_of_a_verified_token():
    """truncate_below = "auto": ~0 where verified tokens are free (the synthetic
    device is compute-free below 64 tokens a step), the break-even survival
    dt * bs * E(W) / t(bs, W) where they cost, capped at AUTO_TRUNCATE_MAX."""
    from sglang_dflash.policy import AUTO_TRUNCATE_MAX

    policy = make_policy(truncate_below="auto")
    assert policy.ragged
    for _ in range(50):
        policy.stats.observe(B - 1, [B - 1] * 4 + [3] * 4)  # rates well above the prior
    assert policy.truncation_threshold(1, B - 1) == 0.0  # 8 tokens: below the free 64
    low, high = policy.truncation_threshold(16, B - 1), policy.truncation_threshold(256, B - 1)
    assert 0.0 < low < high <= AUTO_TRUNCATE_MAX
    bs, w = 256, B - 1
    per_token = 0.0002  # true_verify's slope per token, above 64 tokens
    want = per_token * bs * policy.stats.expected_commit(w) / policy.cost.predict(bs, w)
    assert high == pytest.approx(min(AUTO_TRUNCATE_MAX, want), rel=1e-6)
    assert policy.truncation_threshold(256, 0) == 0.0
    assert not make_policy().ragged and make_policy(truncate_below=0.4).truncation_threshold(64, 3) == 0.4


@pytest.mark.parametrize("bad", [{"truncate_below": 1.0}, {"truncate_below": -0.1},
                                 {"truncate_below": "high"}, {"truncate_below": True},
                                 {"mode": "on", "truncate_below": "auto"}])
def test_bad_truncation_settings_fail(bad):
    with pytest.raises(ValueError, match="truncate_below"):
        PolicyConfig.from_dict(bad)


def run_truncated(policy, rate, bs, steps, rng, cut_share, cut_at=1):
    """`run` under ragged verify: a `cut_share` of the requests verify at most
    `cut_at` drafts each step; the step costs its verified tokens (what the
    worker measures), and the policy is told each request's limit."""
    executed = []
    for _ in range(steps):
        w = policy.choose_width(bs)
        step = policy.steps - 1
        if w == 0:
            seconds = true_cost(bs, 0)
            policy.observe_plain(seconds, bs, step)
        else:
            limits = [min(w, cut_at) if rng.random() < cut_share else w for _ in range(bs)]
            lens = [sample_accept(rng, [rate] * n, n) for n in limits]
            seconds = true_verify(bs, 1 + sum(limits) / bs) + true_draft(bs)
            policy.observe_verify(w, lens, seconds, bs, step=step, limits=limits)
        policy.observe_period(seconds)
        executed.append(w)
    return executed


def test_truncation_yield_tracks_realized_commits_of_ragged_steps():
    """Ragged steps commit less than bs * E(W) from the (censored) rates: the
    factor converges to realized / predicted per width, scales only W > 0,
    and a width not run yet borrows the nearest observed one's."""
    rng = random.Random(5)
    policy = make_policy(truncate_below=0.5, trial_steps=0, mode="on")
    assert policy.truncation_yield.factor(B - 1) == 1.0
    run_truncated(policy, 0.9, 16, 400, rng, cut_share=0.7)
    e = policy.stats.expected_commit(B - 1)
    assert policy.stats.rates()[0] == pytest.approx(0.9, abs=0.05)  # censoring keeps rates unbiased
    realized = 0.7 * expected_commits([0.9])[-1] + 0.3 * e
    f = policy.truncation_yield.factor(B - 1)
    assert f == pytest.approx(realized / e, rel=0.05) and f < 0.75
    assert policy.truncation_yield.factor(3) == f  # borrowed from W = 7, the only one run
    commit = [16 * c for c in expected_commits(policy.stats.mean)]
    thr = policy.throughputs(16)
    assert thr[0] == pytest.approx(commit[0] / policy.cost.predict(16, 0))
    assert thr[-1] == pytest.approx(commit[-1] * f / policy.cost.predict(16, B - 1))
    # A step that did not truncate (limits None) does not train the factor.
    policy.observe_verify(B - 1, [B - 1] * 16, None, 16)
    assert policy.truncation_yield.factor(B - 1) == f
    assert make_policy().snapshot()["truncation_yield"] is None
    assert policy.snapshot()["truncation_yield"] == {str(B - 1): round(f, 4)}


@pytest.mark.parametrize("yield_on", [True, False])
def test_ragged_speculation_turns_off_when_truncated_commits_do_not_pay(monkeypatch, yield_on):
    """Batch 128, acceptance 0.9, 70% of requests cut to one draft: credited
    untruncated commits at the truncated step cost, speculation looks 1.26x
    ahead of plain decoding; by what it really commits it runs at ~0.76x.
    With the factor the policy goes off; without it (the control), it stays on."""
    rng = random.Random(6)
    policy = make_policy(truncate_below=0.5, trial_steps=0, probe_interval=50)
    if not yield_on:
        monkeypatch.setattr(policy.truncation_yield, "factor", lambda w: 1.0)
    executed = run_truncated(policy, 0.9, 128, 600, rng, cut_share=0.7)
    tail = executed[300:]
    if yield_on:
        assert policy.width == 0
        assert sum(w > 0 for w in tail) <= len(tail) / 10  # probes only
    else:
        assert policy.width > 0 and sum(w > 0 for w in tail) > len(tail) / 2
