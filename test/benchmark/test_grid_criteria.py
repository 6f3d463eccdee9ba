"""benchmark/grid_criteria.py: the adaptive policy's criteria, on synthetic cells."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import grid_criteria  # noqa: E402


def _cells(values):
    """values: {(config, concurrency): [tok/s per repetition]} for workload math."""
    return [{"workload": "math", "concurrency": c, "config": name, "rep": rep, "completed": 8,
             "output_throughput": tps}
            for (name, c), reps in values.items() for rep, tps in enumerate(reps)]


def test_ratios_are_taken_within_a_repetition_then_medianed():
    rows = grid_criteria.adaptive_criteria(_cells({
        ("plain", 1): [100, 200, 100], ("dflash-on", 1): [300, 600, 300],
        ("dflash-off", 1): [90, 180, 90], ("dflash-adaptive", 1): [290, 580, 300]}))
    (row,) = rows
    assert row["vs_plain"]["median"] == pytest.approx(2.9)
    assert row["vs_best_fixed"]["median"] == pytest.approx(290 / 300)
    assert row["off_vs_plain"]["median"] == pytest.approx(0.9)
    assert row["pass"] is True


def test_off_vs_plain_is_reported_but_not_a_criterion():
    cells = _cells({("plain", 8): [100, 100], ("dflash-on", 8): [200, 200],
                    ("dflash-off", 8): [60, 130], ("dflash-adaptive", 8): [195, 196]})
    (row,) = grid_criteria.adaptive_criteria(cells)
    assert row["pass"] is True  # off far below plain in one repetition does not fail the cell
    off = row["off_vs_plain"]
    assert (off["min"], off["max"]) == (pytest.approx(0.6), pytest.approx(1.3))
    md = "\n".join(grid_criteria.adaptive_criteria_md({"cells": cells}))
    assert "| off vs plain |" in md and "| math | 8 |" in md
    assert md.splitlines()[-1].endswith("| 0.95 [0.60-1.30] |"), md.splitlines()[-1]


@pytest.mark.parametrize("adaptive,on,off,plain,conc,ok", [
    (96, 200, 100, 100, 8, False),   # below 0.97 x plain
    (180, 200, 100, 100, 8, False),  # below 0.95 x the better fixed mode
    (190, 200, 100, 100, 8, True),
    (190, 200, 100, 100, 1, True),   # 0.95 x on at c = 1
    (185, 200, 100, 100, 1, False),
])
def test_each_criterion_can_fail(adaptive, on, off, plain, conc, ok):
    (row,) = grid_criteria.adaptive_criteria(_cells({
        ("plain", conc): [plain], ("dflash-on", conc): [on], ("dflash-off", conc): [off],
        ("dflash-adaptive", conc): [adaptive]}))
    assert row["pass"] is ok


def test_each_adaptive_variant_gets_its_own_criteria_table():
    cells = _cells({("plain", 8): [100, 100], ("dflash-on", 8): [200, 200],
                    ("dflash-off", 8): [100, 100], ("dflash-adaptive", 8): [195, 196],
                    ("dflash-adaptive-prev", 8): [150, 150]})
    md = "\n".join(grid_criteria.adaptive_criteria_md({"cells": cells}))
    assert "### `dflash-adaptive` against" in md and "### `dflash-adaptive-prev` against" in md
    (variant,) = grid_criteria.adaptive_criteria(cells, "dflash-adaptive-prev")
    assert variant["pass"] is False and variant["vs_best_fixed"]["median"] == pytest.approx(0.75)


def test_a_second_always_on_server_is_reported_as_a_control_not_a_criterion():
    cells = _cells({("plain", 1): [100, 100, 100], ("dflash-on", 1): [300, 300, 300],
                    ("dflash-on-2", 1): [330, 240, 300], ("dflash-off", 1): [100, 100, 100],
                    ("dflash-adaptive", 1): [300, 300, 300]})
    (row,) = grid_criteria.adaptive_criteria(cells)
    assert row["on2_vs_on"]["median"] == pytest.approx(1.0)
    assert (row["on2_vs_on"]["min"], row["on2_vs_on"]["max"]) == pytest.approx((0.8, 1.1))
    assert row["pass"] is True
    md = "\n".join(grid_criteria.adaptive_criteria_md({"cells": cells}))
    assert "on-2 vs on |" in md and "1.00 [0.80-1.10] |" in md
    # without the second server the column is left out
    cells = [c for c in cells if c["config"] != "dflash-on-2"]
    assert "on-2 vs on" not in "\n".join(grid_criteria.adaptive_criteria_md({"cells": cells}))
