"""Block-diffusion objective (hand-made batches) and the small trainer."""

import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.config import DrafterConfig  # noqa: E402
from sglang_dflash.model import DFlashDrafter, target_features  # noqa: E402
from sglang_dflash.train import (  # noqa: E402
    TrainConfig,
    TrainHistory,
    block_diffusion_loss,
    block_labels,
    context_mask,
    sample_anchors,
    slot_weights,
    train_drafter,
)
from sglang_dflash.reference import greedy_generate, speculative_generate  # noqa: E402
from sglang_dflash.train.objective import draft_hidden_for_anchors  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------------------
# Objective pieces on hand-made batches
# ---------------------------------------------------------------------------


def test_slot_weights_decay():
    w = slot_weights(4, gamma=2.0)
    torch.testing.assert_close(w, torch.exp(-torch.tensor([0.0, 0.5, 1.0])))  # exp(-(k-1)/2)
    assert w[0] == 1.0 and (w[1:] < w[:-1]).all()


def test_sample_anchors_respects_loss_mask():
    # Row 0: labels allowed at positions 4..9, so anchors a with a+1 in 4..9 and a <= 8.
    # Row 1: labels only at position 3 -> a single eligible anchor (2).
    loss_mask = torch.zeros(2, 10, dtype=torch.bool)
    loss_mask[0, 4:] = True
    loss_mask[1, 3] = True
    gen = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(loss_mask, num_anchors=4, generator=gen)
    assert anchors.shape == valid.shape == (2, 4)
    row0 = anchors[0][valid[0]].tolist()
    assert valid[0].all() and len(set(row0)) == 4 and all(3 <= a <= 8 for a in row0)
    assert row0 == sorted(row0)
    assert valid[1].tolist() == [True, False, False, False] and anchors[1, 0] == 2


def test_sample_anchors_keeps_context_nonempty():
    loss_mask = torch.ones(1, 4, dtype=torch.bool)  # labels everywhere
    anchors, valid = sample_anchors(loss_mask, 10, torch.Generator().manual_seed(0))
    assert sorted(anchors[valid].tolist()) == [1, 2]  # a = 0 has no context, a = 3 no label


def test_sample_anchors_is_seeded():
    mask = torch.ones(3, 50, dtype=torch.bool)
    a1 = sample_anchors(mask, 8, torch.Generator().manual_seed(7))[0]
    a2 = sample_anchors(mask, 8, torch.Generator().manual_seed(7))[0]
    assert torch.equal(a1, a2)


def test_block_labels_hand_made():
    tokens = torch.arange(100, 110)[None]  # tok[p] = 100 + p, T = 10
    loss_mask = torch.ones(1, 10, dtype=torch.bool)
    loss_mask[0, 4] = False  # e.g. a prompt token inside the block
    anchors = torch.tensor([[2, 7, 0]])
    valid = torch.tensor([[True, True, False]])
    labels, counted = block_labels(tokens, loss_mask, anchors, valid, block_size=4)
    assert labels[0, 0].tolist() == [103, 0, 105]  # slot 2 = position 4 is masked out
    assert counted[0, 0].tolist() == [True, False, True]
    assert labels[0, 1].tolist() == [108, 109, 0]  # position 10 is past the end
    assert counted[0, 1].tolist() == [True, True, False]
    assert not counted[0, 2].any()  # padding anchor


def test_context_mask_hand_made():
    mask = context_mask(torch.tensor([[0, 2], [5, 1]]), seq_len=4)
    assert mask[0, 0].tolist() == [False] * 4
    assert mask[0, 1].tolist() == [True, True, False, False]
    assert mask[1, 0].tolist() == [True] * 4
    assert mask[1, 1].tolist() == [True, False, False, False]


# ---------------------------------------------------------------------------
# Tiny random target / drafter pair
# ---------------------------------------------------------------------------

V, H, MASK = 64, 32, 63


@pytest.fixture(scope="module")
def target():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)  # sharp argmax: no near-ties
    return model


def make_drafter(seed=0, layers=1):
    torch.manual_seed(seed)
    cfg = DrafterConfig(
        version=1, hidden_size=H, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=256, vocab_size=V, block_size=4,
        target_layer_ids=(0, 1), num_target_layers=3, mask_token_id=MASK)
    return DFlashDrafter(cfg)


def self_generated(target, count=12, prompt=6, new=26):
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, V - 1, (count, prompt), generator=gen)
    seqs = [torch.tensor(p.tolist() + greedy_generate(target, p.tolist(), new)) for p in prompts]
    masks = [torch.arange(len(s)) >= prompt for s in seqs]
    return seqs, masks


def test_no_leakage_from_positions_at_or_after_anchor(target):
    drafter = make_drafter().eval()
    tokens = torch.randint(0, V - 1, (1, 12), generator=torch.Generator().manual_seed(2))
    feats, _ = target_features(target, tokens, drafter.cfg.target_layer_ids)
    anchors = torch.tensor([[5]])
    embed = target.get_input_embeddings()
    with torch.no_grad():
        base = draft_hidden_for_anchors(drafter, feats, tokens, anchors, embed, MASK)
        later = feats.clone()
        later[:, 5:] = torch.randn_like(later[:, 5:])  # features of p >= a
        later_tokens = tokens.clone()
        later_tokens[:, 6:] = 0  # tokens after the anchor (the labels)
        same = draft_hidden_for_anchors(drafter, later, later_tokens, anchors, embed, MASK)
        earlier = feats.clone()
        earlier[:, 4] += 1.0  # the last context position must matter
        moved = draft_hidden_for_anchors(drafter, earlier, tokens, anchors, embed, MASK)
    torch.testing.assert_close(same, base, rtol=0, atol=0)
    assert (moved - base).abs().max() > 1e-4


def test_few_steps_reduce_loss(target):
    seqs, masks = self_generated(target)
    drafter = make_drafter()
    probe = (torch.stack(seqs), torch.stack(masks))

    def probe_loss():
        tokens, loss_mask = probe
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            feats, _ = target_features(target, tokens, drafter.cfg.target_layer_ids)
            anchors, valid = sample_anchors(loss_mask, 8, gen)
            return block_diffusion_loss(drafter, feats, tokens, loss_mask, anchors, valid,
                                        target.get_input_embeddings(), target.lm_head.weight,
                                        MASK, gamma=7.0).loss.item()

    before = probe_loss()
    history = TrainHistory()
    cfg = TrainConfig(steps=40, batch_size=4, num_anchors=8, lr=1e-2, warmup_steps=5, log_every=10)
    train_drafter(drafter, target, seqs, masks, cfg, mask_token_id=MASK, pad_token_id=0,
                  history=history, log=lambda _: None)
    after = probe_loss()
    assert len(history.rows) == 4
    assert after < before - 0.5, (before, after)
    assert history.last_loss() < history.first_loss()


def test_training_is_deterministic(target):
    seqs, masks = self_generated(target, count=6)
    cfg = TrainConfig(steps=3, batch_size=2, num_anchors=4, warmup_steps=1, log_every=3)
    weights = []
    for _ in range(2):
        drafter = make_drafter(seed=5)
        train_drafter(drafter, target, seqs, masks, cfg, mask_token_id=MASK, pad_token_id=0,
                      log=lambda _: None)
        weights.append(drafter.state_dict())
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_reference_speculative_decoding_is_lossless(target):
    drafter = make_drafter(seed=9, layers=1).eval()
    prompt = [5, 17, 33, 2, 40]
    expected = greedy_generate(target, prompt, 20)
    out, steps = speculative_generate(target, drafter, prompt, 20, MASK)
    assert out == expected
    assert all(1 <= s <= drafter.cfg.block_size for s in steps)
