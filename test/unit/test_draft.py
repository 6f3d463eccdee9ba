"""Block construction, commit planning and match acceptance on hand-made cases."""

import pytest
import torch

from sglang_dflash.draft import context_slots, make_blocks, match_accept, plan_commit

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


@pytest.mark.parametrize(
    "drafts, target, accept, bonus, out",
    [
        # early mismatch: the first draft is wrong, the bonus is the target's token
        ([[4, 5, 6]], [[9, 5, 6, 7]], 0, 9, [9, 9, 9, 9]),
        # mismatch in the middle
        ([[4, 5, 6]], [[4, 5, 8, 7]], 2, 8, [4, 5, 8, 8]),
        # full accept: every draft matches, the bonus comes after the last one
        ([[4, 5, 6]], [[4, 5, 6, 7]], 3, 7, [4, 5, 6, 7]),
        # a later match after a mismatch does not count
        ([[4, 5, 6]], [[4, 0, 6, 7]], 1, 0, [4, 0, 0, 0]),
    ],
)
def test_match_accept_hand_made(drafts, target, accept, bonus, out):
    a, b, o = match_accept(torch.tensor(drafts), torch.tensor(target))
    assert a.tolist() == [accept] and b.tolist() == [bonus] and o.tolist() == [out]


def test_match_accept_batch_and_shape_check():
    a, b, _ = match_accept(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2, 3], [0, 4, 5]]))
    assert a.tolist() == [2, 0] and b.tolist() == [3, 0]
    with pytest.raises(ValueError, match="one more column"):
        match_accept(torch.tensor([[1, 2]]), torch.tensor([[1, 2]]))


def test_plan_commit_keeps_anchor_and_accepted_rows():
    plan = plan_commit(torch.tensor([0, 2, 3]), torch.tensor([10, 20, 30]), 4)
    assert plan.commit_lens.tolist() == [1, 3, 4]
    assert plan.new_seq_lens.tolist() == [11, 23, 34]
    assert plan.keep.tolist() == [
        [True, False, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
