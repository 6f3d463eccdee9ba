"""Regime trials: calibrate the policy's on-versus-off comparison by measurement.

The cost model compares widths at the batch it sees. Served end to end under a
fixed number of clients (a closed loop), that comparison leans toward
speculation: speculating finishes requests in fewer steps, so more clients sit
outside the decode batch (prefill, round trip) and the batch shrinks, and
plain decoding amortizes its step over a larger batch than the model assumes.

So where the model calls on and off close (the corrected best-on / off ratio
within (1 / (1 + `close`), 1 + `close`)), a trial runs the other regime for
`steps` decode steps and compares the decode throughput of its second half
(committed tokens per second of step periods; the first half lets the batch
settle) with the same number of steps just before it. The measured on/off ratio
over the model's own ratio is the trial's bias; the policy multiplies its W > 0
throughput predictions by the mean bias of the last `_MEMORY` trials. The model
still chooses per step; only its on/off scale is corrected.

Trials run after the policy's regime held for `steps` steps on a steady batch
(within a factor `_MOVE_BS`), again at the same load after `every` steps, and
never more than 1 / `_SHARE` of the decode time. A bias belongs to a load: once
the batch stays outside a factor `_MOVE_BS` for half a trial it is dropped;
a bias below 1 stays as a prior (`prior`) at the next load (the lean grows with
load) until measured there. While off, a trial runs only where the bias alone
keeps the policy off. A regime that flaps (`_FLAPS` switches within a trial's
length) never holds long enough for a baseline, so a flap trial runs off, then
on, and compares their second halves. A trial whose measured half ramped or
drained, or was not fed (idle), gives no evidence; one whose batch leaves a
factor `_DRAIN_BS` of its start stops at once.

Prefill time is left out: each request is prefilled once in either regime.
Host-side arithmetic on lists the worker already has; no device tensor.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

_LAG = 4  # steps a trial runs past its measured part: the accept counts arrive late
_MOVE_BS = 1.5  # a batch outside this factor of the last trial's is another load
_DRAIN_BS = 2.0  # a running trial stops when the batch leaves this factor of its start
_MEMORY = 3  # trials averaged into the bias
_SHARE = 16  # trials take at most 1 / _SHARE of the decode time (a due trial waits)
_FLAPS = 4  # regime switches within one trial's length that make a flapping regime


@dataclass(frozen=True, slots=True)
class TrialConfig:
    steps: int  # decode steps per trial; its second half is measured
    every: int  # steps from one trial's end to the next while the load holds
    close: float  # trials run while the corrected on/off ratio is in (1 / (1 + close), 1 + close)
    margin: float  # the policy's switch margin: the model alone runs on above 1 + margin
    prior: bool = True  # keep a bias below 1 as a prior when the load moves (see above)


@dataclass(slots=True)
class _Trial:
    on: bool  # the regime the trial runs: True = speculation (W > 0), False = off
    start: int  # first step of the trial
    base_start: int  # first step of the baseline (the steps before the trial)
    first: int  # first step the trial imposes a regime (< start: a forced baseline)


class RegimeTrials:
    """Runs on/off trials and keeps the bias they measured.

    Per step the policy calls `regime(step, ratio, on, batch_size)` with the
    model's uncorrected best-on/off throughput ratio and its own regime, and
    gets the regime a running trial imposes, or None: then it decides with its
    W > 0 throughputs multiplied by `bias`. `tokens(step, n)` and
    `period(step, seconds)` feed each executed step's committed tokens and
    period, late and in any order.
    """

    def __init__(self, cfg: TrialConfig) -> None:
        self.cfg = cfg
        self.trial: _Trial | None = None
        self.trials = 0  # trials evaluated
        self.trial_steps = 0  # steps run inside trials
        self.log_bias: deque[float] = deque(maxlen=_MEMORY)  # per trial: log(measured / model)
        self.last_measured: float | None = None  # the last trial's measured on/off ratio
        self._ended: int | None = None  # step at which the last trial ended
        self._clock = 0.0  # decode seconds fed so far
        self._ended_clock = 0.0  # ... when the last trial ended
        self._load: int | None = None  # the batch the bias was measured at (None: no bias)
        self._prior: tuple[float, int] | None = None  # (mean log bias < 0, its load) of a past load
        self._moved = 0  # consecutive steps the batch has been outside a factor _MOVE_BS of it
        self._since_change = 0  # steps the policy's regime has held
        self._switched: deque[int] = deque(maxlen=_FLAPS)  # steps of the last regime switches
        self.flap_trials = 0  # trials started because the regime flapped
        self._last_on: bool | None = None
        # step -> [committed tokens, period seconds, batch size, model ratio] of
        # recent steps (tokens and period None until fed)
        self._steps: dict[int, list] = {}
        self._window = 2 * cfg.steps + _LAG + 8

    @property
    def bias(self) -> float:
        """Measured over predicted on/off throughput ratio (1 before any trial)."""
        return math.exp(self._mean_log_bias())

    def _mean_log_bias(self) -> float:
        return sum(self.log_bias) / len(self.log_bias) if self.log_bias else 0.0

    def bias_at(self, batch_size: int) -> float:
        """The bias the policy applies at `batch_size`: this load's measured
        one, else a past load's prior, in full at its batch or above, shrunk
        toward 1 below it (a smaller batch leaves fewer clients outside it and
        a flatter step cost), else 1."""
        if self.log_bias or self._prior is None:
            return self.bias
        log_bias, load = self._prior
        return math.exp(log_bias * min(1.0, batch_size / load))

    # -- feedback ---------------------------------------------------------

    def tokens(self, step: int, committed: int) -> None:
        row = self._steps.get(step)
        if row is not None:
            row[0] = committed

    def period(self, step: int, seconds: float) -> None:
        self._clock += seconds
        row = self._steps.get(step)
        if row is not None:
            row[1] = seconds

    # -- decision ---------------------------------------------------------

    def regime(self, step: int, ratio: float, on: bool, batch_size: int,
               cost_ratio: float = 1.0) -> bool | None:
        """The regime step `step` must run in (True = on), or None outside trials.

        ratio: the model's best W > 0 throughput over W = 0's at this batch,
        before the bias; on: the regime the policy is in; cost_ratio: the
        model's step time of that width over W = 0's (how long a trial lasts)."""
        self._remember(step, batch_size, ratio)
        changed = self._last_on is not None and on != self._last_on
        self._since_change = 1 if changed else self._since_change + 1
        self._last_on = on
        c = self.cfg
        if self.trial is not None:
            start_bs = self._steps[self.trial.first][2]
            if not _near(batch_size, start_bs, _DRAIN_BS):
                # The load drains (or bursts) under the trial: its measure would
                # not be this load's, and the drain's last requests would wait
                # on the trial's regime (off at batch 4 is ~3x slower per request).
                # A wider band than _MOVE_BS: the trial's own regime moves the
                # batch too (off lets it grow, on shrinks it).
                self.trial, self._ended, self._ended_clock = None, step, self._clock
                return None
            if step < self.trial.start + c.steps + _LAG:
                self.trial_steps += 1
                return self.trial.on if step >= self.trial.start else not self.trial.on
            self._evaluate(step, batch_size)
            self._switched.clear()  # the trial's own switches are no flapping
            return None
        if changed:
            self._switched.append(step)
        self._follow_load(batch_size)
        bias = self.bias_at(batch_size)
        corrected = ratio * bias
        if not 1.0 / (1.0 + c.close) < corrected < 1.0 + c.close:
            return None
        # A flapping regime is a close call the model cannot settle: no regime
        # holds for a baseline, so a flap trial measures both (_flap_trial).
        flapping = sum(s > step - c.steps for s in self._switched) >= _FLAPS
        if not flapping:
            if not on and (ratio <= 1.0 + c.margin or bias >= 1.0):
                return None  # off by the model's own judgement (which errs toward on): no check
            if not on and not self.log_bias and batch_size > self._prior[1]:
                return None  # off by a prior from a smaller load: speculation costs more here
            if self._since_change < c.steps:
                return None  # the regime has not held long enough for a baseline
        same_load = self._load is not None
        if same_load and step - self._ended < c.every:
            return None  # the same load as the last trial: not yet again
        if not self._steady(step - c.steps // 2, step, batch_size):
            return None
        if same_load:  # trials take at most 1 / _SHARE of the decode time
            wait = (_SHARE - 1) * self._duration(step, not on, cost_ratio)
            if flapping:  # a flap trial runs both regimes
                wait += (_SHARE - 1) * self._duration(step, on, cost_ratio)
            if self._clock - self._ended_clock < wait:
                return None
        self._switched.clear()
        if flapping:
            return self._flap_trial(step)
        self.trial = _Trial(not on, step, step - c.steps // 2, step)
        self.trial_steps += 1
        return self.trial.on

    def _flap_trial(self, step: int) -> bool:
        """A trial for a flapping regime: off for `steps` steps (the second
        half is the baseline), then speculation for `steps`, measured as usual.

        Why: where the model's on/off ratio hovers around 1 within its own
        noise, the regime switches every few dozen steps despite hysteresis,
        so no ordinary trial ever finds a baseline; this one makes its own."""
        c = self.cfg
        start = step + c.steps
        self.trial = _Trial(True, start, start - c.steps // 2, step)
        self.trial_steps += 1
        self.flap_trials += 1
        return False

    def _follow_load(self, batch_size: int) -> None:
        """Drop the bias once the batch has stayed outside a factor _MOVE_BS of
        the one it was measured at for half a trial: another load (another
        share of clients outside the batch, another prefill rate) needs its
        own measurement, and until then the model alone decides. Not for a
        drain or a dip: those pass within half a trial."""
        if self._load is None:
            return
        inside = _near(batch_size, self._load, _MOVE_BS)
        self._moved = 0 if inside else self._moved + 1
        if self._moved >= self.cfg.steps // 2:
            mean = self._mean_log_bias()
            self._prior = (mean, self._load) if self.cfg.prior and mean < 0 else None
            self.log_bias.clear()
            self._load, self._moved = None, 0

    def _duration(self, step: int, trial_on: bool, cost_ratio: float) -> float:
        """Decode seconds a trial starting now would last: its steps at the
        baseline's mean period, scaled by the model's step-time ratio (a trial
        of speculation at a large batch lasts several times one of off)."""
        c = self.cfg
        periods = [r[1] for s in range(step - c.steps // 2, step)
                   if (r := self._steps.get(s)) is not None and r[1] is not None]
        if not periods:
            return 0.0
        scale = cost_ratio if trial_on else 1.0 / cost_ratio
        return (c.steps + _LAG) * sum(periods) / len(periods) * scale

    def _steady(self, first: int, end: int, batch_size: int) -> bool:
        """Every step in [first, end) ran at a batch within a factor _MOVE_BS of
        `batch_size` (not a ramp, a drain or a burst)."""
        for s in range(first, end):
            row = self._steps.get(s)
            if row is None or not _near(row[2], batch_size, _MOVE_BS):
                return False
        return True

    def _evaluate(self, step: int, batch_size: int) -> None:
        t, c = self.trial, self.cfg
        self.trial, self._ended, self._ended_clock = None, step, self._clock
        end = t.start + c.steps
        trial = self._measure(end - c.steps // 2, end)
        base = self._measure(t.base_start, t.start)
        if trial is None or base is None:
            return  # too few steps fed (idle gaps): no evidence either way
        before = self._steps.get(t.start - 1)
        if before is None or not self._steady(end - c.steps // 2, end, before[2]):
            return  # the load ramped or drained during the trial: not the same load
        (on_thr, on_model), (off_thr, off_model) = (trial, base) if t.on else (base, trial)
        measured = on_thr / off_thr
        # The model's ratio over the same steps: geometric mean of both halves.
        predicted = math.sqrt(on_model * off_model)
        if self._load is None or not _near(batch_size, self._load, _MOVE_BS):
            self.log_bias.clear()  # the first trial of this load
        self._load, self._moved = batch_size, 0
        self.log_bias.append(math.log(measured / predicted))
        self.last_measured = measured
        self.trials += 1

    def _measure(self, first: int, end: int) -> tuple[float, float] | None:
        """(committed tokens per second, geometric mean model ratio) over the
        fed steps in [first, end); None when fewer than half were fed."""
        tokens = seconds = log_ratio = 0.0
        fed = 0
        for s in range(first, end):
            row = self._steps.get(s)
            if row is None or row[0] is None or row[1] is None:
                continue
            tokens += row[0]
            seconds += row[1]
            log_ratio += math.log(row[3])
            fed += 1
        if fed * 2 < end - first or seconds <= 0 or tokens <= 0:
            return None
        return tokens / seconds, math.exp(log_ratio / fed)

    def _remember(self, step: int, batch_size: int, ratio: float) -> None:
        self._steps[step] = [None, None, batch_size, ratio]
        old = step - self._window
        self._steps.pop(old, None)
        if len(self._steps) > self._window + 1:  # steps were skipped: prune by age
            for s in [s for s in self._steps if s <= old]:
                del self._steps[s]

    def snapshot(self) -> dict:
        return {
            "bias": round(self.bias, 4),
            "in_trial": self.trial is not None,
            "trials": self.trials,
            "trial_steps": self.trial_steps,
            "flap_trials": self.flap_trials,
            "last_measured_on_over_off": None if self.last_measured is None
            else round(self.last_measured, 4),
            "log_bias": [round(x, 4) for x in self.log_bias],
            "prior": None if self._prior is None
            else {"bias": round(math.exp(self._prior[0]), 4), "load": self._prior[1]},
        }


def _near(batch_size: int, reference: float, factor: float) -> bool:
    """`batch_size` within a factor `factor` of `reference` (both ways)."""
    return reference / factor <= batch_size <= reference * factor
