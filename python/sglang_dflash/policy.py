"""Speculation policy: pick the verify width W for each decode step.

Every decode step the worker asks `SpeculationPolicy.choose_width(bs)` for a
verify width W in the candidate set (default {0, ..., B-1}, B = block size).
The drafter always proposes B-1 drafts; the target verifies the anchor plus the
first W drafts (W+1 tokens per request). W = 0 is plain decode: the drafter is
not run and the step costs one plain decode token per request.

Objective: committed tokens per second for the whole batch,

    thr(W) = bs * E(W) / t(bs, W),     E(W) = 1 + sum_{k=1..W} prod_{j=1..k} a_j

with a_j the conditional acceptance rate of draft j given drafts 1..j-1 were
accepted (vocabulary: `accept_len` = accepted drafts, `commit_len` =
accept_len + 1 including the bonus; E(W) is the expected commit_len).

* `AcceptanceStats` keeps a_j online from host-side accept lengths. Each
  position holds decayed counts and a prior that is its predecessor's rate;
  every step the weights decay by the half-life but never below `min_weight`,
  so a position that is not reached (W < j, or speculation off) keeps its last
  estimate while fresh observations, e.g. from a probe, quickly outweigh it.
* `CostModel` (cost_model.py) is profiled at start-up and corrected online.
* `SpeculationPolicy` takes the argmax with hysteresis (margin + patience, an
  immediate switch only for a large gain) and probes: while off, every
  `probe_interval` steps one step runs at `probe_width`; while on, one step
  runs alternately one candidate wider (the rate of the first unverified
  position stays fresh) and one narrower (the neighbouring cost cell is
  measured, not only extrapolated), every 4th at W = 0; W = 0 is also timed
  early in every new batch-size bucket, and again when its estimate there has
  gone stale, or predates the load the batch just settled into, while the
  decision is close; while off, a W > 0 step is timed early in a bucket
  where none was (so a profile that overstates speculation's cost cannot
  keep it off unmeasured). Probes are exploration, and they cost
  throughput (a W = 0 probe at concurrency 1 commits one token where the
  decided width commits ~6): while nothing changes, the interval doubles after
  each probe up to `probe_backoff` x `probe_interval`, and drops back to
  `probe_interval` when the width switches or the batch settles in another
  batch-size bucket; a costly probe (the widest width while off at a large
  batch) also waits until its extra time is at most `probe_share` of the
  time since the last one. Why hysteresis: a hard threshold without it
  collapsed a public implementation at its switch point (vLLM #49548,
  dflash.md section 9.2).
* `RegimeTrials` (trials.py) checks the model's on-versus-off call where it
  is close: it runs the other regime for `trial_steps` steps, measures
  served decode throughput against the steps before, and scales every W > 0
  prediction by the measured / predicted ratio (the model, judging at the
  batch it sees, leans toward speculation under a closed loop).

Worker integration (host side, once per decode step):

    policy.observe_period(seconds)         # the last step's start-to-next-start wall time
    w = policy.choose_width(bs)            # before drafting; same w on all DP ranks
    step = policy.steps - 1                # this step's index, for the trials' token count
    ... w == 0: plain decode, no drafter; else draft B-1, verify anchor + w ...
    policy.observe_verify(w, accept_lens, seconds, bs, step=step)  # or observe_plain(.., step)

`accept_lens` are accepted drafts per request (SGLang's per-request
`accept_lens` count the bonus too: subtract 1); `seconds` is the step time,
or None for a step that is not pure decode (mixed with prefill) so it does not
train the cost model. The SGLang worker passes None there and reports the
step's full period (start to next start, scheduler overhead included) later
through `observe_step_time(w, seconds, bs)`.

Mixed batches. The policy picks ONE width per step for the whole batch. Pooled
conditional rates already give the population-mean survival (the product of
pooled a_j telescopes to the fraction of requests accepting >= k drafts), so
bs * E(W) is the batch's expected commit. Within W, ragged verify
(`truncate_below`, truncate.py) cuts each request's verified prefix where the
drafter's own confidence says its drafts are unlikely to be accepted:
`truncation_threshold` gives the step's survival threshold (fixed, or "auto":
the cost model's break-even survival), `observe_verify(limits=...)` counts a
cut request as not reaching the drafts it did not verify. The width choice
itself predicts E(W) from those rates, and the measured step times already
hold what truncation saves; `truncation_yield` (realized over predicted
commits of the ragged steps, per width) scales the predicted commits so that
cost and gain are both truncated ones. When request ids are passed,
per-request rates (blended with the batch rates as a prior) make the decision
follow the current batch composition, and `snapshot()["dragging_requests"]`
reports which requests drag the batch.

Everything here is host-side stdlib arithmetic: `choose_width` is O(|widths|)
(O(bs * B) only when per-request ids are passed), and no function touches a
device tensor, so no call forces a device sync.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sglang_dflash.checks import is_finite, is_int, is_real
from sglang_dflash.cost_model import CostModel, bucket_of, policy_error
from sglang_dflash.trials import RegimeTrials, TrialConfig

MODES = ("adaptive", "fixed", "on", "off")
AUTO_TRUNCATE_MAX = 0.9  # the highest survival threshold truncate_below = "auto" sets


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise policy_error(f"{key} = {value!r} {rule}")


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the speculation policy (fed from a JSON server argument).

    Widths are verify widths W (drafts verified per request); block-size
    dependent checks (W <= B-1) happen in `SpeculationPolicy.__init__`.
    """

    mode: str = "adaptive"  # adaptive | fixed (fixed_width) | on (B-1) | off (0)
    fixed_width: int | None = None  # required iff mode == "fixed"
    widths: tuple[int, ...] | None = None  # candidate W (captured graphs); None = 0..B-1
    spec_margin: float = 0.0  # a width W > 0 must be predicted to beat W = 0 by this fraction
    load_window: int = 0  # W = 0 is judged at the peak batch of this many recent steps (0 = current)
    switch_margin: float = 0.05  # candidate must beat the current width by this fraction
    switch_patience: int = 4  # ... for this many consecutive steps
    urgent_margin: float = 0.30  # ... or by this much once (e.g. a load burst)
    probe_interval: int = 50  # steps between probes; 0 disables probing
    probe_width: int = 2  # W of an off-state probe (largest candidate <= this)
    probe_length: int = 1  # consecutive steps a probe runs (the worker uses >= 2 under overlap)
    probe_backoff: int = 4  # the interval doubles after each probe, up to this factor (1 = fixed)
    probe_share: float | None = 0.02  # a probe's extra time <= this share of the time between probes
    acceptance_half_life: float = 50.0  # steps; math.inf = no decay
    min_weight: float = 4.0  # floor of a position's decayed weight; also the prior's weight
    prior_rate: float = 0.7  # a_j before any observation
    request_prior_weight: float = 8.0  # pseudo-observations of batch rates in per-request rates
    max_tracked_requests: int = 4096  # oldest per-request stats evicted beyond this
    cost_ema: float = 0.05  # forgetting factor of the online step-time fit (window ~ 1/cost_ema steps)
    cost_prior_weight: float = 1.0  # pseudo-steps holding the fit's scale at 1 (the profile's shape)
    cost_outlier_ratio: float = 3.0  # clip measured/predicted step time to [1/r, r]
    pad_batch_to_profile: bool = False  # cost of bs = cost of the next profiled bs (graph padding)
    trial_steps: int = 128  # steps of an on/off trial (trials.py); 0 = no trials, no bias
    trial_every: int = 1024  # steps between trials while the load holds
    trial_close: float = 0.15  # trials run while corrected best-on/off is in (1/(1+this), 1+this)
    trial_close_off: float | None = None  # while on at batch >= trial_off_batch, trials of off run
    trial_off_batch: int = 16  # ... up to a corrected ratio 1 + this (None: trial_close; trials.py)
    trial_prior: bool = True  # a load's bias < 1 stays as a prior at the next load until measured
    # Ragged verify (truncate.py): request i verifies its first n_i <= W drafts, those whose
    # survival (running product of the drafter's confidences) stays >= this; 0 = all W;
    # "auto" (adaptive mode): the step's break-even survival from the cost model
    truncate_below: float | str = 0.0

    def __post_init__(self) -> None:
        if self.widths is not None:
            object.__setattr__(self, "widths", tuple(self.widths))
        _check_modes(self)
        _check_hysteresis(self)
        _check_estimators(self)
        _check_trials(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicyConfig:
        """Build from a JSON-like dict; unknown keys raise `ValueError` naming them."""
        if not isinstance(d, Mapping):
            raise policy_error(f"config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise policy_error(f"unknown config key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**dict(d))


def _check_modes(c: PolicyConfig) -> None:
    _require(c.mode in MODES, "mode", c.mode, f"must be one of {list(MODES)}")
    if c.mode == "fixed":
        _require(is_int(c.fixed_width) and c.fixed_width >= 0, "fixed_width", c.fixed_width,
                 "must be an int >= 0 when mode = 'fixed'")
    else:
        _require(c.fixed_width is None, "fixed_width", c.fixed_width,
                 f"is only used with mode = 'fixed' (mode is {c.mode!r})")
    if c.widths is not None:
        w = c.widths
        _require(len(w) > 0 and all(is_int(x) and x >= 0 for x in w), "widths", list(w),
                 "must be a non-empty list of ints >= 0")
        _require(list(w) == sorted(set(w)), "widths", list(w), "must be strictly increasing")


def _check_hysteresis(c: PolicyConfig) -> None:
    _require(is_real(c.spec_margin) and 0 <= c.spec_margin < 1, "spec_margin", c.spec_margin,
             "must be a number in [0, 1)")
    _require(is_int(c.load_window) and c.load_window >= 0, "load_window", c.load_window,
             "must be an int >= 0 (0 = judge W = 0 at the current batch)")
    _require(is_real(c.switch_margin) and 0 <= c.switch_margin < 1, "switch_margin",
             c.switch_margin, "must be a number in [0, 1)")
    _require(is_real(c.urgent_margin) and c.urgent_margin >= c.switch_margin, "urgent_margin",
             c.urgent_margin, f"must be a number >= switch_margin = {c.switch_margin}")
    _require(is_int(c.switch_patience) and c.switch_patience >= 1, "switch_patience",
             c.switch_patience, "must be an int >= 1")
    _require(is_int(c.probe_interval) and c.probe_interval >= 0, "probe_interval",
             c.probe_interval, "must be an int >= 0 (0 disables probing)")
    _require(is_int(c.probe_length) and c.probe_length >= 1, "probe_length", c.probe_length,
             "must be an int >= 1")
    _require(is_int(c.probe_width) and c.probe_width >= 1, "probe_width", c.probe_width,
             "must be an int >= 1")
    _require(is_int(c.probe_backoff) and c.probe_backoff >= 1, "probe_backoff", c.probe_backoff,
             "must be an int >= 1 (1 = a fixed probe interval)")
    _require(c.probe_share is None or (is_real(c.probe_share) and 0 < c.probe_share <= 1),
             "probe_share", c.probe_share, "must be a number in (0, 1], or null (no limit)")


def _check_estimators(c: PolicyConfig) -> None:
    _require(is_real(c.acceptance_half_life) and c.acceptance_half_life > 0,
             "acceptance_half_life", c.acceptance_half_life,
             "must be a number > 0 (inf = no decay)")
    for key in ("min_weight", "request_prior_weight", "cost_prior_weight"):
        value = getattr(c, key)
        _require(is_finite(value) and value > 0, key, value, "must be a finite number > 0")
    _require(is_real(c.prior_rate) and 0 <= c.prior_rate <= 1, "prior_rate", c.prior_rate,
             "must be a number in [0, 1]")
    _require(is_int(c.max_tracked_requests) and c.max_tracked_requests >= 1,
             "max_tracked_requests", c.max_tracked_requests, "must be an int >= 1")
    _require(is_real(c.cost_ema) and 0 < c.cost_ema <= 1, "cost_ema", c.cost_ema,
             "must be a number in (0, 1]")
    _require(is_finite(c.cost_outlier_ratio) and c.cost_outlier_ratio > 1, "cost_outlier_ratio",
             c.cost_outlier_ratio, "must be a finite number > 1")
    _require(isinstance(c.pad_batch_to_profile, bool), "pad_batch_to_profile",
             c.pad_batch_to_profile, "must be a bool")
    if c.truncate_below == "auto":
        _require(c.mode == "adaptive", "truncate_below", c.truncate_below,
                 "needs mode 'adaptive' (its cost model sets the threshold)")
    else:
        _require(is_real(c.truncate_below) and 0 <= c.truncate_below < 1, "truncate_below",
                 c.truncate_below, "must be 'auto' or a number in [0, 1) (0 = verify every draft)")


def _check_trials(c: PolicyConfig) -> None:
    _require(is_int(c.trial_steps) and (c.trial_steps == 0 or c.trial_steps >= 8), "trial_steps",
             c.trial_steps, "must be an int >= 8, or 0 (no trials)")
    _require(is_int(c.trial_every) and c.trial_every >= c.trial_steps, "trial_every",
             c.trial_every, f"must be an int >= trial_steps = {c.trial_steps}")
    _require(is_finite(c.trial_close) and c.trial_close > 0, "trial_close", c.trial_close,
             "must be a finite number > 0")
    _require(c.trial_close_off is None or (is_finite(c.trial_close_off)
                                          and c.trial_close_off >= c.trial_close),
             "trial_close_off", c.trial_close_off,
             f"must be null or a finite number >= trial_close = {c.trial_close}")
    _require(is_int(c.trial_off_batch) and c.trial_off_batch >= 1, "trial_off_batch",
             c.trial_off_batch, "must be an int >= 1")
    _require(isinstance(c.trial_prior, bool), "trial_prior", c.trial_prior, "must be a bool")


# ---------------------------------------------------------------------------
# Acceptance
# ---------------------------------------------------------------------------


def expected_commits(rates: Sequence[float]) -> list[float]:
    """E(W) for W = 0..len(rates): 1 + sum_{k<=W} prod_{j<=k} a_j, in O(len(rates))."""
    out = [1.0]
    survival = 1.0
    for a in rates:
        survival *= a
        out.append(out[-1] + survival)
    return out


def _position_counts(width: int, accept_lens: Sequence[int],
                     limits: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """(reached_j, accepted_j) for j = 1..width from accept lengths in [0, width].

    A request with accept_len a < width reaches positions 1..a+1 (rejected at
    a+1); a == width reaches 1..width, all accepted. With `limits` (ragged
    verify: request i verified only limits[i] <= width drafts) the limit
    plays the width's part per request: a request that accepted all its
    verified drafts was not rejected at limits[i] + 1, it never reached it,
    so truncation does not bias the conditional rates. O(bs + width).
    """
    if limits is None:
        limits = [width] * len(accept_lens)
    elif len(limits) != len(accept_lens):
        raise policy_error(f"len(limits) = {len(limits)} != len(accept_lens) = {len(accept_lens)}")
    reached, accepted = [0] * width, [0] * width
    full = [0] * (width + 1)  # requests whose verified drafts were all accepted, by count
    hist = [0] * (width + 1)  # requests rejected right after a accepts, by a
    for i, (a, n) in enumerate(zip(accept_lens, limits)):
        if not (is_int(n) and 0 <= n <= width):
            raise policy_error(f"limits[{i}] = {n!r} must be an int in [0, width = {width}]")
        if not (is_int(a) and 0 <= a <= n):
            raise policy_error(f"accept_lens[{i}] = {a!r} must be an int in [0, {n}]")
        (full if a == n else hist)[a] += 1
    at_least = 0  # requests with accept_len >= j
    for j in range(width, 0, -1):
        at_least += hist[j] + full[j]
        accepted[j - 1] = at_least
        reached[j - 1] = at_least + hist[j - 1]
    return reached, accepted


class AcceptanceStats:
    """Online per-position conditional acceptance rates a_1..a_{B-1}.

    Position j keeps decayed counts of its own data (accepted A_j of reached
    N_j) and P_j pseudo-observations of a prior, which is its predecessor's
    current rate (`prior_rate` for position 1):

        a_j = (A_j + P_j * a_{j-1}) / (N_j + P_j),    P_j = `min_weight` at start.

    Why the predecessor: measured conditional rates of a DFlash drafter are
    nearly flat in j (demo pair, always-on grid: math 0.89-0.95, chat 0.78-0.84
    at every position), and the last positions are reached only by the
    occasional wider probe while the policy runs narrower. A fixed prior (0.7)
    held a_7 of a 0.9 drafter at ~0.8 from a handful of probe samples and kept
    the policy one width short of its best.
    Every step multiplies A_j, N_j and P_j by d = 2^(-1/half_life) while
    N_j + P_j stays >= `min_weight` (the floor; below it they keep their
    value), so a position that is not reached (W < j, or speculation off)
    keeps its last estimate while fresh observations, e.g. from a probe,
    quickly outweigh it. Without decay a_j is the pooled ratio A_j / N_j plus
    `min_weight` pseudo-observations of the prior, so its bias vanishes as O(1/n).
    Invariants: 0 <= a_j <= 1; weight_j = N_j + P_j >= min_weight.
    """

    def __init__(self, num_positions: int, half_life: float = math.inf,
                 prior_rate: float = 0.7, min_weight: float = 4.0) -> None:
        if not (is_int(num_positions) and num_positions >= 1):
            raise policy_error(f"num_positions = {num_positions!r} must be an int >= 1")
        self.decay = 0.5 ** (1.0 / half_life)
        self.min_weight = float(min_weight)
        self.prior_rate = float(prior_rate)
        self._acc = [0.0] * num_positions  # A_j
        self._reached = [0.0] * num_positions  # N_j
        self._prior = [self.min_weight] * num_positions  # P_j
        self.mean: list[float] = []  # a_j, recomputed on every change
        self._update()

    @property
    def weight(self) -> list[float]:
        return [n + p for n, p in zip(self._reached, self._prior)]

    def _update(self) -> None:
        prev, out = self.prior_rate, []
        for a, n, p in zip(self._acc, self._reached, self._prior):
            prev = (a + p * prev) / (n + p)
            out.append(prev)
        self.mean = out

    def _age(self) -> None:
        if self.decay >= 1.0:
            return
        d, floor = self.decay, self.min_weight
        for j, (n, p) in enumerate(zip(self._reached, self._prior)):
            total = n + p
            f = d if total * d >= floor else (floor / total if total > floor else 1.0)
            self._acc[j] *= f
            self._reached[j] = n * f
            self._prior[j] = p * f

    def tick(self) -> None:
        """Age the estimates by one step (a step without a verify)."""
        self._age()
        self._update()

    def observe(self, width: int, accept_lens: Sequence[int],
                limits: Sequence[int] | None = None) -> None:
        """Merge one verify step: `accept_lens[i]` drafts of request i accepted
        (0..width, or 0..limits[i] when request i verified only that many)."""
        if not (is_int(width) and 0 <= width <= len(self.mean)):
            raise policy_error(f"width = {width!r} must be an int in [0, {len(self.mean)}]")
        self._age()
        reached, accepted = _position_counts(width, accept_lens, limits)
        for j in range(width):
            self._acc[j] += accepted[j]
            self._reached[j] += reached[j]
        self._update()

    def rates(self) -> list[float]:
        """a_1..a_{B-1}."""
        return list(self.mean)

    def expected_commit(self, width: int) -> float:
        """E(width): expected committed tokens per request, bonus included."""
        return expected_commits(self.mean[:width])[-1]


class _RequestStats:
    """Raw (undecayed) per-request counts; requests are short-lived."""

    __slots__ = ("accepted", "reached")

    def __init__(self, num_positions: int) -> None:
        self.reached = [0] * num_positions
        self.accepted = [0] * num_positions

    def add(self, width: int, accept_len: int) -> None:
        """One verify of `width` drafts (the request's own limit under ragged verify)."""
        for j in range(min(accept_len + 1, width)):
            self.reached[j] += 1
        for j in range(accept_len):
            self.accepted[j] += 1

    def rates(self, prior: Sequence[float], prior_weight: float) -> list[float]:
        """Per-request a_j shrunk toward the batch rates (`prior_weight` pseudo-counts)."""
        return [(acc + prior_weight * p) / (n + prior_weight)
                for acc, n, p in zip(self.accepted, self.reached, prior)]


class TruncationYield:
    """Committed tokens of ragged-verify steps over the untruncated prediction, per width.

    Why: the width choice predicts bs * E(W) from the conditional rates, but
    under ragged verify a cut request commits at most limit + 1 tokens, and the
    rates themselves count only the drafts that were verified (the confident
    ones). The measured step times already hold what truncation saves, so
    without this factor the model would charge truncated cost and credit
    untruncated commits, leaning toward speculation by what truncation gives
    up. factor(W) = (R_W + k) / (P_W + k): decayed sums over W's ragged steps
    of realized and predicted commits per request, with k = `prior_weight`
    pseudo-steps at a ratio of 1 (in units of the last prediction). A width
    not yet run borrows the nearest observed width's factor (the wider one on
    a tie); with none observed every factor is 1.
    """

    def __init__(self, half_life: float = math.inf, prior_weight: float = 8.0) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior_weight = float(prior_weight)
        self._sums: dict[int, list[float]] = {}  # W -> [realized, predicted, last predicted]

    def observe(self, width: int, predicted: float, realized: float) -> None:
        """One ragged step at width W: predicted and realized commits per request."""
        if not (predicted > 0 and realized >= 0):
            raise policy_error(f"predicted = {predicted!r} must be > 0, realized = {realized!r} >= 0")
        cell = self._sums.setdefault(width, [0.0, 0.0, predicted])
        cell[0] = cell[0] * self.decay + realized
        cell[1] = cell[1] * self.decay + predicted
        cell[2] = predicted

    def factor(self, width: int) -> float:
        if width <= 0 or not self._sums:
            return 1.0
        near = min(self._sums, key=lambda w: (abs(w - width), -w))
        realized, predicted, last = self._sums[near]
        k = self.prior_weight * last
        return (realized + k) / (predicted + k)

    def snapshot(self) -> dict:
        return {str(w): round(self.factor(w), 4) for w in sorted(self._sums)}


# ---------------------------------------------------------------------------
# Policy
# ---------------------------------------------------------------------------


def best_width_bruteforce(rates: Sequence[float], cost_fn: Callable[[int, int], float],
                          batch_size: int, max_width: int) -> int:
    """Reference argmax_W bs * E(W) / cost_fn(bs, W) by direct enumeration (ties: smaller W)."""
    best, best_thr = 0, -1.0
    for w in range(max_width + 1):
        e = 1.0 + sum(math.prod(rates[:k]) for k in range(1, w + 1))
        thr = batch_size * e / cost_fn(batch_size, w)
        if thr > best_thr * (1 + 1e-12):
            best, best_thr = w, thr
    return best


_EARLY_OFF_PROBES = 3  # per batch-size bucket; see SpeculationPolicy._off_refresh
_EARLY_ON_PROBES = 3  # per batch-size bucket; see SpeculationPolicy._early_on_probe
# While on: re-measure W = 0 in the current bucket when its estimate has gone
# stale (aged weight below this) and off is predicted within _REFRESH_CLOSE of
# the current width; see SpeculationPolicy._off_estimate_stale.
_STALE_OFF_WEIGHT = 1.5
_REFRESH_CLOSE = 0.30
_REFRESH_WEIGHT = 1.0  # the W = 0 cell's weight a refresh leaves before its own samples
_COLD_HOLD = 16  # steps the cold start may wait for its first timed step; see _decide


def _best_on(thr: Sequence[float]) -> int:
    """Index of the best W > 0 in throughputs over (0, W1, W2, ...)."""
    return 1 + max(range(len(thr) - 1), key=lambda i: thr[1 + i])


class SpeculationPolicy:
    """Chooses the verify width per decode step; see the module docstring.

    Invariants: `width` (the decided width) is a candidate; a probe changes
    only the width returned for that one step, never `width`; `switches`
    counts changes of `width` only.
    """

    def __init__(self, cfg: PolicyConfig, block_size: int,
                 cost_model: CostModel | None = None) -> None:
        if not (is_int(block_size) and block_size >= 2):
            raise policy_error(f"block_size = {block_size!r} must be an int >= 2")
        top = block_size - 1
        self.cfg, self.block_size = cfg, block_size
        self.widths = tuple(cfg.widths) if cfg.widths is not None else tuple(range(block_size))
        _require(self.widths[-1] <= top, "widths", list(self.widths),
                 f"must be <= block_size - 1 = {top}")
        if cfg.mode == "fixed":
            _require(cfg.fixed_width <= top, "fixed_width", cfg.fixed_width,
                     f"must be <= block_size - 1 = {top}")
        if cfg.mode == "adaptive" and cost_model is None:
            raise policy_error("mode 'adaptive' needs a CostModel (CostModel.from_profile)")
        self.cost = cost_model
        self.stats = AcceptanceStats(top, cfg.acceptance_half_life, cfg.prior_rate,
                                     cfg.min_weight)
        self.truncation_yield = TruncationYield(cfg.acceptance_half_life, cfg.min_weight)
        positive = [w for w in self.widths if w > 0]
        below = [w for w in positive if w <= cfg.probe_width]
        # The probe runs at the largest candidate <= probe_width (smallest positive if none).
        self.probe_width = below[-1] if below else (positive[0] if positive else 0)
        self.width = {"fixed": cfg.fixed_width, "on": top, "off": 0}.get(cfg.mode)
        self.last_width, self.last_batch_size = 0, 0
        self.last_thr: list[float] | None = None  # the model's throughputs of the last adaptive step, before the bias
        self.steps = self.spec_steps = self.probe_steps = self.switches = 0
        self._streak = 0  # consecutive steps a switch was wanted
        self._since_probe = 0  # steps since the last probe or switch
        self._probe_turns = [0, 0]  # periodic probes started while off, while on
        self._probe_left = 0  # further steps of the running probe
        self._probe_at = 0  # ... and its width
        self._requests: dict[Hashable, _RequestStats] = {}
        self._early_off_probes: dict[int, int] = {}  # bucket -> early off probes run
        self._early_on_probes: dict[int, int] = {}  # bucket -> early on probes run
        self._bucket, self._bucket_run = -1, 0  # batch-size bucket of the last steps (-1: none yet), and for how many
        self._cold_steps = 0  # steps held at the cold-start width before any step was timed
        self._backoff = 1  # probe interval multiplier: 1, 2, 4, ... up to cfg.probe_backoff
        self._settled = -1  # the bucket the batch last stayed in for interval / 8 steps (-1: none; 0 is batch 1)
        self._settled_step = 0  # ... since this step (the current load's start)
        self._recent_bs: deque[int] = deque(maxlen=max(1, cfg.load_window))  # for load_window
        self._last_off_probe: dict[int, int] = {}  # bucket -> step of its last early / refresh off probe
        # On/off trials by measured throughput (trials.py): adaptive, W = 0 and a W > 0 candidates.
        self.trials = None
        self._pre_trial: int | None = None  # the decided width a running trial interrupted
        if cfg.mode == "adaptive" and cfg.trial_steps > 0 and self.widths[0] == 0 and positive:
            self.trials = RegimeTrials(TrialConfig(
                steps=cfg.trial_steps, every=cfg.trial_every, close=cfg.trial_close,
                margin=cfg.switch_margin, prior=cfg.trial_prior, close_off=cfg.trial_close_off,
                off_batch=cfg.trial_off_batch))

    @classmethod
    def from_profile(cls, cfg: PolicyConfig, block_size: int,
                     samples: Iterable[Any]) -> SpeculationPolicy:
        """Policy with a `CostModel` fitted from start-up profile samples and cfg's knobs."""
        cost = CostModel.from_profile(samples, ema=cfg.cost_ema,
                                      prior_weight=cfg.cost_prior_weight,
                                      outlier_ratio=cfg.cost_outlier_ratio,
                                      pad_batch=cfg.pad_batch_to_profile)
        return cls(cfg, block_size, cost)

    # -- decision ---------------------------------------------------------

    def throughputs(self, batch_size: int,
                    request_ids: Sequence[Hashable] | None = None) -> list[float]:
        """Predicted committed tokens/s for each candidate width (order of `widths`)."""
        if self.cost is None:
            raise policy_error("throughputs need a CostModel")
        if request_ids is not None and self._requests:
            commit = self._batch_commits(request_ids)
        else:
            commit = [batch_size * e for e in expected_commits(self.stats.mean)]
        factor = self.truncation_yield.factor
        return [commit[w] * factor(w) / self.cost.predict(batch_size, w) for w in self.widths]

    def _batch_commits(self, request_ids: Sequence[Hashable]) -> list[float]:
        """sum_i E_i(W) with per-request rates (batch rates for unseen requests)."""
        batch = self.stats.mean
        total = [0.0] * (len(batch) + 1)
        k = self.cfg.request_prior_weight
        for rid in request_ids:
            r = self._requests.get(rid)
            e = expected_commits(batch if r is None else r.rates(batch, k))
            for w in range(len(total)):
                total[w] += e[w]
        return total

    def choose_width(self, batch_size: int,
                     request_ids: Sequence[Hashable] | None = None) -> int:
        """Verify width for this step. `batch_size` = requests in the decode batch."""
        if not (is_int(batch_size) and batch_size >= 1):
            raise policy_error(f"batch_size = {batch_size!r} must be an int >= 1")
        w = self.width
        bucket = bucket_of(batch_size)
        self._bucket_run = self._bucket_run + 1 if bucket == self._bucket else 1
        self._bucket = bucket
        if bucket != self._settled and self._bucket_run >= self._settle_steps():
            self._settled, self._backoff = bucket, 1  # a new load: probe at the base rate
            self._settled_step = self.steps
        if self.cfg.load_window > 0:
            self._recent_bs.append(batch_size)
        if self.cfg.mode == "adaptive":
            thr = self._at_offered_load(self.throughputs(batch_size, request_ids), batch_size)
            thr = self._handicapped(thr)
            forced = self._trial_regime(batch_size, thr)
            self.last_thr = thr
            if forced is None:
                if self._pre_trial is not None:  # a trial ended: back to the width it interrupted
                    self._switch(self._pre_trial)
                    self._pre_trial = None
                thr = self._calibrated(thr, batch_size)
                self._decide(thr)
                w = self._maybe_probe(batch_size, thr)
            else:
                w = self._run_trial(forced, thr)
        self.steps += 1
        self.spec_steps += w > 0
        self.last_width, self.last_batch_size = w, batch_size
        return w

    @property
    def ragged(self) -> bool:
        """Whether verify blocks are truncated per request (truncate.py)."""
        return self.cfg.truncate_below == "auto" or self.cfg.truncate_below > 0

    def truncation_threshold(self, batch_size: int, width: int) -> float:
        """Survival threshold of this step's ragged verify (truncate.draft_limits).

        "auto": draft k of a request is worth verifying when its survival s_k
        (the probability it is accepted) buys more than its verify time costs
        at the step's own rate: s_k / dt > C / T, with dt the time of one more
        verified token and C / T the step's predicted committed tokens per
        second, i.e. s_k > dt * bs * E(W) / t(bs, W). dt is the profiled
        verify cost per token (the profile's slope over the widths, at the
        bucket's learned scale); the measured step time t(bs, W) already holds
        what truncation saves. At one request a verified token is nearly free
        (threshold ~0.1: almost nothing is cut); at a saturated batch it costs
        ~1/8 of a step (threshold ~0.5). Capped at AUTO_TRUNCATE_MAX so that a
        confident drafter keeps speculating at any load."""
        t = self.cfg.truncate_below
        if t != "auto":
            return float(t)
        top = max(self.widths)
        if self.cost is None or width < 1 or top < 2:
            return 0.0
        _, scale = self.cost.params(batch_size)
        per_width = scale * (self.cost.base(batch_size, top) - self.cost.base(batch_size, 1)) / (top - 1)
        step = self.cost.predict(batch_size, width)
        tau = per_width / step * self.stats.expected_commit(width) * self.truncation_yield.factor(width)
        return min(AUTO_TRUNCATE_MAX, max(0.0, tau))

    def last_decision(self, batch_size: int) -> list | None:
        """For the step trace: [best-on / off throughput ratio before the
        trials' bias, that W, its expected commits per request, its step time
        over W = 0's, W = 0's predicted ms] of the last adaptive step at
        `batch_size`, or None (not adaptive, or W = 0 not a candidate)."""
        thr = self.last_thr
        if thr is None or self.widths[0] != 0 or len(thr) < 2:
            return None
        i = _best_on(thr)
        c0, cw = self.cost.predict(batch_size, 0), self.cost.predict(batch_size, self.widths[i])
        return [round(thr[i] / thr[0], 4), self.widths[i], round(thr[i] * cw / batch_size, 3),
                round(cw / c0, 3), round(c0 * 1e3, 3)]

    def _at_offered_load(self, thr: list[float], batch_size: int) -> list[float]:
        """With `load_window`, W = 0's throughput at the peak batch of the last
        `load_window` steps instead of the current one.

        Why: under a fixed number of clients (closed loop), speculating itself
        shrinks the decode batch. Requests finish after a quarter of the steps,
        and each replacement spends a client round trip and a prefill outside
        it; at concurrency 32 an always-on server decoded chat at a mean batch
        of 21.6 against 25.2 for the off server. Judged at the batch it sees,
        speculation wins (at bs 16-31 it was predicted 10-16% ahead), but off
        would run at the larger batch, where it ties. The recent peak is the
        batch the offered load refills to (after each admission). Default 0:
        with 16 (and spec_margin 0.10) chat c32 went off and matched the off
        server, but math c64 went off too, where always-on was ~10% ahead
        (benchmark/RESULTS.md, grid-eos-window)."""
        if self.cfg.load_window == 0 or self.widths[0] != 0:
            return thr
        offered = max(self._recent_bs)
        if offered <= batch_size:
            return thr
        return [offered / self.cost.predict(offered, 0)] + thr[1:]

    def _handicapped(self, thr: list[float]) -> list[float]:
        """Throughputs as the decision compares them: every W > 0 divided by
        1 + spec_margin (the ranking among positive widths is unchanged).

        Why a knob: the objective is the decode step's own throughput, and in
        the natural-length serving grid it overstated speculation's end-to-end
        gain (at concurrency 32-64 a predicted on/off ratio of ~1.0 measured
        0.90-0.94 end to end); at the break-even point the choice is within the
        model's error, and off is the side that cannot be slower than plain
        decoding. Default 0: on the serving grid's c16-64 cells neither 0.10
        alone nor with load_window 16 was a net gain (benchmark/RESULTS.md,
        grid-eos-margin, grid-eos-window)."""
        if self.cfg.spec_margin == 0:
            return thr
        m = 1.0 + self.cfg.spec_margin
        return [t / m if w > 0 else t for w, t in zip(self.widths, thr)]

    def _trial_regime(self, batch_size: int, thr: list[float]) -> bool | None:
        """The regime a running on/off trial imposes (True = on), or None
        (trials.py). Not before the cold start has decided a width."""
        if self.trials is None or self.width is None or self._cold_steps < _COLD_HOLD:
            return None
        best = _best_on(thr)
        predict = self.cost.predict
        cost_ratio = predict(batch_size, self.widths[best]) / predict(batch_size, 0)
        return self.trials.regime(self.steps, thr[best] / thr[0], self.width > 0, batch_size,
                                  cost_ratio)

    def _calibrated(self, thr: list[float], batch_size: int) -> list[float]:
        """Every W > 0 throughput times the trials' bias at this batch (W = 0
        is plain decoding, the reference the bias is measured against)."""
        if self.trials is None:
            return thr
        k = self.trials.bias_at(batch_size)
        if k == 1.0:
            return thr
        return [t * k if w > 0 else t for w, t in zip(self.widths, thr)]

    def _run_trial(self, on: bool, thr: list[float]) -> int:
        """A trial step: off = W = 0; on = the model's best W > 0 (with the
        usual hysteresis among them). No probes inside a trial: it measures one
        regime; the decided width is the trial's, so the switches count."""
        self._probe_left = 0
        if self._pre_trial is None:
            self._pre_trial = self.width
        if not on:
            if self.width != 0:
                self._switch(0)
        elif self.width == 0:
            self._switch(self.widths[_best_on(thr)])
        else:
            self._decide([0.0] + thr[1:])
        return self.width

    def _switch(self, width: int) -> None:
        self.width = width
        self.switches += 1
        self._streak = self._since_probe = 0
        self._backoff = 1

    def _decide(self, thr: list[float]) -> None:
        best = max(range(len(thr)), key=thr.__getitem__)  # first max: ties go to smaller W
        if self.width is None:
            # Cold start at the widest width: before any step is measured the
            # model is the start-up profile alone (taken on a possibly busy
            # host) and prior acceptance rates; a server starts idle, where
            # speculation pays most, and the first steps then measure the wide
            # end. The data turn it down or off within a few steps if not.
            self.width = self.widths[-1]
            return
        if self._cold_steps < _COLD_HOLD and not self.cost.has_observations():
            # ... and it holds that width until a step has been timed: the
            # profile alone misses the per-step overhead of a CPU server (its
            # scheduler), which made off look ~5x better on the second step and
            # ran a c1 server off for its first 50 steps (one probe interval).
            self._cold_steps += 1
            return
        self._cold_steps = _COLD_HOLD
        cur = self.widths.index(self.width)
        gain = thr[best] / thr[cur] - 1.0
        if best == cur or gain <= self.cfg.switch_margin:
            self._streak = 0
            return
        self._streak += 1
        if self._streak >= self.cfg.switch_patience or gain >= self.cfg.urgent_margin:
            self._switch(self.widths[best])

    def _maybe_probe(self, batch_size: int, thr: list[float]) -> int:
        """The width this step runs: the decided one, or a probe's.

        A probe lasts `probe_length` steps (`_probe_left` counts the rest).
        Three kinds start one: an off-cost refresh while on (`_off_refresh`),
        an early on probe while off (`_early_on_probe`), and the periodic
        probe (`_periodic_probe`), once every `self.probe_interval` steps (the
        configured interval, doubled after each probe up to `probe_backoff`
        times while the width and the batch-size bucket stay the same).
        """
        if self._probe_left > 0:
            self._probe_left -= 1
            self.probe_steps += self._probe_at != self.width
            return self._probe_at
        self._since_probe += 1
        if self.cfg.probe_interval == 0 or len(self.widths) == 1:
            return self.width
        probe = self._off_refresh(batch_size, thr)
        if probe is None:
            probe = self._early_on_probe(batch_size, thr)
        return self._periodic_probe(batch_size) if probe is None else probe

    def _off_refresh(self, batch_size: int, thr: list[float]) -> int | None:
        """While on, a W = 0 probe in a batch-size bucket whose off cost was
        never measured (`_off_cost_unmeasured`) or has gone stale while the
        decision is close (`_off_estimate_stale`); None if neither.

        The unmeasured case comes early (after interval / 8 steps, all in that
        bucket: not for the one-step dips of a batch while a finished request
        is replaced, which, when bs 4 -> 3 still crossed a bucket edge, spent
        12 of a c4 cell's ~130 steps off) and lasts two steps longer than a
        periodic probe (more samples): until then W = 0 is predicted by the
        bucket's affine fit, learned from wide steps only, which charges it the
        wide steps' unexplained time (seen in the serving grid: W = 0 predicted
        at 1.7x its real cost at bs 32, so speculation stayed on where it lost
        20%). At most `_EARLY_OFF_PROBES` such probes per bucket, so a bucket
        whose steps never time cleanly (prefill traffic) cannot keep it off.
        """
        early = self._settle_steps()
        if self._since_probe < early or self._bucket_run < early:
            return None
        unmeasured = self._off_cost_unmeasured(batch_size)
        if not (unmeasured or self._off_estimate_stale(batch_size, thr)):
            return None
        bucket = bucket_of(batch_size)
        if unmeasured:
            self._early_off_probes[bucket] = self._early_off_probes.get(bucket, 0) + 1
        else:
            # Its samples decide: the old ones were taken at another load (or
            # long ago), however recent their weight says they are.
            self.cost.forget(batch_size, 0, _REFRESH_WEIGHT)
        self._last_off_probe[bucket] = self.steps
        return self._start_probe(0, self.cfg.probe_length + 2)

    def _periodic_probe(self, batch_size: int) -> int:
        """Once the interval has passed, a probe at another width (or the
        decided width if it must wait: `_probe_wait`): `_off_probe`'s or
        `_on_probe`'s pick for the count of probes started in that mode."""
        if self._since_probe < self.probe_interval:
            return self.width
        on = self.width != 0
        turn = self._probe_turns[on]
        probe = self._on_probe(turn) if on else self._off_probe(turn)
        if self._since_probe < self._probe_wait(batch_size, probe):
            return self.width
        self._backoff = min(2 * self._backoff, self.cfg.probe_backoff)
        self._probe_turns[on] += 1
        return self._start_probe(probe, self.cfg.probe_length)

    def _off_probe(self, turn: int) -> int:
        """While off: the width of the `turn`-th periodic probe, alternately
        `probe_width` and the widest candidate, so the policy notices when
        speculation pays again and the far end of the cost model is measured,
        not only taken from the start-up profile (a profile taken on a busy
        host can be far off)."""
        return self.probe_width if turn % 2 == 0 else self.widths[-1]

    def _on_probe(self, turn: int) -> int:
        """While on: the width of the `turn`-th periodic probe.

        Every 4th probe at W = 0, so the off cost is measured in every
        batch-size bucket the server runs (it is mostly fixed overhead on a
        CPU server, which a profile of the model's matmuls cannot see); the
        others alternately one candidate narrower (so the cost cell next to the
        current width is measured, not only extrapolated from the profile) and
        one wider (so the rate of the first unverified position does not stay
        stale forever); at the ends only the inner one.
        """
        has_off = self.widths[0] == 0
        if has_off and turn % 4 == 3:
            return 0
        neighbour_turn = turn - turn // 4 if has_off else turn  # W = 0 turns skipped
        i = self.widths.index(self.width)
        down = (neighbour_turn % 2 == 0 and i > 0) or i == len(self.widths) - 1
        return self.widths[i - 1] if down else self.widths[i + 1]

    def _probe_wait(self, batch_size: int, probe: int) -> float:
        """Steps since the last probe before a probe at `probe` may run: its
        extra step time over the decided width's, as a share of the time in
        between, at most `probe_share`. Why: while off at a large batch a
        probe at the widest width costs several plain steps per step (7x at
        bs 64 on a CPU server), and every 200 steps that alone took ~6% of
        the decode time (adaptive measured 3-9% below the off server at code
        c64, benchmark/RESULTS.md, grid-eos-margin). Cheap probes (a
        neighbouring width, W = 0 while on) are not held back."""
        if self.cost is None or self.cfg.probe_share is None:
            return 0.0
        predict = self.cost.predict
        extra = predict(batch_size, probe) / predict(batch_size, self.width) - 1.0
        return max(0.0, self.cfg.probe_length * extra / self.cfg.probe_share)

    @property
    def probe_interval(self) -> int:
        """Steps between the current probes (the base interval times the backoff)."""
        return self.cfg.probe_interval * self._backoff

    def _settle_steps(self) -> int:
        """Consecutive steps in a batch-size bucket before the batch counts as in it."""
        return max(1, self.cfg.probe_interval // 8)

    def _start_probe(self, width: int, length: int) -> int:
        self._since_probe = 0
        self.probe_steps += width != self.width
        self._probe_left, self._probe_at = length - 1, width
        return width

    def _off_cost_unmeasured(self, batch_size: int) -> bool:
        """On, W = 0 a candidate, and no off step timed in this batch-size bucket yet."""
        return (self.width > 0 and self.widths[0] == 0 and self.cost is not None
                and not self.cost.observed(batch_size, 0)
                and self._early_off_probes.get(bucket_of(batch_size), 0) < _EARLY_OFF_PROBES)

    def _early_on_probe(self, batch_size: int, thr: list[float]) -> int | None:
        """While off, a probe at the model's best W > 0, two steps longer than a
        periodic one, when the batch settled in its bucket (as for the early
        off probe), no W > 0 step was timed in that bucket yet, and fewer than
        `_EARLY_ON_PROBES` such probes ran there; None otherwise.

        Why: there W > 0 is predicted from the start-up profile scaled by a fit
        of W = 0 steps alone, and the periodic probes wait in proportion to that
        prediction (`_probe_wait`), so a profile that overstates speculation's
        cost kept it off for good. Seen in the serving grid (code c64, a 2-core
        Intel host): the profile put the drafter at bs 16-64 at 80-130 ms (the
        server ran float16, and the profile's head was a strided 3-D matmul;
        7-27 ms in float32 through the worker's path); W = 7 was predicted at
        ~9x a plain step where the always-on server measured ~2.9x, the probes
        would have waited ~800 steps, and adaptive decoded plainly through
        cells where always-on committed ~1.4x off's tokens per second of
        decode. The W > 0 cells of a bucket share their residual (`CostModel`),
        so one width measured corrects them all."""
        if self.width != 0 or self.cost is None or self.widths[-1] == 0:
            return None
        early = self._settle_steps()
        if self._since_probe < early or self._bucket_run < early:
            return None
        bucket = bucket_of(batch_size)
        run = self._early_on_probes.get(bucket, 0)
        if run >= _EARLY_ON_PROBES or any(self.cost.observed(batch_size, w) for w in self.widths if w > 0):
            return None
        self._early_on_probes[bucket] = run + 1
        return self._start_probe(self.widths[_best_on(thr)], self.cfg.probe_length + 2)

    def _off_estimate_stale(self, batch_size: int, thr: list[float]) -> bool:
        """On, W = 0 measured in this bucket but not lately (the cell's aged
        weight is below `_STALE_OFF_WEIGHT`: no sample in the last ~300 timed
        steps), off predicted within `_REFRESH_CLOSE` of the current width by
        this step's decision throughputs `thr`, and no off probe in this bucket
        for two probe intervals.

        Why: while on, W = 0 is otherwise timed only every 4th probe (every
        200-800 steps), so three early samples taken in one moment decided a
        bucket for the rest of a server's life. Seen in the serving grid
        (chat, c32, after the math and code cells): W = 0 at bs 16-31 was held
        at 39 ms from a few samples, speculation was predicted 23% ahead and
        stayed on, while the off server was ~6% faster than the always-on one.
        Where the decision is not close the estimate's age does not matter.

        Also stale, whatever its weight: an estimate not refreshed since the
        batch settled in this bucket (a new load). Its samples may be recent
        yet from another load: a step's cost depends on the contexts too, not
        only on the batch size. Seen in the serving grid (code c16 right after
        code c64): W = 0 at bs 16 was held at 16.8 ms from the c64 cell's
        drain (long contexts) while the new load's off steps took 14.5 ms, so
        speculation was predicted ~11% ahead and ran 110 steps, against an
        always-on server ~5% behind the off one. A refresh also caps the
        cell's weight (`CostModel.forget`) so its own samples decide."""
        if not (self.width > 0 and self.widths[0] == 0 and self.cost is not None
                and self.cost.observed(batch_size, 0)):
            return False
        last = self._last_off_probe.get(bucket_of(batch_size))
        new_load = last is None or last < self._settled_step
        if not new_load and self.steps - last < 2 * self.cfg.probe_interval:
            return False
        if not new_load and self.cost.cell_weight(batch_size, 0) >= _STALE_OFF_WEIGHT:
            return False
        return thr[self.widths.index(self.width)] < (1.0 + _REFRESH_CLOSE) * thr[0]

    # -- feedback ---------------------------------------------------------

    def observe_verify(self, width: int, accept_lens: Sequence[int],
                       step_seconds: float | None, batch_size: int,
                       request_ids: Sequence[Hashable] | None = None,
                       step: int | None = None,
                       limits: Sequence[int] | None = None) -> None:
        """Feed back one executed step at verify width `width` (host-side lists only).

        accept_lens[i]: accepted drafts of request i (0..width), bonus EXCLUDED.
        limits: drafts each request verified under ragged verify (truncate.py;
        each <= width; all `width` when nothing was cut), or None when the
        step did not truncate. A ragged step also trains `truncation_yield`.
        step_seconds: measured step time, or None when it is not a pure decode
        step (e.g. mixed with prefill) and must not train the cost model.
        step: the step's index (`steps` after its `choose_width`, minus 1), for
        the regime trials' token count; None = not counted.
        """
        if len(accept_lens) != batch_size:
            raise policy_error(f"len(accept_lens) = {len(accept_lens)} != batch_size = {batch_size}")
        if width == 0:
            if any(accept_lens):
                raise policy_error("accept_lens must be all 0 at width 0")
            self.observe_plain(step_seconds, batch_size, step)
            return
        if limits is not None:  # a ragged step (cut or not): its commits against the prediction
            self.truncation_yield.observe(width, self.stats.expected_commit(width),
                                          1.0 + sum(accept_lens) / batch_size)
        self.stats.observe(width, accept_lens, limits)
        if step is not None and self.trials is not None:
            self.trials.tokens(step, batch_size + sum(accept_lens))
        if request_ids is not None:
            self._observe_requests(width, accept_lens, request_ids, limits)
        if step_seconds is not None and self.cost is not None:
            self.cost.observe(batch_size, width, step_seconds)

    def observe_plain(self, step_seconds: float | None, batch_size: int,
                      step: int | None = None) -> None:
        """Feed back one plain decode step (W = 0: no drafter, anchor only)."""
        self.stats.tick()
        if step is not None and self.trials is not None:
            self.trials.tokens(step, batch_size)
        if step_seconds is not None and self.cost is not None:
            self.cost.observe(batch_size, 0, step_seconds)

    def observe_step_time(self, width: int, step_seconds: float, batch_size: int) -> None:
        """Feed back the measured duration of one decode step at `width`, for
        callers that learn it after the acceptance feedback (the worker times
        a step from its start to the next step's start)."""
        if self.cost is not None:
            self.cost.observe(batch_size, width, step_seconds)

    def observe_period(self, seconds: float) -> None:
        """The wall time of the last chosen step, from its start to the next
        forward's start (every decode step's, also those the cost model does
        not take): the regime trials' measure of decode time."""
        if self.trials is not None and self.steps > 0:
            self.trials.period(self.steps - 1, seconds)

    def _observe_requests(self, width: int, accept_lens: Sequence[int],
                          request_ids: Sequence[Hashable],
                          limits: Sequence[int] | None = None) -> None:
        if len(request_ids) != len(accept_lens):
            raise policy_error(f"len(request_ids) = {len(request_ids)} != "
                        f"len(accept_lens) = {len(accept_lens)}")
        n = len(self.stats.mean)
        limits = [width] * len(accept_lens) if limits is None else limits
        for rid, a, limit in zip(request_ids, accept_lens, limits):
            r = self._requests.get(rid)
            if r is None:
                while len(self._requests) >= self.cfg.max_tracked_requests:
                    del self._requests[next(iter(self._requests))]  # oldest first
                r = self._requests[rid] = _RequestStats(n)
            r.add(limit, a)

    def release_request(self, rid: Hashable) -> None:
        """Forget a finished request's stats."""
        self._requests.pop(rid, None)

    # -- metrics ----------------------------------------------------------

    def snapshot(self) -> dict:
        """JSON-serializable state for metrics and logs."""
        bs = self.last_batch_size
        table = self._table(bs) if self.cost is not None and bs > 0 else None
        commits = expected_commits(self.stats.mean)
        return {
            "mode": self.cfg.mode, "block_size": self.block_size, "widths": list(self.widths),
            "width": self.width, "last_width": self.last_width, "batch_size": bs,
            "steps": self.steps, "spec_steps": self.spec_steps,
            "spec_fraction": self.spec_steps / self.steps if self.steps else 0.0,
            "probe_steps": self.probe_steps, "probe_interval": self.probe_interval,
            "switches": self.switches,
            "acceptance_rates": [round(a, 4) for a in self.stats.mean],
            "acceptance_weights": [round(w, 1) for w in self.stats.weight],
            "expected_commit": [round(e, 4) for e in commits],
            "predicted_tokens_per_s": table,
            "predicted_tokens_per_s_by_bucket": self._bucket_tables(),
            "cost": self.cost.snapshot() if self.cost is not None else None,
            "dragging_requests": self._dragging(),
            "trials": self.trials.snapshot() if self.trials is not None else None,
            "truncation_yield": self.truncation_yield.snapshot() if self.ragged else None,
        }

    def _bucket_tables(self) -> dict | None:
        """Predicted tokens/s per width at the mean batch size of every observed
        bucket: what the policy would choose there now (the last batch is often
        a draining one)."""
        if self.cost is None:
            return None
        return {f"bs{bs}": self._table(bs) for bs in self.cost.bucket_batch_sizes()}

    def _table(self, bs: int) -> dict:
        return {str(w): round(t, 2) for w, t in zip(self.widths, self.throughputs(bs))}

    def _dragging(self, limit: int = 4) -> list[dict]:
        """Tracked requests with the lowest expected commit at the top width."""
        batch, k = self.stats.mean, self.cfg.request_prior_weight
        rows = [(expected_commits(r.rates(batch, k))[-1], str(rid), r.reached[0])
                for rid, r in self._requests.items()]
        rows.sort()
        return [{"request": rid, "expected_commit": round(e, 3), "verifies": n}
                for e, rid, n in rows[:limit]]
