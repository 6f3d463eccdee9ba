"""Speculation policy: pick the verify width W for each decode step.

Every decode step the worker asks `SpeculationPolicy.choose_width(bs)` for a
verify width W in {0, ..., B-1} (B = block size). The drafter always proposes
B-1 drafts; the target verifies the anchor plus the first W (W+1 tokens per
request). W = 0 is plain decoding: the drafter does not run.

Objective: committed tokens per second for the whole batch,

    thr(W) = bs * E(W) / t(bs, W)

with E(W) from online acceptance rates (acceptance.py) and t(bs, W) from a cost
model profiled at start-up and corrected by measured step times (cost_model.py).
The controller takes the argmax with hysteresis (a margin held for a few steps;
an immediate switch only for a large gain), explores with probes (other widths,
so the model's cells are measured rather than extrapolated), and lets on/off
trials (trials.py) correct its on-versus-off call by served throughput where
that call is close. docs/policy.md describes each mechanism; docs/decisions.md
records why each exists and what it measured.

Worker integration (host side, once per decode step):

    policy.observe_period(seconds)         # the last step's start-to-next-start wall time
    w = policy.choose_width(bs)            # before drafting
    step = policy.steps - 1                # this step's index, for the trials' token count
    ... w == 0: plain decode, no drafter; else draft B-1, verify anchor + w ...
    policy.observe_verify(w, accept_lens, seconds, bs, step=step)  # or observe_plain(..., step)

`accept_lens` are accepted drafts per request, bonus excluded; `seconds` is the
step time, or None when the caller reports it later (`observe_step_time`).
Everything here is host-side stdlib arithmetic: no call touches a device tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sglang_dflash.checks import is_int
from sglang_dflash.policy.acceptance import AcceptanceStats, expected_commits
from sglang_dflash.policy.config import TUNING, PolicyConfig, Tuning, policy_error, require
from sglang_dflash.policy.cost_model import CostModel, bucket_of
from sglang_dflash.policy.trials import RegimeTrials, TrialConfig


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


def _best_on(thr: Sequence[float]) -> int:
    """Index of the best W > 0 in throughputs over (0, W1, W2, ...)."""
    return 1 + max(range(len(thr) - 1), key=lambda i: thr[1 + i])


class SpeculationPolicy:
    """Chooses the verify width per decode step; see the module docstring.

    `widths` (default 0..B-1) restricts the candidates, e.g. to the widths a
    device has captured graphs for. Invariants: `width` (the decided width) is
    a candidate; a probe changes only the width returned for that one step,
    never `width`; `switches` counts changes of `width` only.
    """

    def __init__(self, cfg: PolicyConfig, block_size: int, cost_model: CostModel | None = None,
                 *, widths: Sequence[int] | None = None, tuning: Tuning = TUNING) -> None:
        if not (is_int(block_size) and block_size >= 2):
            raise policy_error(f"block_size = {block_size!r} must be an int >= 2")
        top = block_size - 1
        self.cfg, self.block_size, self.tuning = cfg, block_size, tuning
        self.widths = _check_widths(widths, top)
        if cfg.mode == "fixed":
            require(cfg.fixed_width <= top, "fixed_width", cfg.fixed_width,
                    f"must be <= block_size - 1 = {top}")
        if cfg.mode == "adaptive" and cost_model is None:
            raise policy_error("mode 'adaptive' needs a CostModel (CostModel.from_profile)")
        require(tuning.urgent_margin >= cfg.switch_margin, "urgent_margin", tuning.urgent_margin,
                f"must be >= switch_margin = {cfg.switch_margin}")
        self.cost = cost_model
        self.stats = AcceptanceStats(top, cfg.acceptance_half_life, tuning.prior_rate,
                                     tuning.min_weight)
        positive = [w for w in self.widths if w > 0]
        below = [w for w in positive if w <= tuning.probe_width]
        # The off-state probe runs at the largest candidate <= probe_width (smallest positive if none).
        self.probe_width = below[-1] if below else (positive[0] if positive else 0)
        self.width = {"fixed": cfg.fixed_width, "on": top, "off": 0}.get(cfg.mode)
        self.last_width, self.last_batch_size = 0, 0
        self.last_thr: list[float] | None = None  # the model's throughputs of the last adaptive step
        self.steps = self.spec_steps = self.probe_steps = self.switches = 0
        self._streak = 0  # consecutive steps a switch was wanted
        self._since_probe = 0  # steps since the last probe or switch
        self._probe_turns = [0, 0]  # periodic probes started while off, while on
        self._probe_left = 0  # further steps of the running probe
        self._probe_at = 0  # ... and its width
        self._early_off_probes: dict[int, int] = {}  # bucket -> early off probes run
        self._early_on_probes: dict[int, int] = {}  # bucket -> early on probes run
        self._bucket, self._bucket_run = -1, 0  # batch-size bucket of the last steps, and for how many
        self._cold_steps = 0  # steps held at the cold-start width before any step was timed
        self._backoff = 1  # probe interval multiplier: 1, 2, 4, ... up to `_backoff_cap`
        self._settled = -1  # the bucket the batch last stayed in for interval / 8 steps (-1: none)
        self._settled_step = 0  # ... since this step (the current load's start)
        self._last_off_probe: dict[int, int] = {}  # bucket -> step of its last early / refresh off probe
        self.trials = None
        self._pre_trial: int | None = None  # the decided width a running trial interrupted
        if cfg.mode == "adaptive" and cfg.trial_steps > 0 and self.widths[0] == 0 and positive:
            require(tuning.trial_every >= cfg.trial_steps, "trial_every", tuning.trial_every,
                    f"must be >= trial_steps = {cfg.trial_steps}")
            self.trials = RegimeTrials(TrialConfig(
                steps=cfg.trial_steps, every=tuning.trial_every, close=cfg.trial_close,
                margin=cfg.switch_margin, prior=tuning.trial_prior))

    @classmethod
    def from_profile(cls, cfg: PolicyConfig, block_size: int, samples: Iterable[Any], *,
                     widths: Sequence[int] | None = None, tuning: Tuning = TUNING,
                     pad_batch: bool = False) -> SpeculationPolicy:
        """Policy with a `CostModel` fitted from start-up profile samples."""
        cost = CostModel.from_profile(samples, ema=tuning.cost_ema,
                                      prior_weight=tuning.cost_prior_weight,
                                      outlier_ratio=tuning.cost_outlier_ratio, pad_batch=pad_batch)
        return cls(cfg, block_size, cost, widths=widths, tuning=tuning)

    # -- decision ---------------------------------------------------------

    def throughputs(self, batch_size: int) -> list[float]:
        """Predicted committed tokens/s for each candidate width (order of `widths`)."""
        if self.cost is None:
            raise policy_error("throughputs need a CostModel")
        commit = expected_commits(self.stats.mean)
        return [batch_size * commit[w] / self.cost.predict(batch_size, w) for w in self.widths]

    def choose_width(self, batch_size: int) -> int:
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
        if self.cfg.mode == "adaptive":
            thr = self.throughputs(batch_size)
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

    def last_decision(self, batch_size: int) -> list | None:
        """For the step trace: [best-on / off throughput ratio before the trials'
        bias, that W, its expected commits per request, its step time over
        W = 0's, W = 0's predicted ms] of the last adaptive step, or None."""
        thr = self.last_thr
        if thr is None or self.widths[0] != 0 or len(thr) < 2:
            return None
        i = _best_on(thr)
        c0, cw = self.cost.predict(batch_size, 0), self.cost.predict(batch_size, self.widths[i])
        return [round(thr[i] / thr[0], 4), self.widths[i], round(thr[i] * cw / batch_size, 3),
                round(cw / c0, 3), round(c0 * 1e3, 3)]

    def _trial_regime(self, batch_size: int, thr: list[float]) -> bool | None:
        """The regime a running on/off trial imposes (True = on), or None.
        Not before the cold start has decided a width."""
        if self.trials is None or self.width is None or self._cold_steps < self.tuning.cold_hold:
            return None
        best = _best_on(thr)
        predict = self.cost.predict
        cost_ratio = predict(batch_size, self.widths[best]) / predict(batch_size, 0)
        return self.trials.regime(self.steps, thr[best] / thr[0], self.width > 0, batch_size,
                                  cost_ratio)

    def _calibrated(self, thr: list[float], batch_size: int) -> list[float]:
        """Every W > 0 throughput times the trials' bias at this batch (W = 0 is
        plain decoding, the reference the bias is measured against)."""
        if self.trials is None:
            return thr
        k = self.trials.bias_at(batch_size)
        if k == 1.0:
            return thr
        return [t * k if w > 0 else t for w, t in zip(self.widths, thr)]

    def _run_trial(self, on: bool, thr: list[float]) -> int:
        """A trial step: off = W = 0; on = the model's best W > 0 (with the usual
        hysteresis among them). No probes inside a trial: it measures one regime."""
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
            # Cold start at the widest width: a server starts idle, where
            # speculation pays most, and the first steps then measure the wide end.
            self.width = self.widths[-1]
            return
        hold = self.tuning.cold_hold
        if self._cold_steps < hold and not self.cost.has_observations():
            # ... held until a step has been timed: the profile alone misses the
            # per-step overhead of a server (its scheduler), which favours off.
            self._cold_steps += 1
            return
        self._cold_steps = hold
        cur = self.widths.index(self.width)
        gain = thr[best] / thr[cur] - 1.0
        if best == cur or gain <= self.cfg.switch_margin:
            self._streak = 0
            return
        self._streak += 1
        if self._streak >= self.cfg.switch_patience or gain >= self.tuning.urgent_margin:
            self._switch(self.widths[best])

    # -- probes -----------------------------------------------------------

    def _maybe_probe(self, batch_size: int, thr: list[float]) -> int:
        """The width this step runs: the decided one, or a probe's.

        Three kinds start a probe: an off-cost refresh while on (`_off_refresh`),
        an early on probe while off (`_early_on_probe`), and the periodic probe
        (`_periodic_probe`) once every `probe_interval` steps (doubled after each
        probe up to `probe_backoff` times while the width and load stay the same).
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
        return self._periodic_probe(batch_size, thr) if probe is None else probe

    def _off_refresh(self, batch_size: int, thr: list[float]) -> int | None:
        """While on, a W = 0 probe (two steps longer than a periodic one) in a
        batch-size bucket where off was never timed (at most `early_off_probes`
        per bucket) or its estimate has gone stale while the call is close; None if
        neither. Why: until timed, W = 0 is predicted by the bucket's affine fit
        learned from wide steps only, which charges it their unexplained time.
        Only once the batch has settled in the bucket (not for one-step dips)."""
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
            # Its own samples decide: the old ones may come from another load.
            self.cost.forget(batch_size, 0, self.tuning.refresh_weight)
        self._last_off_probe[bucket] = self.steps
        return self._start_probe(0, self.tuning.probe_length + 2)

    def _periodic_probe(self, batch_size: int, thr: list[float]) -> int:
        """Once the interval has passed, a probe at another width (or the decided
        width while a costly probe must wait: `_probe_wait`)."""
        if self._since_probe < self.probe_interval:
            return self.width
        on = self.width != 0
        turn = self._probe_turns[on]
        probe = self._on_probe(turn) if on else self._off_probe(turn)
        if self._since_probe < self._probe_wait(batch_size, probe):
            return self.width
        self._backoff = min(2 * self._backoff, self._backoff_cap(thr))
        self._probe_turns[on] += 1
        return self._start_probe(probe, self.tuning.probe_length)

    def _backoff_cap(self, thr: list[float]) -> int:
        """The largest probe-interval multiplier now: `probe_backoff`, or while
        off with every W > 0 predicted below W = 0 (the probes so far confirm
        off) `off_probe_backoff`. Why: while off each probe costs plain steps
        (a speculative step's fixed cost for few tokens) and at a steady load
        mostly measures what the last one did; a probe whose sample moves the
        model toward speculation brings the cap back down at once."""
        cap = self.tuning.probe_backoff
        if self.width == 0 and max(thr[1:], default=0.0) < thr[0]:
            cap = max(cap, self.tuning.off_probe_backoff)
        return cap

    def _off_probe(self, turn: int) -> int:
        """While off: alternately `probe_width` and the widest candidate, so the
        policy notices when speculation pays again and the far end of the cost
        model is measured, not only taken from the start-up profile."""
        return self.probe_width if turn % 2 == 0 else self.widths[-1]

    def _on_probe(self, turn: int) -> int:
        """While on: every 4th probe at W = 0 (the off cost is mostly fixed
        overhead a profile cannot see), the others alternately one candidate
        narrower (its cost cell measured, not extrapolated) and one wider (the
        first unverified position's rate kept fresh); at the ends the inner one."""
        has_off = self.widths[0] == 0
        if has_off and turn % 4 == 3:
            return 0
        neighbour_turn = turn - turn // 4 if has_off else turn  # W = 0 turns skipped
        i = self.widths.index(self.width)
        down = (neighbour_turn % 2 == 0 and i > 0) or i == len(self.widths) - 1
        return self.widths[i - 1] if down else self.widths[i + 1]

    def _probe_wait(self, batch_size: int, probe: int) -> float:
        """Steps since the last probe before a probe at `probe` may run: its extra
        step time over the decided width's is held to `probe_share` of the time
        in between. Why: while off at a large batch a probe at the widest width
        costs several plain steps. Cheap probes are not held back."""
        share = self.tuning.probe_share
        if self.cost is None or share is None:
            return 0.0
        predict = self.cost.predict
        extra = predict(batch_size, probe) / predict(batch_size, self.width) - 1.0
        return max(0.0, self.tuning.probe_length * extra / share)

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
                and self._early_off_probes.get(bucket_of(batch_size), 0) < self.tuning.early_off_probes)

    def _early_on_probe(self, batch_size: int, thr: list[float]) -> int | None:
        """While off, a probe at the model's best W > 0 (two steps longer than a
        periodic one) once the batch settled in a bucket where no W > 0 step was
        timed yet, at most `early_on_probes` per bucket; None otherwise. Why: there
        W > 0 comes from the profile alone, and the periodic probes wait in
        proportion to its prediction, so a profile that overstates speculation's
        cost could keep it off for good."""
        if self.width != 0 or self.cost is None or self.widths[-1] == 0:
            return None
        early = self._settle_steps()
        if self._since_probe < early or self._bucket_run < early:
            return None
        bucket = bucket_of(batch_size)
        run = self._early_on_probes.get(bucket, 0)
        if run >= self.tuning.early_on_probes or any(
                self.cost.observed(batch_size, w) for w in self.widths if w > 0):
            return None
        self._early_on_probes[bucket] = run + 1
        return self._start_probe(self.widths[_best_on(thr)], self.tuning.probe_length + 2)

    def _off_estimate_stale(self, batch_size: int, thr: list[float]) -> bool:
        """On, W = 0 measured in this bucket, off predicted within `refresh_close`
        of the current width, and the estimate stale: not refreshed since the
        batch settled into this load (a step's cost depends on the contexts too),
        or, after two probe intervals without an off probe here, its aged weight
        below `stale_off_weight`. Why: otherwise a few early samples of one moment
        decide a bucket for the rest of a server's life."""
        if not (self.width > 0 and self.widths[0] == 0 and self.cost is not None
                and self.cost.observed(batch_size, 0)):
            return False
        last = self._last_off_probe.get(bucket_of(batch_size))
        new_load = last is None or last < self._settled_step
        if not new_load and self.steps - last < 2 * self.cfg.probe_interval:
            return False
        if not new_load and self.cost.cell_weight(batch_size, 0) >= self.tuning.stale_off_weight:
            return False
        return thr[self.widths.index(self.width)] < (1.0 + self.tuning.refresh_close) * thr[0]

    # -- feedback ---------------------------------------------------------

    def observe_verify(self, width: int, accept_lens: Sequence[int],
                       step_seconds: float | None, batch_size: int,
                       step: int | None = None) -> None:
        """Feed back one executed step at verify width `width` (host-side lists only).

        accept_lens[i]: accepted drafts of request i (0..width), bonus EXCLUDED.
        step_seconds: measured step time, or None when it must not train the cost
        model (not a pure decode step, or reported later by `observe_step_time`).
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
        self.stats.observe(width, accept_lens)
        if step is not None and self.trials is not None:
            self.trials.tokens(step, batch_size + sum(accept_lens))
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
        """The measured duration of one decode step at `width`, for callers that
        learn it after the acceptance feedback (start to the next step's start)."""
        if self.cost is not None:
            self.cost.observe(batch_size, width, step_seconds)

    def observe_period(self, seconds: float) -> None:
        """The wall time of the last chosen step, from its start to the next
        forward's start: the regime trials' measure of decode time."""
        if self.trials is not None and self.steps > 0:
            self.trials.period(self.steps - 1, seconds)

    # -- metrics ----------------------------------------------------------

    def snapshot(self) -> dict:
        """JSON-serializable state for metrics and logs."""
        bs = self.last_batch_size
        table = self._table(bs) if self.cost is not None and bs > 0 else None
        return {
            "mode": self.cfg.mode, "block_size": self.block_size, "widths": list(self.widths),
            "width": self.width, "last_width": self.last_width, "batch_size": bs,
            "steps": self.steps, "spec_steps": self.spec_steps,
            "spec_fraction": self.spec_steps / self.steps if self.steps else 0.0,
            "probe_steps": self.probe_steps, "probe_interval": self.probe_interval,
            "switches": self.switches,
            "acceptance_rates": [round(a, 4) for a in self.stats.mean],
            "acceptance_weights": [round(w, 1) for w in self.stats.weight],
            "expected_commit": [round(e, 4) for e in expected_commits(self.stats.mean)],
            "predicted_tokens_per_s": table,
            "predicted_tokens_per_s_by_bucket": self._bucket_tables(),
            "cost": self.cost.snapshot() if self.cost is not None else None,
            "trials": self.trials.snapshot() if self.trials is not None else None,
        }

    def _bucket_tables(self) -> dict | None:
        """Predicted tokens/s per width at the mean batch size of every observed
        bucket: what the policy would choose there now."""
        if self.cost is None:
            return None
        return {f"bs{bs}": self._table(bs) for bs in self.cost.bucket_batch_sizes()}

    def _table(self, bs: int) -> dict:
        return {str(w): round(t, 2) for w, t in zip(self.widths, self.throughputs(bs))}


def _check_widths(widths: Sequence[int] | None, top: int) -> tuple[int, ...]:
    if widths is None:
        return tuple(range(top + 1))
    w = list(widths)
    require(len(w) > 0 and all(is_int(x) and x >= 0 for x in w), "widths", w,
            "must be a non-empty list of ints >= 0")
    require(w == sorted(set(w)), "widths", w, "must be strictly increasing")
    require(w[-1] <= top, "widths", w, f"must be <= block_size - 1 = {top}")
    return tuple(w)
