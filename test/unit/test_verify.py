"""verify_block: greedy rows on hand-made cases, mixed batches, and losslessness
of the one-hot (DFlash v1) sampled path by a statistical test."""

import pytest
import torch

from sglang_dflash.rejection import target_probs
from sglang_dflash.verify import SamplingRows, VerifyUniforms, verify_block

torch.set_num_threads(1)
V = 16


def _logits_for(argmax_rows):
    """[bs, S+1, V] logits whose argmax at each position is the given token."""
    t = torch.tensor(argmax_rows)
    logits = torch.zeros(*t.shape, V)
    logits.scatter_(-1, t.unsqueeze(-1), 5.0)
    return logits


@pytest.mark.parametrize(
    "drafts, target, accept, bonus",
    [
        ([[4, 5, 6]], [[9, 5, 6, 7]], 0, 9),  # early mismatch
        ([[4, 5, 6]], [[4, 5, 8, 7]], 2, 8),  # mismatch in the middle
        ([[4, 5, 6]], [[4, 5, 6, 7]], 3, 7),  # full accept, bonus after the last draft
        ([[4, 5, 6]], [[4, 0, 6, 7]], 1, 0),  # a later match after a mismatch does not count
    ],
)
def test_greedy_hand_made(drafts, target, accept, bonus):
    res = verify_block(torch.tensor(drafts), _logits_for(target), rows=None)
    assert res.accept_len.tolist() == [accept]
    assert res.bonus.tolist() == [bonus]
    assert res.tokens[0, :accept].tolist() == drafts[0][:accept]


def _uniforms(bs, num_drafts, seed):
    g = torch.Generator().manual_seed(seed)
    return VerifyUniforms(torch.rand(bs, num_drafts, generator=g), torch.rand(bs, num_drafts + 1, generator=g))


def _rows(bs, greedy_mask, temperature=1.0):
    greedy = torch.tensor(greedy_mask)
    return SamplingRows(
        temperature=torch.full((bs,), temperature),
        top_p=torch.ones(bs),
        top_k=torch.where(greedy, 1, V).long(),
        min_p=torch.zeros(bs),
    )


def test_mixed_batch_greedy_rows_match_argmax():
    torch.manual_seed(0)
    bs, S = 64, 3
    logits = torch.randn(bs, S + 1, V)
    drafts = logits[:, :-1].argmax(-1)  # greedy rows will accept everything
    mask = [i % 2 == 0 for i in range(bs)]
    res = verify_block(drafts, logits, _rows(bs, mask), uniforms=_uniforms(bs, S, 1))
    greedy = torch.tensor(mask)
    assert (res.accept_len[greedy] == S).all()
    assert (res.bonus[greedy] == logits[greedy, -1].argmax(-1)).all()


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_one_hot_draft_is_lossless(temperature):
    """First emitted token of a sampled row ~ p_0 whatever the (deterministic) draft.

    200k rows; V = 16; the TV bound 0.01 is > 4 standard deviations of the
    empirical TV at this count (expected TV ~ sqrt(V / (2 pi N)) ~ 0.004)."""
    torch.manual_seed(2)
    n, S = 200_000, 2
    row_logits = torch.randn(S + 1, V) * 2
    logits = row_logits.expand(n, S + 1, V)
    drafts = torch.full((n, S), int(row_logits[0].argmax()))  # a likely but not certain draft
    rows = _rows(n, [False] * n, temperature)
    res = verify_block(drafts, logits, rows, uniforms=_uniforms(n, S, 3))
    first = res.tokens[:, 0]
    empirical = torch.bincount(first, minlength=V).float() / n
    p0 = target_probs(row_logits[:1], torch.tensor([temperature]), torch.ones(1), torch.tensor([V]), torch.zeros(1))[0]
    assert 0.5 * (empirical - p0).abs().sum() < 0.01


def test_width_one_is_plain_decoding():
    """No drafts: greedy rows take the argmax, sampled rows draw from p."""
    torch.manual_seed(4)
    n = 100_000
    row_logits = torch.randn(1, V)
    logits = row_logits.expand(n, 1, V)
    mask = [i < 10 for i in range(n)]
    res = verify_block(torch.zeros(n, 0, dtype=torch.long), logits, _rows(n, mask), uniforms=_uniforms(n, 0, 5))
    assert res.accept_len.eq(0).all()
    assert (res.tokens[:10, 0] == row_logits.argmax()).all()
    empirical = torch.bincount(res.tokens[10:, 0], minlength=V).float() / (n - 10)
    assert 0.5 * (empirical - row_logits[0].softmax(-1)).abs().sum() < 0.01
