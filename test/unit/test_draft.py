"""Block construction and commit planning on hand-made cases (acceptance: test_verify.py)."""

import pytest
import torch

from sglang_dflash.draft import context_slots, make_blocks, plan_commit

MASK = 99


def test_make_blocks_layout():
    block = make_blocks(torch.tensor([5, 7]), torch.tensor([3, 10]), MASK, 4)
    assert block.token_ids.tolist() == [[5, MASK, MASK, MASK], [7, MASK, MASK, MASK]]
    assert block.positions.tolist() == [[3, 4, 5, 6], [10, 11, 12, 13]]


def test_make_blocks_rejects_bad_inputs():
    with pytest.raises(ValueError, match="anchor"):
        make_blocks(torch.tensor([[1]]), torch.tensor([1]), MASK, 4)
    with pytest.raises(ValueError, match="block_size"):
        make_blocks(torch.tensor([1]), torch.tensor([1]), MASK, 1)


def test_context_slots_pads_and_masks():
    rows = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    slots, valid = context_slots(rows, torch.tensor([3, 1]))
    assert slots.tolist() == [[10, 11, 12], [20, 0, 0]]
    assert valid.tolist() == [[True, True, True], [True, False, False]]


def test_context_slots_takes_the_callers_max_prefix():
    rows = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    prefix = torch.tensor([3, 1])
    given = context_slots(rows, prefix, max_prefix=3)
    computed = context_slots(rows, prefix)
    assert all(torch.equal(a, b) for a, b in zip(given, computed))


def test_plan_commit_commits_anchor_and_accepted_rows():
    plan = plan_commit(torch.tensor([0, 2, 3]), torch.tensor([10, 20, 30]))
    assert plan.commit_lens.tolist() == [1, 3, 4]
    assert plan.new_seq_lens.tolist() == [11, 23, 34]
