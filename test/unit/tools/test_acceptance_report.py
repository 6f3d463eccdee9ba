"""`python -m sglang_dflash.tools.acceptance_report` on the tiny pair."""

import json
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))

from sglang_dflash.checkpoint import load_drafter  # noqa: E402
from sglang_dflash.reference import greedy_generate  # noqa: E402
from sglang_dflash.tools import acceptance_report as acceptance  # noqa: E402
from sglang_dflash.train.cli import load_target  # noqa: E402

torch.set_num_threads(1)

TINY = Path(__file__).resolve().parents[3] / "python" / "sglang_dflash" / "assets" / "tiny"


@pytest.mark.parametrize("drafter", ["drafter-trained", "dflash2-random"])
def test_report_prints_fields(drafter, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    acceptance.main(["--target", str(TINY / "target"), "--drafter", str(TINY / drafter),
                     "--prompts", "math", "--n", "2", "--max-new-tokens", "16",
                     "--json", str(out_json)])
    text = capsys.readouterr().out
    for field in ("mean acceptance length (bonus included):", "histogram of accepted lengths:",
                  "per-position acceptance", "among top-"):
        assert field in text
    k = 8 if drafter == "dflash2-random" else 16
    assert f"among top-{k} candidates" in text
    assert ("DFlash 2 (selector walk)" in text) == (drafter == "dflash2-random")
    data = json.loads(out_json.read_text())
    assert data["prompts"] == 2 if isinstance(data["prompts"], int) else True
    assert 1.0 <= data["mean_acceptance_length"] <= 8.0
    assert len(data["histogram"]) == 8 and sum(data["histogram"]) == data["steps"]
    assert len(data["per_position_acceptance"]) == 7
    assert 0.0 <= data["topk_coverage"] <= 1.0


def test_reference_loop_is_lossless_and_counts_match():
    target, tokenizer = load_target(TINY / "target")
    c = target.config
    drafter = load_drafter(TINY / "drafter-trained", target_hidden_size=c.hidden_size,
                           target_vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers)
    texts = acceptance.load_prompt_texts("chat", 2)
    stats = acceptance.AcceptanceStats(block_size=8, k=16)
    for text in texts:
        prompt = acceptance.encode_prompt(tokenizer, text, 256)
        got = acceptance.speculative_decode(target, drafter, prompt, 20, drafter.cfg.mask_token_id,
                                            tokenizer.eos_token_id, stats, use_selector=False)
        want = greedy_generate(target, prompt, len(got))
        assert got == want  # greedy speculative decoding reproduces plain greedy decoding
    assert sum(stats.accepted_lengths) == stats.new_tokens - 2  # minus each prefill token
    assert stats.reached[0] == stats.steps
    assert all(a <= r for a, r in zip(stats.accepted, stats.reached))
