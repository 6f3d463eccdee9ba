"""Counting a re-prefilled request's earlier output at once (adapter/penalty_counts.py)
equals SGLang's penalizers counting it one step at a time."""

import torch

from sglang_dflash.adapter.penalty_counts import add_counts


def _stepwise(values, outputs, vocab, adds):
    """SGLang's per-step update: one token per row per step, scatter(_add) of the row's value."""
    init = 0.0 if adds else 1.0
    counts = torch.full((len(outputs), vocab), init)
    for i, ids in enumerate(outputs):
        for t in ids:
            one = torch.full((1, vocab), init)
            one[0] = counts[i]
            idx = torch.tensor([[t]])
            (one.scatter_add_ if adds else one.scatter_)(1, idx, values[i:i + 1])
            counts[i] = one[0]
    return counts


def test_whole_output_counted_as_step_by_step():
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    outputs = [[3, 3, 7, 1], [], [5], [2, 9, 2, 2, 0]]  # repeats, an empty row
    values = torch.rand((len(outputs), 1), generator=gen) + 0.5
    rows = torch.tensor([i for i, ids in enumerate(outputs) for _ in ids])
    tokens = torch.tensor([t for ids in outputs for t in ids])
    for adds in (True, False):  # frequency; presence and repetition
        counts = torch.full((len(outputs), vocab), 0.0 if adds else 1.0)
        add_counts(counts, values, rows, tokens, adds)
        assert torch.equal(counts, _stepwise(values, outputs, vocab, adds))
    frequency = torch.zeros((len(outputs), vocab))
    add_counts(frequency, values, rows, tokens, True)
    assert frequency[3, 2] == 3 * values[3, 0] and frequency[1].abs().sum() == 0
