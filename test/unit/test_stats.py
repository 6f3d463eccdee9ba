from sglang_dflash.stats import SpecStats


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
