from sglang_dflash.stats import SpecStats, StepClock


def test_counts_by_position_and_ratios():
    s = SpecStats(3)
    s.observe(3, [0, 3, 1])  # req0 rejected at 1; req1 all; req2 rejected at 2
    s.observe(0, [0, 0])  # off: nothing reached
    s.observe(1, [1])
    snap = s.snapshot()
    assert s.reached == [4, 2, 1] and s.accepted == [3, 1, 1]
    assert snap["spec_on_ratio"] == 2 / 3
    assert snap["current_width"] == 1
    assert snap["mean_acceptance_length"] == (1 + 4 + 2 + 1 + 1 + 2) / 6
    assert snap["acceptance_by_position"] == [0.75, 0.5, 1.0]
    assert snap["steps_by_width"] == [1, 1, 0, 1]
    assert snap["width_changes"] == 2  # 3 -> 0 -> 1
    # Drafts actually verified (3 x 3 + 0 + 1), not B-1 per request-step.
    assert snap["verified_drafts"] == 10 and snap["correct_drafts"] == 5
    assert snap["draft_accept_rate"] == 0.5


def test_width_changes_count_only_changes():
    s = SpecStats(7)
    for w in (7, 7, 0, 0, 2, 0, 7):
        s.observe(w, [0])
    assert s.snapshot()["width_changes"] == 4
    assert s.snapshot()["steps_by_width"] == [3, 0, 1, 0, 0, 0, 0, 3]


def _run(clock, events):
    """Feed (kind, arg, now) events; collect the samples as (width, bs, seconds)."""
    out = []
    for kind, arg, now in events:
        if kind == "decode":
            bs, width = arg
            s = clock.decode_started(bs, now)
            clock.ran(width)
        else:
            s = clock.prefill_started(now, idle_before=arg)
        if s is not None:
            out.append((s.width, s.batch_size, round(s.seconds, 9)))
    return out


def test_step_clock_periods_run_start_to_start_and_end_at_a_busy_prefill():
    clock = StepClock(overlap=False)
    events = [("decode", (4, 7), 0.0), ("decode", (4, 7), 0.05), ("decode", (3, 2), 0.12),
              ("prefill", False, 0.15), ("decode", (4, 0), 0.40), ("decode", (4, 0), 0.42)]
    # The prefill closes the W = 2 step at its start; the first decode after
    # the prefill is timed from its own start (0.40), not from the prefill.
    assert _run(clock, events) == [(7, 4, 0.05), (7, 4, 0.07), (2, 3, 0.03), (0, 4, 0.02)]


def test_step_clock_drops_the_period_that_ends_in_idle_time():
    clock = StepClock(overlap=False)
    # Every request of the last step finished; the next prefill comes 5 s later
    # (another benchmark cell): that gap is no step cost.
    events = [("decode", (1, 7), 0.0), ("decode", (1, 7), 0.02),
              ("prefill", True, 5.0), ("decode", (1, 7), 5.1), ("decode", (1, 7), 5.12)]
    assert _run(clock, events) == [(7, 1, 0.02), (7, 1, 0.02)]


def test_step_clock_under_overlap_needs_the_same_width_twice():
    clock = StepClock(overlap=True)
    events = [("decode", (8, 7), 0.0), ("decode", (8, 7), 0.1), ("decode", (8, 0), 0.2),
              ("decode", (8, 0), 0.25), ("decode", (8, 0), 0.3), ("decode", (8, 7), 0.35),
              ("prefill", False, 0.5), ("decode", (8, 7), 0.6), ("decode", (8, 7), 0.7),
              ("decode", (8, 7), 0.8)]
    # A period counts only when the step before it ran the same width (its
    # period holds that step's result processing); the first step after a
    # prefill processes the prefill's result, so the second is the first sample.
    assert _run(clock, events) == [(7, 8, 0.1), (0, 8, 0.05), (0, 8, 0.05), (7, 8, 0.1)]


def test_step_clock_reports_every_closed_period_for_served_throughput():
    """`last_period` is each decode step's wall time, also where the period is
    no cost sample (under overlap), and None after idle time or a prefill."""
    clock = StepClock(overlap=True)
    periods = []
    events = [("decode", (8, 7), 0.0), ("decode", (8, 0), 0.1), ("decode", (8, 0), 0.15),
              ("prefill", False, 0.2), ("decode", (8, 0), 0.3), ("prefill", True, 5.0),
              ("decode", (8, 0), 5.1), ("decode", (8, 0), 5.12)]
    for kind, arg, now in events:
        if kind == "decode":
            sample = clock.decode_started(arg[0], now)
            clock.ran(arg[1])
        else:
            sample = clock.prefill_started(now, idle_before=arg)
        periods.append(None if clock.last_period is None else round(clock.last_period, 9))
        if sample is not None:
            assert sample.seconds == clock.last_period
    # W = 7 then W = 0: no sample (overlap), but a period; the prefill closes
    # the W = 0 step; after the prefill no decode period is open; idle: none.
    assert periods == [None, 0.1, 0.05, 0.05, None, None, None, 0.02]
