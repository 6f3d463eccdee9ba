"""Counters of speculation outcomes, kept on the host from per-step accept counts."""

from __future__ import annotations

from dataclasses import dataclass


class SpecStats:
    """Steps, how many speculated, committed tokens, and acceptance by draft position.

    `observe(width, accept_lens)` takes the step's verify width and the accepted
    drafts per request (bonus excluded). Position j (1-based) is *reached* by a
    request when width >= j and its first j-1 drafts were accepted.
    """

    def __init__(self, max_width: int):
        self.max_width = max_width
        self.steps = 0
        self.spec_steps = 0
        self.request_steps = 0
        self.committed = 0
        self.last_width = 0
        self.reached = [0] * max_width
        self.accepted = [0] * max_width
        self.width_steps = [0] * (max_width + 1)  # decode steps run at each width
        self.width_changes = 0
        # Wall time, for seeing where a server's time goes: decode step periods
        # as fed to the policy (start to next start, prefill-free), and prefill
        # forwards (the target's extend plus the drafter context of the prompt).
        self.timed_seconds = [0.0] * (max_width + 1)
        self.timed_steps = [0] * (max_width + 1)
        self.prefill_seconds = 0.0
        self.prefill_steps = 0
        # Prefills that also decoded running requests one token each
        # (--enable-mixed-chunk), and those requests' rows.
        self.mixed_prefills = 0
        self.mixed_decode_rows = 0
        # Drafts the target verified and accepted: SGLang's own accept rate
        # assumes B-1 verified drafts per step, which W < B-1 and W = 0 break.
        self.verified_drafts = 0
        self.correct_drafts = 0

    def time_step(self, width: int, seconds: float) -> None:
        self.timed_seconds[width] += seconds
        self.timed_steps[width] += 1

    def time_prefill(self, seconds: float, decode_rows: int = 0) -> None:
        self.prefill_seconds += seconds
        self.prefill_steps += 1
        self.mixed_prefills += decode_rows > 0
        self.mixed_decode_rows += decode_rows

    def observe(self, width: int, accept_lens: list[int]) -> None:
        """One decode step at width W: accepted drafts per request."""
        self.steps += 1
        self.spec_steps += width > 0
        self.width_changes += self.steps > 1 and width != self.last_width
        self.width_steps[width] += 1
        self.last_width = width
        self.request_steps += len(accept_lens)
        self.committed += sum(accept_lens) + len(accept_lens)
        self.verified_drafts += width * len(accept_lens)
        self.correct_drafts += sum(accept_lens)
        for a in accept_lens:
            for j in range(min(a + 1, width)):
                self.reached[j] += 1
                self.accepted[j] += j < a

    def snapshot(self) -> dict:
        rates = [a / r if r else None for a, r in zip(self.accepted, self.reached)]
        return {
            "steps": self.steps,
            "current_width": self.last_width,
            "spec_on_ratio": self.spec_steps / self.steps if self.steps else None,
            "mean_acceptance_length": self.committed / self.request_steps if self.request_steps else None,
            "acceptance_by_position": rates,
            "steps_by_width": list(self.width_steps),
            "width_changes": self.width_changes,
            "timed_step_ms_by_width": [round(1e3 * t / n, 3) if n else None
                                       for t, n in zip(self.timed_seconds, self.timed_steps)],
            "timed_steps_by_width": list(self.timed_steps),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "prefill_steps": self.prefill_steps,
            "mixed_prefills": self.mixed_prefills,
            "mixed_decode_rows": self.mixed_decode_rows,
            "verified_drafts": self.verified_drafts,
            "correct_drafts": self.correct_drafts,
            "draft_accept_rate": (self.correct_drafts / self.verified_drafts
                                  if self.verified_drafts else None),
        }


@dataclass(frozen=True, slots=True)
class StepSample:
    """One timed decode step: its verify width, batch size and period."""

    width: int
    batch_size: int
    seconds: float


class StepClock:
    """Periods of decode steps, from a step's start to the next step's start.

    The period, not the forward alone, is what a decode step costs a server:
    it holds the scheduler's own per-step work (result processing, streaming,
    preparing the next batch), which does not grow with the verify width and
    is what makes wide verifies pay on a CPU server. Which periods are samples:
    * a decode step followed by a decode step: yes;
    * a decode step followed by a prefill: yes, up to the prefill's start,
      unless the server idled in between (every request of that step had
      finished, so the scheduler waited for new requests: the gap is idle time,
      seconds between benchmark cells, no step cost);
    * a prefill is no decode step's cost: the next decode step's period starts
      at that step's own start;
    * under the overlap scheduler a period also holds the processing of the
      step BEFORE it (results are processed one step late), so it counts only
      when that step ran the same width: a lone W = 0 step must not be charged
      a wide step's commit processing (probes therefore last two steps), and
      the first decode step after a prefill (it processes the prefill's result)
      is not a sample.

    Usage: `decode_started(bs, now)` at a decode step's start, then
    `ran(width)` once its width is chosen; `prefill_started(now, idle)` at a
    prefill's start. Both `*_started` return the closed period's sample or None.
    `last_period` is then the closed period's seconds whether or not it is a
    sample (None when none closed, or the server idled): every decode step's
    wall time, for measuring served throughput (the policy's regime trials).
    """

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self._start: tuple[int, float] | None = None  # (batch size, start) of the open step
        self._width: int | None = None  # ... the width it ran
        self._prior: int | None = None  # width of the decode step before it
        self.last_period: float | None = None

    def decode_started(self, batch_size: int, now: float) -> StepSample | None:
        sample = self._close(now)
        self._prior, self._width = self._width, None
        self._start = (batch_size, now)
        return sample

    def ran(self, width: int) -> None:
        self._width = width

    def prefill_started(self, now: float, idle_before: bool) -> StepSample | None:
        if idle_before:
            self.last_period = None
        sample = None if idle_before else self._close(now)
        self._start = self._width = self._prior = None
        return sample

    def _close(self, now: float) -> StepSample | None:
        self.last_period = None
        if self._start is None or self._width is None:
            return None
        bs, start = self._start
        self.last_period = now - start
        if self.overlap and self._prior != self._width:
            return None
        return StepSample(self._width, bs, now - start)
