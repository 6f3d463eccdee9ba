"""Penalties at every verified position equal plain decoding's, one step at a time."""

import pytest
import torch
from sglang_dflash.penalties import OutputCounts, PenaltyParams, apply_block_penalties, commit_keep


def plain_step(logits, counts, length, f, p, r, min_new, stop):
    """One plain decoding step's penalties (SGLang's penalizers, additive then
    scaling), written densely for one request: logits [V], counts [V]."""
    out = logits.clone()
    out -= f * counts
    out -= p * (counts > 0).float()
    if length < min_new:
        out[stop] = float("-inf")
    seen = counts > 0
    out = torch.where(seen, torch.where(out < 0, out * r, out / r), out)
    return out


def reference(logits, drafts, counts, lengths, params):
    bs, rows, vocab = logits.shape
    out = torch.empty_like(logits)
    for b in range(bs):
        c = counts[b].clone()
        for k in range(rows):
            if k > 0:
                c[drafts[b, k - 1]] += 1
            stop = params.stop_mask[b] if params.stop_mask is not None else torch.zeros(vocab, dtype=torch.bool)
            out[b, k] = plain_step(logits[b, k], c, int(lengths[b]) + k, float(params.frequency[b]),
                                   float(params.presence[b]), float(params.repetition[b]),
                                   int(params.min_new_tokens[b]), stop)
    return out


@pytest.mark.parametrize("rows", [6, 1], ids=["block", "one-row"])  # one row: speculation off
@pytest.mark.parametrize("seed", range(6))
def test_block_penalties_match_plain_decoding_row_by_row(seed, rows):
    g = torch.Generator().manual_seed(seed)
    bs, vocab = 5, 12  # a small vocabulary: drafts repeat and hit counted tokens
    logits = torch.randn(bs, rows, vocab, generator=g) * 3
    drafts = torch.randint(0, vocab, (bs, rows - 1), generator=g)
    counts = torch.randint(0, 3, (bs, vocab), generator=g).float() * (torch.rand(bs, vocab, generator=g) < 0.3)
    lengths = torch.randint(1, 6, (bs,), generator=g)
    stop = torch.zeros(bs, vocab, dtype=torch.bool)
    stop[:, 0] = True
    stop[:, 3] = True
    params = PenaltyParams(
        frequency=torch.tensor([0.0, 0.5, 0.0, 1.2, 0.3]),
        presence=torch.tensor([0.0, 0.0, 0.8, 0.4, 0.0]),
        repetition=torch.tensor([1.0, 1.0, 1.3, 0.7, 2.0]),
        min_new_tokens=torch.tensor([0, 4, 8, 0, 3]),
        stop_mask=stop,
    )
    want = reference(logits, drafts, counts, lengths, params)
    got = logits.clone()
    apply_block_penalties(got, drafts, counts, lengths, params)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_wrong_block_rule_is_detected():
    """Block-start counts on every row (the per-step shortcut) differ from plain
    decoding once a draft repeats: the reference above can tell."""
    logits = torch.zeros(1, 3, 4)
    drafts = torch.tensor([[2, 2]])
    counts, lengths = torch.zeros(1, 4), torch.tensor([1])
    params = PenaltyParams(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0]),
                           torch.tensor([0]), None)
    want = reference(logits, drafts, counts, lengths, params)
    assert want[0, 2, 2] == -2.0 and want[0, 1, 2] == -1.0 and want[0, 0, 2] == 0.0
    shortcut = logits - counts.view(1, 1, 4)
    assert not torch.equal(shortcut, want)


def _row(state, slot):
    counts, lengths = state.rows(torch.tensor([slot]))
    return counts[0].tolist(), int(lengths[0])


def test_output_counts_reset_and_add_committed_tokens():
    state = OutputCounts(num_slots=4, vocab_size=6, device="cpu")
    state.reset(torch.tensor([1, 3]), [[2], [5, 5, 0]])
    assert _row(state, 3) == ([1, 0, 0, 0, 0, 2], 3) and _row(state, 1) == ([0, 0, 1, 0, 0, 0], 1)
    out = torch.tensor([[4, 2, 9], [1, 1, 9]])  # [d_1, d_2, bonus]; 9 marks padding
    keep = commit_keep(torch.tensor([1, 0]), 3)  # request 0 accepted 1 draft, request 1 none
    state.add(torch.tensor([1, 3]), out, keep)
    assert _row(state, 1) == ([0, 0, 2, 0, 1, 0], 3)
    assert _row(state, 3) == ([1, 1, 0, 0, 0, 2], 4)


def test_output_counts_rows_follow_the_slots_in_use_not_the_pool():
    """A pool of thousands of slots (SGLang's default without --max-running-requests)
    allocates rows only for slots that were reset; growing keeps the counts; slots
    never reset write to the scratch row and leave every other row alone."""
    state = OutputCounts(num_slots=4096, vocab_size=5, device="cpu", capacity=2)
    assert state.counts.shape[0] == 2
    state.reset(torch.tensor([4095]), [[1, 1]])
    for wave in range(3):  # slots come back last-freed-first: the same few
        slots = torch.tensor([4095, 4094, 4093][: wave + 1])
        state.reset(slots[1:], [[] for _ in slots[1:]])
        state.add(slots, torch.full((len(slots), 1), 2), torch.ones(len(slots), 1, dtype=torch.bool))
    assert state.counts.shape[0] <= 8 and len(state._rows) == 3
    assert _row(state, 4095) == ([0, 2, 3, 0, 0], 5)
    assert _row(state, 4093) == ([0, 0, 1, 0, 0], 1)
    before = state.counts[1:].clone()
    state.add(torch.tensor([7, 4095]), torch.tensor([[3], [4]]), torch.ones(2, 1, dtype=torch.bool))
    assert _row(state, 4095) == ([0, 2, 3, 0, 1], 6)  # its own row only
    assert torch.equal(state.counts[2:], before[1:])  # the other slots' rows untouched
    state.reset(torch.tensor([4095]), [[0]])  # a new request in a reused slot starts over
    assert _row(state, 4095) == ([1, 0, 0, 0, 0], 1) and len(state._rows) == 3
