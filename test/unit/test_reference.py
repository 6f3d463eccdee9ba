"""sglang_dflash.reference: the plain-torch greedy speculative loop on the tiny pair
(lossless against plain greedy decoding, steps that add up, EOS and budget cuts)."""

import pytest
import torch

from sglang_dflash.checkpoint import load_drafter
from sglang_dflash.demo import tiny_paths
from sglang_dflash.model import reference_draft_step, target_features
from sglang_dflash.reference import (
    AcceptanceStats,
    decode,
    draft_hidden,
    greedy_generate,
    leading_matches,
)
from sglang_dflash.train.cli import load_target

PATHS = tiny_paths()
PROMPT = "<|im_start|>user\nWhat is 7 times 8?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target, tok = load_target(PATHS["target"])
    c = target.config
    drafters = {name: load_drafter(PATHS[name], target_hidden_size=c.hidden_size,
                                   target_vocab_size=c.vocab_size,
                                   target_num_layers=c.num_hidden_layers)
                for name in ("drafter-trained", "dflash2-random")}
    return target, tok, drafters


def test_draft_hidden_matches_reference_draft_step(pair):
    target, tok, drafters = pair
    drafter = drafters["drafter-trained"]
    ids = torch.tensor(tok.encode(PROMPT))
    with torch.no_grad():
        feats, _ = target_features(target, ids[None, :-1], drafter.cfg.target_layer_ids)
        hidden = draft_hidden(drafter, target, feats[0], int(ids[-1]), drafter.cfg.mask_token_id)
    mine = (hidden[0].float() @ target.get_output_embeddings().weight.float().t()).argmax(-1)
    assert torch.equal(mine, reference_draft_step(drafter, target, ids, drafter.cfg.mask_token_id))


@pytest.mark.parametrize("name", ["drafter-trained", "dflash2-random"])
def test_decode_is_lossless_and_steps_add_up(pair, name):
    target, tok, drafters = pair
    drafter = drafters[name]
    prompt = tok.encode(PROMPT)
    out = decode(target, drafter, prompt, 24, drafter.cfg.mask_token_id, k=4, keep_hidden=True)
    assert out.tokens == greedy_generate(target, prompt, 24)
    assert sum(len(s.tokens) for s in out.steps) == len(out.tokens) - 1  # + the prefill's token
    S = drafter.cfg.block_size - 1
    for s in out.steps:
        assert len(s.drafts) == S and len(s.verified) == S + 1
        assert s.accepted == leading_matches(s.drafts, s.verified)
        assert s.tokens == (s.drafts[:s.accepted] + [s.verified[s.accepted]])[:len(s.tokens)]
        assert s.candidates.ids.shape == (1, S, 4) and s.hidden.shape[:2] == (1, S)
    positions = [s.position for s in out.steps]
    assert positions[0] == len(prompt) and positions == sorted(positions)


def test_eos_and_budget_cut_the_last_step(pair):
    target, tok, drafters = pair
    drafter = drafters["drafter-trained"]
    prompt = tok.encode(PROMPT)
    full = greedy_generate(target, prompt, 24)
    eos = full[10]
    out = decode(target, drafter, prompt, 24, drafter.cfg.mask_token_id, eos_token_id=eos)
    assert out.tokens == full[:full.index(eos) + 1]  # stops at the first EOS, EOS kept
    for budget in (0, 1, 5):
        assert decode(target, drafter, prompt, budget, drafter.cfg.mask_token_id).tokens == full[:budget]


def test_acceptance_stats_count_every_step(pair):
    target, tok, drafters = pair
    drafter = drafters["drafter-trained"]
    stats = AcceptanceStats(block_size=drafter.cfg.block_size, k=8)
    prompt = tok.encode(PROMPT)
    out = decode(target, drafter, prompt, 20, drafter.cfg.mask_token_id, k=8)
    stats.add(out)
    assert stats.steps == len(out.steps) and stats.prompts == 1
    assert sum(stats.accepted_lengths) == stats.new_tokens - 1
    assert stats.reached[0] == stats.steps and stats.coverage_total == sum(stats.reached)
    assert sum(stats.histogram()) == stats.steps
    assert 0.0 <= stats.topk_coverage <= 1.0


def test_leading_matches():
    assert leading_matches([1, 2, 3], [1, 2, 4, 5]) == 2
    assert leading_matches([], [1]) == 0
    assert leading_matches([7], [8]) == 0
