"""benchmark/memory.py's pure parts: the worker's context-pool log line parsed,
drafter bytes from safetensors headers, the bound plain + drafter + pool + 10%,
the rows and table built from a memory.json-like result."""

import json
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import memory  # noqa: E402

MIB = 1024 * 1024
# The line as the worker's _log_context_pool logs it, with SGLang's log prefix.
POOL_LINE = ("[2026-12-04 13:51:05] sglang-dflash: drafter context pool 126977 slots x 1024 B = "
             "124.0 MiB (SGLang's KV budget counts 1024 B/token for it)")


def test_parse_context_pool():
    text = "INFO something else\n" + POOL_LINE + "\nDecode batch, #running-req: 4, ...\n"
    pool = memory.parse_context_pool(text)
    assert pool == {"slots": 126977, "bytes_per_slot": 1024, "bytes": 126977 * 1024,
                    "logged_mib": 124.0, "budget_counted": 1024}


def test_parse_context_pool_budget_none_and_last_line_wins():
    first = POOL_LINE.replace("126977", "10")
    second = ("sglang-dflash: drafter context pool 20 slots x 512 B = 0.0 MiB "
              "(SGLang's KV budget counts None B/token for it)")
    pool = memory.parse_context_pool(first + "\n" + second + "\n")
    assert pool["slots"] == 20 and pool["bytes"] == 20 * 512 and pool["budget_counted"] is None


def test_parse_context_pool_absent():
    assert memory.parse_context_pool("plain server log, no drafter\n") is None


def test_max_running_requests():
    text = ("Decode batch, #running-req: 16, #token: 100, token usage: 0.01\n"
            "Decode batch [12], #running-req: 48, #token: 9000\n"
            "Prefill batch, #new-seq: 8, #running-req: 99\n")  # prefill lines are not decode batches
    assert memory.max_running_requests(text) == 48
    assert memory.max_running_requests("nothing") is None


def _write_safetensors(path, tensors):
    """A safetensors file by hand: {name: (dtype, shape, nbytes)}, zero data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def test_drafter_weight_bytes(tmp_path):
    n1 = _write_safetensors(tmp_path / "model-00001.safetensors",
                            {"a": ("F32", [4, 8], 128), "b": ("BF16", [3], 6)})
    n2 = _write_safetensors(tmp_path / "model-00002.safetensors", {"c": ("F32", [10], 40)})
    (tmp_path / "config.json").write_text("{}")
    assert memory.safetensors_tensor_bytes(str(tmp_path / "model-00001.safetensors")) == 134
    assert memory.drafter_weight_bytes(str(tmp_path)) == n1 + n2 == 174
    (tmp_path / "mask_embedding.pt").write_bytes(b"x" * 100)
    assert memory.drafter_weight_bytes(str(tmp_path)) == 274


def test_check_bound_edges():
    plain, drafter, pool = 1000 * MIB, 20 * MIB, 80 * MIB
    bound = (plain + drafter + pool) * 1.10
    at = memory.check_bound(plain, bound, drafter, pool)
    assert at["ok"] and at["bound_bytes"] == pytest.approx(1100 * MIB * 1.10)
    over = memory.check_bound(plain, bound + 1, drafter, pool)
    assert not over["ok"] and over["excess_bytes"] == pytest.approx(1)
    assert over["dflash_minus_plain_bytes"] == pytest.approx(bound + 1 - plain)
    assert memory.check_bound(plain, plain, 0, 0, slack=0.0)["ok"]


def test_kv_tokens_needed_covers_the_batch():
    need = memory.kv_tokens_needed(48, 2048, 32, 8)
    assert need % 1024 == 0 and need >= 48 * (2048 + 32 + 16) * 1.25


def test_make_prompts_deterministic_distinct_and_avoiding_specials():
    a = memory.make_prompts(3, 50, 151936, seed=7)
    assert a == memory.make_prompts(3, 50, 151936, seed=7)
    assert a != memory.make_prompts(3, 50, 151936, seed=8)
    assert [len(p) for p in a] == [50, 50, 50] and len({tuple(p) for p in a}) == 3
    small = memory.make_prompts(2, 200, 6, seed=0)
    assert all(t in (4, 5) for p in small for t in p)


def _cell(batch, peak_mib):
    return {"batch": batch, "peak_kib": peak_mib * 1024}


def test_summarize_and_table():
    result = {"drafter_bytes": 22 * MIB, "context_pool": {"bytes": 124 * MIB}, "slack": 0.10,
              "modes": {"plain": {"cells": [_cell(1, 3000), _cell(16, 3200), _cell(48, 3500)]},
                        "dflash": {"cells": [_cell(1, 3150), _cell(16, 3400),
                                             {"batch": 48, "errors": ["boom"]}]}}}
    rows = memory.summarize(result)
    assert [r["batch"] for r in rows] == [1, 16]  # batch 48 failed in one mode: no row
    assert rows[0]["bound_mib"] == pytest.approx((3000 + 22 + 124) * 1.10)
    assert rows[0]["ok"] and rows[0]["dflash_minus_plain_mib"] == pytest.approx(150)
    table = memory.render_table(rows)
    assert table.splitlines()[0].startswith("| batch | plain peak MiB | DFLASH peak MiB")
    assert "| 1 | 3000 | 3150 | 150 | 22.0 | 124.0 | 3461 | yes |" in table
    result["modes"]["dflash"]["cells"][1] = _cell(16, 5000)
    assert "| NO |" in memory.render_table(memory.summarize(result))


def test_summarize_without_pool_line_has_no_verdict():
    result = {"drafter_bytes": MIB, "context_pool": None,
              "modes": {"plain": {"cells": [_cell(1, 100)]}, "dflash": {"cells": [_cell(1, 120)]}}}
    (row,) = memory.summarize(result)
    assert row["ok"] is None and row["bound_mib"] is None
    assert "| n/a |" in memory.render_table([row])


BASELINE = """# Benchmark baseline

intro

## Output tokens/s

| a | b |

## Simulation (not a measurement)

sim text
"""


def test_replace_section_appends_then_replaces_only_its_own():
    first = memory.replace_section(BASELINE, "## Memory", "## Memory\n\nrun 1\n")
    assert first.startswith(BASELINE.rstrip("\n") + "\n\n## Memory\n\nrun 1\n")
    second = memory.replace_section(first, "## Memory", "## Memory\n\nrun 2\n| t |\n")
    assert second == BASELINE.rstrip("\n") + "\n\n## Memory\n\nrun 2\n| t |\n"


def test_replace_section_in_the_middle_keeps_the_sections_after_it():
    text = BASELINE.replace("## Simulation", "## Memory\n\nold\nold 2\n\n## Simulation")
    out = memory.replace_section(text, "## Memory", "## Memory\n\nnew\n")
    assert out == BASELINE.replace("## Simulation", "## Memory\n\nnew\n\n## Simulation")
    # "### Memory" or "## Memory usage" are other headings, not this section.
    other = BASELINE + "\n### Memory\n\nx\n"
    assert memory.replace_section(other, "## Memory", "## Memory\n").endswith("x\n\n## Memory\n")


def test_baseline_section_names_command_commit_host_and_verdict():
    result = {
        "date": "2026-12-04 14:00:00 UTC", "wall_s": 600, "load_avg_start": [6.0, 5.0, 4.0],
        "command": "python benchmark/memory.py --update-baseline",
        "machine": {"cpu_model": "AMD EPYC", "nproc": 2, "ram_gib": 23.5, "gpu": None},
        "versions": {"git_commit": "abc1234", "git_dirty": False, "sglang": "0.5.23"},
        "settings": {"batch_sizes": [1, 48], "prompt_tokens": 2048, "new_tokens": 32,
                     "max_total_tokens": 125952},
        "drafter_bytes": 22 * MIB, "context_pool": {"slots": 10, "bytes_per_slot": 1024,
                                                    "bytes": 124 * MIB},
        "modes": {"plain": {"state": "ok", "cells": [_cell(1, 3000), _cell(48, 3500)]},
                  "dflash": {"state": "ok", "cells": [_cell(1, 3100), _cell(48, 9000)]}},
    }
    text = memory.baseline_section(result)
    assert text.startswith("## Memory\n")
    assert "python benchmark/memory.py --update-baseline" in text and "`abc1234`" in text
    assert "AMD EPYC, 2 cores" in text and "2026-12-04" in text
    assert "Bound NOT met at batch 48." in text
    assert "\n## " not in text  # one section: replace_section finds its end at the next heading


def test_concurrency_note_names_cells_that_ran_below_their_batch():
    cells = lambda running: [dict(_cell(48, 1), max_running_req_logged=running)]  # noqa: E731
    result = {"modes": {"plain": {"cells": cells(48)}, "dflash": {"cells": cells(45)}}}
    assert "dflash 48 -> 45" in memory.concurrency_note(result)
    result["modes"]["dflash"]["cells"] = cells(48)
    assert memory.concurrency_note(result) is None
