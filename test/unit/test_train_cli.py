"""`python -m sglang_dflash.train` on the tiny pair, and the selector K-way loss."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.checkpoint import load_drafter  # noqa: E402
from sglang_dflash.config import parse_drafter_config  # noqa: E402
from sglang_dflash.model import DFlashDrafter  # noqa: E402
from sglang_dflash.train.cli import run  # noqa: E402
from sglang_dflash.train.selector_loss import (  # noqa: E402
    candidates_with_gold,
    selector_kway_loss,
)

torch.set_num_threads(1)

TINY = Path(__file__).resolve().parents[2] / "python" / "sglang_dflash" / "assets" / "tiny"
TARGET = TINY / "target"

ROWS = [
    {"prompt": "Natalia sold clips to 48 of her friends in April.",
     "response": "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips."},
    {"question": "Weng earns $12 an hour for babysitting. How much did she earn?",
     "answer": "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 10."},
    {"messages": [{"role": "user", "content": "Hello, how are you?"},
                  {"role": "assistant", "content": "I am fine, thank you. How are you doing?"}]},
    {"prompt": "def add(a, b):", "response": "def add(a, b):\n    return a + b\n"},
    {"conversations": ["Tell me a joke.", "Why did the chicken cross the road? To get across."]},
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _args(data, out, steps, *extra):
    return ["--target", str(TARGET), "--data", str(data), "--out", str(out),
            "--steps", str(steps), "--batch-size", "4", "--num-anchors", "8",
            "--num-layers", "1", "--target-layer-ids", "1,2", "--selector-rank", "8",
            "--selector-top-k", "8", "--lr", "3e-3", "--warmup-steps", "2",
            "--log-every", "1", "--no-progress", "--seed", "3", *map(str, extra)]


def _quiet(_msg):
    pass


def test_train_reduces_loss_checkpoints_and_resumes(data_file, tmp_path):
    full = run(_args(data_file, tmp_path / "full", 8, "--save-every", 4), log=_quiet)
    hist = full["history"]
    assert [r["step"] for r in hist] == list(range(1, 9))
    first = sum(r["loss"] for r in hist[:3]) / 3
    last = sum(r["loss"] for r in hist[-3:]) / 3
    assert last < first
    assert "sel" in hist[0] and "topk" in hist[0]  # DFlash 2: the selector loss is trained
    ckpt = tmp_path / "full" / "checkpoint-4"
    assert (ckpt / "config.json").is_file() and (ckpt / "trainer_state.pt").is_file()

    # Resume from step 4 in a fresh directory: same final weights, bit for bit.
    shutil.copytree(ckpt, tmp_path / "resumed" / "checkpoint-4")
    resumed = run(_args(data_file, tmp_path / "resumed", 8, "--resume"), log=_quiet)
    assert [r["step"] for r in resumed["history"]] == list(range(1, 9))
    for (name, a), b in zip(full["drafter"].state_dict().items(),
                            resumed["drafter"].state_dict().values()):
        assert torch.equal(a, b), name

    # The saved final checkpoint reloads with the strict loader and gives the same outputs.
    tc = full["target"].config
    loaded = load_drafter(tmp_path / "full", target_hidden_size=tc.hidden_size,
                          target_vocab_size=tc.vocab_size, target_num_layers=tc.num_hidden_layers)
    assert loaded.cfg.version == 2 and loaded.cfg.selector_top_k == 8
    model = full["drafter"].eval()
    gen = torch.Generator().manual_seed(0)
    cfg = model.cfg
    ctx = torch.randn(5, cfg.num_context_features * cfg.hidden_size, generator=gen)
    embeds = torch.randn(1, cfg.block_size, cfg.hidden_size, generator=gen)
    pos = torch.arange(5 + cfg.block_size)
    with torch.no_grad():
        outs = []
        for m in (model, loaded):
            k, v = m.context_kv(m.context_features(ctx), pos[:5])
            outs.append(m.forward_block(embeds, pos[None, 5:], k[:, None], v[:, None],
                                        torch.ones(1, 5, dtype=torch.bool)))
    assert torch.equal(outs[0], outs[1])


def test_v1_arch_has_no_selector_loss(data_file, tmp_path):
    out = run(_args(data_file, tmp_path / "v1", 2, "--arch", "dflash"), log=_quiet)
    assert out["drafter"].candidate_selector is None
    assert "sel" not in out["history"][0]
    cfg = json.loads((tmp_path / "v1" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]


def _dflash2(vocab=32, k=4):
    cfg = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 16,
           "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e4,
           "max_position_embeddings": 64, "vocab_size": vocab,
           "dflash_config": {"block_size": 4, "target_layer_ids": [0], "mask_token_id": 1,
                             "conv_kernel_size": 2, "conv_group_size": 8,
                             "selector_rank": 4, "selector_top_k": k}}
    torch.manual_seed(0)
    return DFlashDrafter(parse_drafter_config(cfg))


def test_gold_insertion_hand_made():
    # One block, 2 drafted slots, vocab 6, K = 3. Slot 0: gold 5 is outside the
    # top-3 {0, 1, 2} -> replaces the lowest (index 2). Slot 1: gold 3 is 2nd.
    logits = torch.tensor([[[9.0, 8.0, 7.0, 1.0, 0.5, 0.0],
                            [0.0, 1.0, 2.0, 8.0, 9.0, 3.0]]])
    gold = torch.tensor([[5, 3]])
    cands, gold_index, in_topk = candidates_with_gold(logits, gold, 3)
    assert cands.ids.tolist() == [[[0, 1, 5], [4, 3, 5]]]
    assert gold_index.tolist() == [[2, 1]]
    assert in_topk.tolist() == [[False, True]]
    assert cands.unary.tolist() == [[[9.0, 8.0, 0.0], [9.0, 8.0, 3.0]]]


def test_selector_kway_loss_gold_missing_reaches_codebooks():
    drafter = _dflash2(vocab=32, k=4)
    sel = drafter.candidate_selector
    hidden = torch.randn(2, 3, 16, requires_grad=True)
    head = torch.randn(32, 16)
    logits = hidden @ head.t()
    # Gold = the lowest-scoring token of each slot: never in the top-4.
    gold = logits.detach().argmin(-1)
    counted = torch.ones(2, 3, dtype=torch.bool)
    out = selector_kway_loss(drafter, hidden, logits, torch.tensor([7, 9]), gold, counted)
    assert torch.isfinite(out.loss) and out.loss > 0
    assert float(out.gold_in_topk) == 0.0
    out.loss.backward()
    for p in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    # Teacher forcing: slot 0 reads the anchor's row; slot 1 the gold token of slot 0.
    assert sel.predecessor_codebook.grad[7].abs().sum() > 0
    assert sel.predecessor_codebook.grad[int(gold[0, 0])].abs().sum() > 0
    assert sel.successor_codebook.grad[int(gold[0, 2])].abs().sum() > 0
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_selector_loss_ignores_uncounted_slots():
    drafter = _dflash2()
    hidden = torch.randn(1, 3, 16)
    logits = hidden @ torch.randn(32, 16).t()
    gold = torch.tensor([[1, 2, 3]])
    a = selector_kway_loss(drafter, hidden, logits, torch.tensor([0]), gold,
                           torch.tensor([[True, True, False]]))
    b = selector_kway_loss(drafter, hidden, logits, torch.tensor([0]),
                           torch.tensor([[1, 2, 31]]), torch.tensor([[True, True, False]]))
    torch.testing.assert_close(a.loss, b.loss)
