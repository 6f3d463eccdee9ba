"""The hybrid radix cache's track slots after a verify (`adapter/linear_state.py`):
which verify step's state is the one at a grid length, and that SGLang's commit
is handed them (the commit itself is SGLang's on CUDA; CPU refuses the mode)."""

import types

import pytest
import torch

from sglang_dflash.adapter.linear_state import commit_accepted_state, steps_to_track


def test_the_step_whose_state_is_the_last_grid_length_reached():
    prefix = torch.tensor([3, 4, 5, 8, 1, 0])
    new_lens = torch.tensor([5, 7, 8, 9, 9, 1])
    # 3 -> 5 reaches 4 after step 0; 4 -> 7 and 8 -> 9 reach none past their
    # start; 5 -> 8 reaches 8 after step 2; 1 -> 9 passes 4 and 8: the last, step 6.
    assert steps_to_track(prefix, new_lens, 4).tolist() == [0, -1, 2, -1, 6, -1]
    assert steps_to_track(prefix, new_lens, 1).tolist() == [1, 2, 2, 0, 7, 0]


def test_every_tracked_step_is_a_committed_one():
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 200, (500,), generator=g)
    commit = torch.randint(1, 17, (500,), generator=g)
    for grid in (1, 3, 16, 64):
        steps = steps_to_track(prefix, prefix + commit, grid)
        tracked = steps >= 0
        assert bool((steps[tracked] < commit[tracked]).all())
        assert bool(((prefix + steps + 1)[tracked] % grid == 0).all())


class _Backend:
    def update_mamba_state_after_mtp_verify(self, last_step, slots, steps, model, req_pool_indices=None):
        self.call = (last_step, slots, steps, model, req_pool_indices)


def test_sglang_commit_gets_the_track_slots_and_steps():
    runner = types.SimpleNamespace(attn_backend=_Backend(), model="model")
    commit_lens = torch.tensor([2, 1, 3], device="meta")  # not the host: SGLang's commit
    slots, steps, pools = torch.tensor([7, -1, 9]), torch.tensor([1, -1, 0]), torch.tensor([0, 1, 2])
    commit_accepted_state(runner, commit_lens, (slots, steps), pools)
    last_step, got_slots, got_steps, model, got_pools = runner.attn_backend.call
    assert last_step.shape == (3,) and got_slots is slots and got_steps is steps
    assert model == "model" and got_pools is pools
    commit_accepted_state(runner, commit_lens)
    assert runner.attn_backend.call[1] is None and runner.attn_backend.call[2] is None


def test_the_host_copy_refuses_track_slots():
    runner = types.SimpleNamespace(attn_backend=_Backend(), model=None)
    with pytest.raises(RuntimeError, match="extra_buffer"):
        commit_accepted_state(runner, torch.tensor([1]), (torch.tensor([0]), torch.tensor([0])))
