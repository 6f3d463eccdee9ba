"""SpeculationPolicy: width decisions, hysteresis, probes, cold start, modes."""

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
    # probe_share None: every probe on the interval, however costly (see the share test);
    # no backoff, while on or off.
    policy = make_policy(probe_interval=interval, probe_width=2, probe_backoff=1,
                         off_probe_backoff=1, probe_share=None)
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
    policy = make_policy(probe_share=share, probe_length=2, trial_steps=0, off_probe_backoff=4)
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
    # The same cap while off (the longer one off: the next test).
    policy = make_policy(probe_interval=10, probe_backoff=4, off_probe_backoff=4)
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


@pytest.mark.parametrize("off_backoff", [16, 4])
def test_probe_interval_backs_off_further_while_off_probes_confirm_off(off_backoff):
    """While off, each probe costs plain steps (a speculative step's fixed cost
    for few tokens), and at a steady load where every probe leaves speculation
    predicted to lose, the interval keeps doubling past probe_backoff up to
    off_probe_backoff. A new load brings the base interval back; when
    acceptance recovers, a probe's sample caps the interval at probe_backoff
    again and the policy turns speculation back on."""
    rng = random.Random(7)
    bs, interval = 32, 10
    assert best_width_bruteforce([0.1] * 7, true_cost, bs, B - 1) == 0
    policy = make_policy(probe_interval=interval, probe_backoff=4, off_probe_backoff=off_backoff,
                         probe_share=None, trial_steps=0)
    executed = run(policy, [0.1] * 7, bs, 3000, rng)
    switches = policy.switches  # the cold start's, into off
    assert policy.width == 0
    cap = interval * off_backoff
    gaps = [b - a for a, b in itertools.pairwise(probe_starts(executed, 0))]
    assert set(gaps[-10:]) == {cap}, gaps
    assert policy.probe_interval == cap
    if off_backoff == 4:
        return  # the cap of the test above: what the longer one is measured against
    assert 20 in gaps and 40 in gaps and 80 in gaps, gaps  # doubled on its way past 4 x 10
    # A new load (another batch-size bucket) starts again at the base interval.
    run(policy, [0.1] * 7, 8, 5, rng)
    assert policy.width == 0 and policy.probe_interval in (interval, 2 * interval)
    run(policy, [0.1] * 7, bs, 3000, rng)
    assert policy.width == 0 and policy.probe_interval == cap and policy.switches == switches
    # Acceptance recovers: the next probe tips the model toward speculation
    # (the interval drops back to probe_backoff's cap) and it switches on
    # within a few of those intervals.
    assert best_width_bruteforce([0.95] * 7, true_cost, bs, B - 1) > 0
    executed = run(policy, [0.95] * 7, bs, cap + 4 * 4 * interval, rng)
    assert policy.width > 0, policy.snapshot()
    assert executed[-1] > 0


def test_probe_backoff_is_validated():
    with pytest.raises(ValueError, match="probe_backoff"):
        make_policy(probe_backoff=0)
    with pytest.raises(ValueError, match="off_probe_backoff"):
        make_policy(off_probe_backoff=0)


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
    on = make_policy(trial_steps=0)
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
def test_on_cost_is_measured_early_in_a_new_batch_bucket(probe):
    """Off in a batch-size bucket where no W > 0 step was ever timed, W > 0 is
    predicted from the profile, and the periodic probes there wait in
    proportion to that prediction (probe_share); a profile that overstates
    speculation kept it off for good. An early on probe in the bucket measures it; bounded like
    the early off probe. `probe=False` removes that probe: the same run stays
    off (the test can tell)."""
    early = {} if probe else {"early_on_probes": 0}
    rates = [0.85] * (B - 1)
    assert best_width_bruteforce(rates, _cpu_server_cost, 64, B - 1) == B - 1
    policy = make_policy(probe_length=2, samples=_profile_overstating_the_drafter(), **early)
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
    off = make_policy(trial_steps=0, samples=_profile_overstating_the_drafter(), **early)
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
    policy = make_policy(probe_length=2)
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
def test_stale_off_estimate_is_remeasured_when_the_decision_is_close(refresh):
    """An off cost from a few samples taken long before must not keep
    speculation on where off has become faster. Here: on wins clearly at first, and its early off probe is timed in a
    disturbed moment (1.6x); then acceptance drops so that off is 15% faster.
    A stale off estimate is re-measured while the decision is close; without
    that (the control case) the old samples keep it on until the ordinary
    probes (every 4th runs W = 0) come around."""
    never = {} if refresh else {"refresh_close": -1.0}  # never close: no refresh

    def real(bs, w):  # a CPU server's per-step overhead, which the profile misses
        return 0.02 + true_cost(bs, w)

    bs = 40
    high, low = uniform_rate_for_ratio(bs, 1.5, real), uniform_rate_for_ratio(bs, 0.87, real)
    # An on/off trial would re-measure W = 0 too; probes on the plain interval
    # (probe_share None) keep the control's ordinary W = 0 probe where it was.
    policy = make_policy(trial_steps=0, probe_share=None, **never)
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
def test_off_estimate_from_another_load_is_remeasured(refresh):
    """W = 0 last timed under another load (long contexts made every step dearer)
    is recent, so not stale by weight, yet wrong for the new load. Here: an off load (phase A) whose steps cost 1.3x, a burst at
    another batch size (B), then a load in A's bucket (C) where off is truly
    ~8% faster but A's W = 0 estimate makes speculation look ahead. The new
    load's first close call re-measures W = 0 and goes off; the control
    (refreshes disabled) stays on."""
    never = {} if refresh else {"refresh_close": -1.0}

    def real(bs, w, inflated=False):
        return (0.02 + true_cost(bs, w)) * (1.3 if inflated else 1.0)

    bs = 40
    low = uniform_rate_for_ratio(bs, 0.5, real)
    close = uniform_rate_for_ratio(bs, 0.92, real)
    # Close by the true cost, ~15% ahead by the inflated W = 0 estimate.
    assert close < uniform_rate_for_ratio(bs, 1.2, lambda b, w: real(b, w, True))
    policy = make_policy(trial_steps=0, probe_share=None, **never)
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
    policy = make_policy(probe_length=2, samples=samples)

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


def test_no_flapping_at_threshold_with_noise():
    # The decision threshold: where the best W > 0 ties with off.
    bs = 32
    a = uniform_rate_at_threshold(bs)
    rates = [a] * (B - 1)
    best_on = max(true_thr(rates, bs, w) for w in range(1, B))
    assert best_on == pytest.approx(true_thr(rates, bs, 0), rel=1e-6)
    rng = random.Random(2)
    # probe_share None: every probe on the interval, in both (flapping follows probes).
    # The probe cadence of probe_backoff while off too: a longer backoff off
    # means fewer probes, which alone makes the naive policy flap less.
    policy = make_policy(probe_share=None, off_probe_backoff=4)
    run(policy, rates, bs, 2000, rng, noise=0.05)
    # Without hysteresis, and without regime trials (whose flap trials would
    # measure the tie and damp the flapping: trials.py).
    naive = make_policy(switch_margin=0.0, urgent_margin=0.0,
                        switch_patience=1, probe_share=None, trial_steps=0, off_probe_backoff=4)
    run(naive, rates, bs, 2000, random.Random(2), noise=0.05)
    assert policy.switches <= 6, policy.snapshot()
    assert naive.switches > 3 * max(policy.switches, 1)  # the test would catch flapping


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
    exact = make_policy(switch_margin=0.0, urgent_margin=0.0, switch_patience=1,
                        probe_interval=10, acceptance_half_life=400.0, trial_steps=0)
    run(exact, rates, bs, 600, random.Random(4))
    assert exact.width == best
    # Default hysteresis: may rest on a width within the 5% switch margin.
    default = make_policy(probe_interval=10)
    run(default, rates, bs, 800, random.Random(5))
    assert true_thr(rates, bs, default.width) >= true_thr(rates, bs, best) / 1.05


def test_bruteforce_reference_matches_closed_form():
    rates = [0.9, 0.5, 0.2]

    def cost(bs, w):
        return 1.0 + 0.3 * w

    by_hand = [e / cost(1, w) for w, e in enumerate([1.0, 1.9, 2.35, 2.44])]
    assert best_width_bruteforce(rates, cost, 1, 3) == max(range(4), key=by_hand.__getitem__)
    assert expected_commits(rates) == pytest.approx([1.0, 1.9, 2.35, 2.44])



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


def test_snapshot_is_json_and_reports_state():
    policy = make_policy()
    run(policy, [0.8] * 7, 4, 20, random.Random(12))
    snap = json.loads(json.dumps(policy.snapshot()))
    assert snap["width"] == policy.width and snap["steps"] == 20
    assert len(snap["acceptance_rates"]) == B - 1 and len(snap["expected_commit"]) == B
    assert set(snap["predicted_tokens_per_s"]) == {str(w) for w in range(B)}


def test_policy_construction_checks():
    with pytest.raises(ValueError, match="urgent_margin"):
        make_policy(switch_margin=0.1, urgent_margin=0.05)
    with pytest.raises(ValueError, match="fixed_width"):
        SpeculationPolicy(PolicyConfig(mode="fixed", fixed_width=8), B)
    for widths in ((0, 8), (3, 1), ()):
        with pytest.raises(ValueError, match="widths"):
            SpeculationPolicy(PolicyConfig(), B, CostModel.from_profile(profile()), widths=widths)
    with pytest.raises(ValueError, match="needs a CostModel"):
        SpeculationPolicy(PolicyConfig(), B)
    with pytest.raises(ValueError, match="batch_size"):
        make_policy().observe_verify(2, [1, 1], 0.01, 3)


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
