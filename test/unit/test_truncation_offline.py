"""benchmark/truncation_offline.py: the replay of truncation on recorded steps
(synthetic records: confidences per slot and the drafts the target accepted)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import truncation_offline as T  # noqa: E402


RECORDS = [
    ([0.9, 0.9, 0.9], 3),  # survival 0.9, 0.81, 0.73: all accepted
    ([0.6, 0.9, 0.9], 0),  # survival 0.6, 0.54, 0.49: rejected at once
    ([1.0, 0.5, 1.0], 1),  # survival 1, 0.5, 0.5: accepted one
]


def test_tradeoff_replays_uniform_widths_and_thresholds():
    t = T.tradeoff(RECORDS, 3)
    assert t["steps"] == 3
    assert [u["committed"] for u in t["uniform"]] == [1.0, 5 / 3, 2.0, 7 / 3]
    by_t = {g["threshold"]: g for g in t["ragged"]}
    # t = 0.7: limits 3, 0, 1 -> verified 4 + 1 + 2, committed 4 + 1 + 2
    assert by_t[0.7]["verified"] == 7 / 3 and by_t[0.7]["committed"] == 7 / 3
    # t = 0.5: limits 3, 2, 3 -> verified 4 + 3 + 4, committed 4 + 1 + 2
    assert by_t[0.5]["verified"] == 11 / 3 and by_t[0.5]["committed"] == 7 / 3
    # t = 0.9: limits 1, 0, 1 -> committed 2 + 1 + 2
    assert by_t[0.9]["committed"] == 5 / 3


def test_calibration_counts_reached_slots_only():
    cal = {round(b["low"] * 10): b for b in T.calibration(RECORDS, 3)}
    # Reached: step 1 all 3 slots (0.9 x3, accepted), step 2 slot 0 (0.6, rejected),
    # step 3 slots 0-1 (1.0 accepted -> bin 9, 0.5 rejected -> bin 5).
    assert cal[9]["reached"] == 4 and cal[9]["accepted"] == 1.0
    assert cal[6]["reached"] == 1 and cal[6]["accepted"] == 0.0
    assert cal[5]["reached"] == 1 and cal[5]["accepted"] == 0.0


def test_interpolated_uniform_committed():
    uniform = T.tradeoff(RECORDS, 3)["uniform"]
    assert T._interp_uniform(uniform, 1.5) == (1.0 + 5 / 3) / 2
