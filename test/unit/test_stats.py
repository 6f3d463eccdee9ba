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
    assert snap["steps_by_width"] == [1, 1, 0, 1]
    assert snap["width_changes"] == 2  # 3 -> 0 -> 1


def test_width_changes_count_only_changes():
    s = SpecStats(7)
    for w in (7, 7, 0, 0, 2, 0, 7):
        s.observe(w, [0])
    assert s.snapshot()["width_changes"] == 4
    assert s.snapshot()["steps_by_width"] == [3, 0, 1, 0, 0, 0, 0, 3]
