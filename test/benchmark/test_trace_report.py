"""benchmark/trace_report.py on a synthetic step trace: stretches split at idle
gaps, warm-up stretches dropped, width counts and step periods per stretch."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import trace_report  # noqa: E402


def _line(pid, t, kind, bs, width, sample=None):
    return {"pid": pid, "t": t, "kind": kind, "bs": bs, "width": width, "sample": sample}


def _write(tmp_path, rows):
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_stretches_widths_and_periods(tmp_path):
    rows = [_line(7, 0.0, "prefill", 1, None), _line(7, 0.1, "decode", 1, 7)]  # warm-up
    t = 100.0  # cell 1: batch 1, W = 7 then W = 6, with samples of the previous step
    rows.append(_line(7, t, "prefill", 1, None))
    for i in range(60):
        w = 7 if i < 40 else 6
        sample = None if i == 0 else [7 if i <= 40 else 6, 1, 20.0 if i <= 40 else 30.0]
        rows.append(_line(7, t + 0.02 * (i + 1), "decode", 1, w, sample))
    t = 200.0  # cell 2: batch 4, off
    for i in range(50):
        rows.append(_line(7, t + 0.01 * i, "decode", 4, 0, None if i == 0 else [0, 4, 10.0]))
    rows.append(_line(9, 5.0, "decode", 2, 3))  # another server, a single step
    out = trace_report.report([_write(tmp_path, rows)], gap=5.0, min_steps=50)
    assert [(r["pid"], r["stretch"]) for r in out] == [(7, 0), (7, 1)]
    first, second = out
    assert first["decode_steps"] == 60 and first["prefills"] == 1
    assert first["widths"] == {6: 20, 7: 40} == first["widths_at_bs1"]
    assert first["step_ms"] == {6: 30.0, 7: 20.0}
    assert first["spec_share"] == 1.0
    assert second["widths"] == {0: 50} and second["widths_at_bs1"] == {}
    assert second["spec_share"] == 0.0 and second["median_bs"] == 4
    md = trace_report.markdown(out)
    assert md.count("\n") == 4 and "| 7 | 1 |" in md


def test_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_line(1, 0.0, "decode", 1, 7)) + "\nnot json\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: not a step-trace line"):
        trace_report.read_trace([str(path)])


def test_reads_a_gzipped_trace_like_a_plain_one(tmp_path):
    import gzip

    rows = [_line(3, 0.01 * i, "decode", 2, 7, None if i == 0 else [7, 2, 15.0]) for i in range(60)]
    plain = _write(tmp_path, rows)
    packed = str(tmp_path / "steps.jsonl.gz")
    with open(plain, "rb") as src, gzip.open(packed, "wb") as dst:
        dst.write(src.read())
    want = trace_report.report([plain], gap=5.0, min_steps=50)
    assert want and trace_report.report([packed], gap=5.0, min_steps=50) == want
