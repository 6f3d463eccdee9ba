"""Regime trials (trials.py) inside the policy, on a simulated closed-loop server.

The step model compares widths at the batch it sees; in a closed loop (a fixed
number of clients, each sending its next request when the last one finished)
speculating shrinks the batch, and where plain decoding amortizes its step over
the batch much better than a wide verify does, off can win end to end while the
model, even with exact step costs, calls speculation ahead at the batch it sees.
The simulator below is such a server: no SGLang, no torch, simulated time.
"""

import random

import pytest
from policy_helpers import split_settings
from sglang_dflash.policy import PolicyConfig, SpeculationPolicy
from sglang_dflash.policy.trials import _LAG, _SHARE, RegimeTrials, TrialConfig

B = 8
PROFILE_BS = (1, 2, 4, 8, 16, 32, 64, 128)


def verify_cost(bs, q):
    """CPU-like: a fixed per-step overhead and compute linear in verified tokens."""
    return 0.008 + 0.0003 * bs * q


def draft_cost(bs):
    return 0.002 + 0.0002 * bs


def step_cost(bs, w):
    return verify_cost(bs, w + 1) + (draft_cost(bs) if w > 0 else 0.0)


def profile():
    samples = [(bs, q, False, verify_cost(bs, q)) for bs in PROFILE_BS for q in range(1, B + 1)]
    samples += [(bs, B, True, step_cost(bs, B - 1)) for bs in PROFILE_BS]
    return samples


def make_policy(widths=None, **overrides):
    cfg, tuning = split_settings(overrides)
    return SpeculationPolicy.from_profile(cfg, B, profile(), widths=widths, tuning=tuning)


def sample_accept(rng, rate, width):
    a = 0
    while a < width and rng.random() < rate:
        a += 1
    return a


def closed_loop(policy, *, clients, rate, seconds, new_tokens=64, prefill=0.004,
                prefill_per_request=0.004, round_trip=0.05, after_prefill=1.0, seed=0):
    """Serve `clients` closed-loop clients for `seconds` of simulated time.

    Each request decodes `new_tokens` tokens at acceptance rate `rate` per draft
    position; a finished request's client sends its next one after
    `round_trip` seconds; arrivals are prefilled together before the next decode
    step (`prefill` + `prefill_per_request` each, server time). A W > 0 step
    right after a prefill costs `after_prefill` times the others and, as under
    SGLang's overlap scheduler, is no sample of the cost model (its period holds
    the prefill's result processing). The policy is fed as the worker feeds it.
    Returns committed decode tokens per second (prefill time included)."""
    rng = random.Random(seed)
    t, committed = 0.0, 0
    batch = []  # tokens left per decoding request
    arrivals = [rng.uniform(0.0, round_trip) for _ in range(clients)]
    prefilled = False
    while t < seconds:
        ready = [a for a in arrivals if a <= t]
        if ready:
            arrivals = [a for a in arrivals if a > t]
            t += prefill + prefill_per_request * len(ready)
            batch += [new_tokens - 1] * len(ready)  # the prefill emits the first token
            prefilled = True
            continue
        if not batch:
            t = min(arrivals)  # idle until the next request
            continue
        bs = len(batch)
        w = policy.choose_width(bs)
        step = policy.steps - 1
        cost = step_cost(bs, w)
        if prefilled and w > 0:
            cost *= after_prefill
        lens = [sample_accept(rng, rate, w) for _ in range(bs)]
        policy.observe_verify(w, lens, None, bs, step=step)
        if not prefilled:
            policy.observe_step_time(w, cost, bs)
        policy.observe_period(cost)
        prefilled = False
        t += cost
        left = []
        for n, a in zip(batch, lens):
            n -= min(n, a + 1)
            if n > 0:
                left.append(n)
            else:
                arrivals.append(t + round_trip)
        committed += sum(min(n, a + 1) for n, a in zip(batch, lens))
        batch = left
    return committed / t


def static(mode):
    return SpeculationPolicy(PolicyConfig(mode=mode), B)


def serve_all(policy_overrides=None, **load):
    """Tokens/s of always-on, off, the step model alone and the model with
    trials on the same simulated load, and the policy with trials."""
    on = closed_loop(static("on"), **load)
    off = closed_loop(static("off"), **load)
    alone = closed_loop(make_policy(trial_steps=0), **load)
    policy = make_policy(**(policy_overrides or {}))
    return on, off, alone, closed_loop(policy, **load), policy


# Loads where a W > 0 step right after a prefill costs 1.5x and is no cost
# sample (as under the overlap scheduler): the model overrates speculation.
MISJUDGED = [dict(clients=16, rate=0.74), dict(clients=32, rate=0.85)]


@pytest.mark.parametrize("load", MISJUDGED)
def test_trials_correct_the_model_where_it_misjudges_on_against_off(load):
    on, off, alone, adaptive, policy = serve_all(seconds=60.0, after_prefill=1.5, **load)
    assert off > 1.2 * on
    assert alone < 0.9 * off  # the step model alone speculates where off serves more
    assert adaptive > 1.1 * alone
    assert adaptive >= 0.9 * off  # the rest: the first trial must wait for a baseline
    trials = policy.snapshot()["trials"]
    assert trials["trials"] >= 1 and trials["bias"] < 0.9
    assert policy.spec_steps / policy.steps < 0.15


# Loads where the model is right (no hidden cost) and speculation serves more.
KEEP = [dict(clients=8, rate=0.74), dict(clients=16, rate=0.85)]


@pytest.mark.parametrize("load", KEEP)
def test_trials_keep_speculation_where_it_serves_more(load):
    # The model puts speculation 20-50% ahead here: outside trial_close
    # (0.15), so by default no trial runs; inside a band of 0.6 they do,
    # confirm it, and cost little over a long load.
    on, off, alone, adaptive, policy = serve_all(seconds=60.0, **load)
    assert on > 1.1 * off
    assert policy.trials.trials == 0 and adaptive == alone
    on, off, alone, adaptive, policy = serve_all({"trial_close": 0.6}, seconds=60.0, **load)
    assert policy.trials.trials >= 1
    assert adaptive >= 0.97 * max(on, off, alone)
    assert policy.trials.bias > 0.9


@pytest.mark.parametrize("load", [dict(clients=1, rate=0.85), dict(clients=64, rate=0.74)])
def test_no_trials_where_the_model_sees_a_clear_winner(load):
    policy = make_policy()
    closed_loop(policy, seconds=20.0, **load)  # far ahead at bs 1; far behind at bs 64
    assert policy.trials.trials == 0 and policy.trials.trial_steps == 0


# ---------------------------------------------------------------------------
# RegimeTrials alone
# ---------------------------------------------------------------------------

CFG = TrialConfig(steps=64, every=512, close=0.3, margin=0.05)


def drive(trials, steps, start, *, on, thr_on, thr_off, ratio=1.1, bs=32, cost_ratio=1.0,
          noise=0.0, rng=None):
    """Run `steps` steps of RegimeTrials alone: the server runs the trial's
    regime, else `on`; a step lasts 10 ms and commits at the regime's rate
    (tokens/s). Returns the regimes run."""
    ran = []
    for s in range(start, start + steps):
        forced = trials.regime(s, ratio, on, bs, cost_ratio)
        regime = on if forced is None else forced
        thr = thr_on if regime else thr_off
        if rng is not None:
            thr *= 1.0 + noise * rng.uniform(-1, 1)
        trials.tokens(s, thr * 0.01)
        trials.period(s, 0.01)
        ran.append(regime)
    return ran


def test_a_trial_runs_off_after_a_baseline_and_measures_the_bias():
    trials = RegimeTrials(CFG)
    ran = drive(trials, 63, 0, on=True, thr_on=1000.0, thr_off=1200.0)
    assert all(ran) and trials.trial is None  # the regime must hold `steps` steps first
    ran = drive(trials, 200, 63, on=True, thr_on=1000.0, thr_off=1200.0)
    assert ran[:64 + _LAG] == [False] * (64 + _LAG) and all(ran[64 + _LAG:])
    assert trials.trials == 1
    assert trials.last_measured == pytest.approx(1000 / 1200)
    assert trials.bias == pytest.approx(1000 / 1200 / 1.1)  # measured / the model's 1.1
    assert trials.regime(263, 1.1, True, 32) is None


def test_no_trial_of_speculation_where_off_is_the_models_own_choice():
    trials = RegimeTrials(CFG)
    ran = drive(trials, 1000, 0, on=False, thr_on=1200.0, thr_off=1000.0, ratio=1.04)
    assert not any(ran) and trials.trials == 0  # inside the switch margin: off stands
    ran = drive(trials, 1000, 1000, on=False, thr_on=1200.0, thr_off=1000.0, ratio=1.2)
    assert not any(ran) and trials.trials == 0  # no measured bias to re-check either


def test_an_off_set_by_the_bias_is_rechecked_with_a_trial_of_speculation():
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0)
    assert trials.bias < 1 / 1.1  # the policy now runs off (corrected ratio < 1)
    ran = drive(trials, 2000, 200, on=False, thr_on=1300.0, thr_off=1200.0)
    assert trials.trials >= 2 and any(ran)
    assert trials.last_measured == pytest.approx(1300 / 1200)


def test_trials_take_a_bounded_share_of_decode_time():
    """A trial of speculation at 5x the step time waits 15x its expected length."""
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0)
    ran = drive(trials, 8000, 200, on=False, thr_on=1300.0, thr_off=1200.0, cost_ratio=5.0)
    starts = [i for i in range(1, len(ran)) if ran[i] and not ran[i - 1]]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert starts and all(g >= (_SHARE - 1) * (64 + _LAG) * 5 for g in gaps)


def test_a_noisy_trial_is_averaged_with_the_last_ones():
    rng = random.Random(3)
    trials = RegimeTrials(TrialConfig(steps=64, every=256, close=0.3, margin=0.05))
    drive(trials, 6000, 0, on=True, thr_on=1000.0, thr_off=1150.0, noise=0.3, rng=rng)
    assert trials.trials >= 5 and len(trials.log_bias) == 3
    assert trials.bias == pytest.approx(1000 / 1150 / 1.1, rel=0.05)


def test_a_bias_belongs_to_its_load():
    trials = RegimeTrials(CFG)
    drive(trials, 1300, 0, on=True, thr_on=1000.0, thr_off=1200.0)
    assert trials.trials == 2 and len(trials.log_bias) == 2
    # A dip or a drain shorter than half a trial keeps the bias ...
    drive(trials, 20, 1300, on=True, thr_on=1000.0, thr_off=1200.0, bs=4)
    assert len(trials.log_bias) == 2
    # ... a batch that stays at twice the size drops it at once, and the next
    # trial (not `every` steps later) measures the new load.
    ran = drive(trials, 300, 1320, on=True, thr_on=1000.0, thr_off=900.0, bs=64)
    assert trials.trials == 3 and len(trials.log_bias) == 1 and not all(ran)
    assert trials.last_measured == pytest.approx(1000 / 900)


def test_no_trial_on_a_ramp_or_outside_the_close_band():
    trials = RegimeTrials(CFG)
    for s in range(300):  # a ramp: the batch grows by 2% a step
        assert trials.regime(s, 1.1, True, int(4 * 1.02 ** s)) is None
    for s in range(300, 600):
        assert trials.regime(s, 1.4, True, 64) is None  # on far ahead
    assert trials.trials == 0 and trials.trial_steps == 0


def test_idle_gaps_give_no_evidence():
    trials = RegimeTrials(CFG)
    for s in range(300):
        trials.regime(s, 1.1, True, 32)
        trials.tokens(s, 10)  # periods never fed: the server idled around every step
    assert trials.trials == 0 and trials.bias == 1.0


def test_trial_config_validation():
    with pytest.raises(ValueError, match="trial_steps"):
        PolicyConfig(trial_steps=4)
    with pytest.raises(ValueError, match="trial_every"):
        make_policy(trial_steps=128, trial_every=64)
    with pytest.raises(ValueError, match="trial_close"):
        PolicyConfig(trial_close=0.0)
    assert make_policy(trial_steps=0).trials is None
    assert static("on").trials is None
    assert make_policy(widths=[1, 3, 7]).trials is None  # W = 0 is no candidate: nothing to compare


def test_a_drain_ends_a_trial_without_evidence():
    """The load ends while a trial runs (the batch drains from 32 to 1): the
    trial stops as soon as the batch leaves a factor 2 of its start (the
    drain's last requests must not wait on the trial's regime), and the bias
    stays."""
    trials = RegimeTrials(CFG)
    drive(trials, 63, 0, on=True, thr_on=1000.0, thr_off=1200.0)
    ran = []
    for s in range(63, 63 + 40):
        bs = max(1, 32 - (s - 63))
        ran.append(trials.regime(s, 1.1, True, bs))
        trials.tokens(s, bs)
        trials.period(s, 0.01)
    assert ran[0] is False and ran.index(None) == 17  # bs 15 < 32 / 2: the trial is over
    assert ran[17:] == [None] * 23
    assert trials.trial is None and trials.trials == 0 and trials.bias == 1.0


def test_a_past_loads_bias_below_1_is_a_prior_until_the_new_load_measures():
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0, bs=16)
    measured = 1000 / 1200 / 1.1
    assert trials.trials == 1 and trials.bias == pytest.approx(measured)
    drive(trials, 32, 200, on=True, thr_on=1000.0, thr_off=1200.0, bs=32)
    assert not trials.log_bias and trials.bias == 1.0  # the load moved: no measured bias ...
    # ... but a prior: in full at the same or a larger batch, shrunk toward 1 below it.
    assert trials.bias_at(16) == pytest.approx(measured)
    assert trials.bias_at(64) == pytest.approx(measured)
    assert trials.bias_at(8) == pytest.approx(measured ** 0.5)
    assert trials.snapshot()["prior"] == {"bias": round(measured, 4), "load": 16}
    # The new load's first trial (no `every` wait) replaces it.
    drive(trials, 300, 232, on=True, thr_on=1000.0, thr_off=900.0, bs=32)
    assert trials.trials == 2 and trials.bias_at(32) == pytest.approx(1000 / 900 / 1.1)
    without = RegimeTrials(TrialConfig(steps=64, every=512, close=0.3, margin=0.05, prior=False))
    drive(without, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0, bs=16)
    drive(without, 32, 200, on=True, thr_on=1000.0, thr_off=1200.0, bs=32)
    assert without.bias_at(32) == 1.0 and without.snapshot()["prior"] is None


def test_a_bias_of_1_or_more_is_no_prior():
    """Carried to another load it would lean toward speculation, the costly side."""
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1300.0, thr_off=1000.0, bs=16)
    assert trials.bias > 1
    drive(trials, 32, 200, on=True, thr_on=1000.0, thr_off=1200.0, bs=32)
    assert trials.bias_at(32) == 1.0 and trials.snapshot()["prior"] is None


def test_no_trial_of_speculation_on_a_prior_from_a_smaller_load():
    """Off because of a prior measured at a smaller batch: a trial of a wide
    verify at this batch would cost several plain steps per step, and off is
    the side the model's error favours; at a smaller batch the trial runs."""
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0, bs=16)
    drive(trials, 32, 200, on=False, thr_on=1000.0, thr_off=1200.0, bs=32)
    assert trials.bias_at(32) < 1 / 1.1  # the model's 1.1 corrected below 1: off
    ran = drive(trials, 2000, 232, on=False, thr_on=1300.0, thr_off=1200.0, bs=32)
    assert not any(ran) and trials.trials == 1
    trials = RegimeTrials(CFG)
    drive(trials, 200, 0, on=True, thr_on=1000.0, thr_off=1200.0, bs=32)
    drive(trials, 32, 200, on=False, thr_on=1000.0, thr_off=1200.0, bs=16)
    ran = drive(trials, 600, 232, on=False, thr_on=1300.0, thr_off=1200.0, bs=16, ratio=1.15)
    assert any(ran) and trials.trials == 2


def test_the_prior_saves_the_next_load_from_the_uncorrected_model():
    """16 clients then 32 on one server (a load step, as between grid cells):
    without the prior the 32-client load starts on the uncorrected model and
    speculates until its first trial; with it, it runs off from the start."""
    served = {}
    for prior in (True, False):
        policy = make_policy(trial_prior=prior)
        closed_loop(policy, clients=16, rate=0.74, seconds=60.0, after_prefill=1.5)
        assert policy.trials.trials >= 1 and policy.trials.bias < 0.9
        spec_before = policy.spec_steps
        thr = closed_loop(policy, clients=32, rate=0.85, seconds=30.0, after_prefill=1.5, seed=1)
        served[prior] = thr, policy.spec_steps - spec_before
    off = closed_loop(static("off"), clients=32, rate=0.85, seconds=30.0, after_prefill=1.5, seed=1)
    (with_prior, spec_with), (without, spec_without) = served[True], served[False]
    assert with_prior >= 0.97 * off and with_prior > 1.05 * without
    assert spec_with < spec_without / 2


def test_a_flapping_regime_gets_a_trial_that_makes_its_own_baseline():
    """The policy switches on and off every 10 steps (a model ratio hovering
    around 1): no regime holds a trial's length, so no ordinary trial starts;
    after _FLAPS switches within a trial's length a flap trial runs off for
    `steps` steps, then on for `steps` (+ _LAG), and measures their second halves."""
    trials = RegimeTrials(CFG)
    ran, s = [], 0
    while trials.trials == 0 and s < 600:
        policy_on = (s // 10) % 2 == 0
        ran += drive(trials, 1, s, on=policy_on, thr_on=1000.0, thr_off=1250.0)
        s += 1
    assert trials.trials == 1 and trials.flap_trials == 1
    first = 40  # the 4th switch (steps 10, 20, 30, 40) starts it
    assert ran[first:first + 64] == [False] * 64
    assert ran[first + 64:first + 128 + _LAG] == [True] * (64 + _LAG)
    assert trials.last_measured == pytest.approx(1000 / 1250)
    assert trials.bias == pytest.approx(1000 / 1250 / 1.1)
    # Unless the policy settles, the same load waits `every` steps and the share limit.
    more = drive(trials, 300, s, on=True, thr_on=1000.0, thr_off=1250.0)
    assert trials.trials == 1 and all(more)


def test_flapping_with_a_clear_winner_starts_no_trial():
    trials = RegimeTrials(CFG)
    for s in range(400):  # switches every 10 steps, but the model puts on far ahead
        drive(trials, 1, s, on=(s // 10) % 2 == 0, thr_on=1000.0, thr_off=1250.0, ratio=1.6)
    assert trials.trials == 0 and trials.trial is None
