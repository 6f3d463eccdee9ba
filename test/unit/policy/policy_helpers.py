"""Shared fixtures of the policy unit tests: a synthetic step cost, its
start-up profile, and a closed-loop driver fed back as the worker feeds it."""

from dataclasses import fields

from sglang_dflash.policy import PolicyConfig, SpeculationPolicy, Tuning, expected_commits

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


CONFIG_KEYS = {f.name for f in fields(PolicyConfig)}


def split_settings(overrides):
    """(PolicyConfig, Tuning) from one dict of user settings and internal constants."""
    cfg = PolicyConfig(**{k: v for k, v in overrides.items() if k in CONFIG_KEYS})
    tuning = Tuning(**{k: v for k, v in overrides.items() if k not in CONFIG_KEYS})
    return cfg, tuning


def make_policy(widths=None, samples=None, **overrides):
    cfg, tuning = split_settings(overrides)
    return SpeculationPolicy.from_profile(cfg, B, profile() if samples is None else samples,
                                          widths=widths, tuning=tuning)


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
