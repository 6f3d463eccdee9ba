"""Weight updates on a live DFLASH engine (`update_weights_from_disk`,
`update_weights_from_tensor` with selectors "draft" and "all",
`update_weights_from_distributed` with selector "draft"), against plain
serving with the same updates and against engines started on the updated
weights.

One DFLASH engine starts with a drafter of the trained drafter's shape but
random weights and a trained mask embedding (`mask_embedding.pt`), then:
refused drafter updates (a name the drafter lacks, a mis-shaped tensor), the
trained drafter's tensors under selector "draft", a new target from disk, and
the original target's tensors under selector "all", then the random
drafter's tensors again, broadcast by a trainer over a gloo group. After each, greedy output
must equal plain serving with the same target weights, and the per-request
verify counts (which depend only on the drafter's proposals, hence on every
drafter weight and the mask embedding row) must equal those of a fresh engine
started on the same target and drafter.
"""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from harness import PATHS, TARGET, Job, chat_prompts, noised_copy, output_ids, redrawn_copy, run_engines

SAMPLING = {"max_new_tokens": 48, "temperature": 0}
MASK_ID = 3  # the tiny drafters' mask_token_id


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    gen = torch.Generator().manual_seed(0)
    new_target = noised_copy(TARGET, root / "target2", 0.3, gen)
    random_drafter = redrawn_copy(PATHS["drafter-trained"], root / "drafter-random-weights", gen)
    trained = str(shutil.copytree(PATHS["drafter-trained"], root / "drafter-trained-mask"))
    row = load_file(os.path.join(TARGET, "model.safetensors"))["model.embed_tokens.weight"][MASK_ID]
    mask = {"embedding": row + 0.5 * row.std() * torch.randn(row.shape, generator=gen), "mask_token_id": MASK_ID}
    for drafter in (random_drafter, trained):
        torch.save(mask, os.path.join(drafter, "mask_embedding.pt"))
    assert json.load(open(os.path.join(trained, "config.json")))["dflash_config"]["mask_token_id"] == MASK_ID
    return {"target2": new_target, "random": random_drafter, "trained": trained}


def _gen(name, *ops):
    prompts = chat_prompts(6)
    return {"name": name, "prompts": prompts, "batch_size": len(prompts), "sampling_params": SAMPLING,
            "weights": list(ops)}


def _verify_counts(run):
    return [r["meta_info"]["spec_verify_ct"] for r in run["results"]]


@pytest.fixture(scope="module")
def engines(ckpt):
    checksums = {"op": "check", "selector": "draft"}
    to_trained = {"op": "tensor", "path": ckpt["trained"], "selector": "draft"}
    to_trained_bucket = {**to_trained, "load_format": "flattened_bucket"}
    to_target2 = {"op": "disk", "path": ckpt["target2"]}
    target2_tensors = {"op": "tensor", "path": ckpt["target2"], "selector": "all"}
    live = Job({"speculative_algorithm": "DFLASH", "speculative_draft_model_path": ckpt["random"]}, [
        _gen("start", checksums),
        _gen("bad_name", {**to_trained, "extra": {"layers.7.mlp.gate_proj.weight": [128, 64]}}),
        _gen("bad_shape", {"op": "tensor", "path": None, "selector": "draft", "extra": {"fc.weight": [3, 3]}}),
        _gen("disk", to_target2),
        _gen("draft", to_trained_bucket, checksums),
        _gen("all", target2_tensors),
        _gen("distributed", {"op": "distributed", "path": ckpt["random"], "selector": "draft"}, checksums),
    ])
    fresh = {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": ckpt["trained"],
             "model_path": ckpt["target2"]}
    plain = Job({}, [_gen("start"), _gen("disk", to_target2), _gen("all", target2_tensors)])
    live, fresh, plain = run_engines([live, Job(fresh, [_gen("s", checksums)]), plain])
    return {"live": live, "fresh": fresh["s"], "plain": plain}


def test_output_equals_plain_after_every_update(engines):
    live, plain = engines["live"], engines["plain"]
    assert output_ids(plain["disk"]) != output_ids(plain["start"])  # the new target changes the output
    for name in ("start", "bad_name", "bad_shape"):
        assert output_ids(live[name]) == output_ids(plain["start"]), name
    for name in ("disk", "draft", "all", "distributed"):
        assert output_ids(live[name]) == output_ids(plain["disk"]), name
    assert output_ids(plain["all"]) == output_ids(plain["disk"])


def test_refused_drafter_updates_name_the_fault_and_change_nothing(engines):
    live = engines["live"]
    (ok, message), = live["bad_name"]["weights"]
    assert not ok and "layers.7.mlp.gate_proj.weight" in message, message
    (ok, message), = live["bad_shape"]["weights"]
    assert not ok and "fc.weight has shape [3, 3]" in message, message
    assert _verify_counts(live["bad_name"]) == _verify_counts(live["bad_shape"]) == _verify_counts(live["start"])


def test_drafter_update_equals_a_fresh_drafter(engines):
    """After the disk update (which must restore the trained mask row: the drafter
    update after it does not touch the target) and the drafter's update, the
    server drafts as one started on both."""
    live, fresh = engines["live"], engines["fresh"]
    assert all(op[0] for op in live["disk"]["weights"] + live["draft"]["weights"] + live["all"]["weights"])
    assert _verify_counts(live["draft"]) == _verify_counts(fresh)
    # check_weights(selector="draft") hashes the drafter's own tensors.
    (_, _, start), (_, _, updated) = live["start"]["weights"][0], live["draft"]["weights"][1]
    (_, _, want), = fresh["weights"]
    assert "draft.fc.weight" in want[0] and updated == want != start
    # The random drafter's proposals are rejected more often: the update took.
    assert sum(_verify_counts(live["disk"])) > sum(_verify_counts(fresh))


def test_target_updates_keep_the_drafter_and_its_mask_embedding(engines):
    """A disk update loads the target only; an update under selector "all" with
    the target's tensors (`model.layers.0...` has the drafter's layer 0 shapes)
    leaves the drafter as it was, and the mask row the target's embedding
    tensor overwrote is written again."""
    live = engines["live"]
    assert "the drafter keeps its weights" in live["disk"]["weights"][0][1]
    assert _verify_counts(live["all"]) == _verify_counts(engines["fresh"])


def test_distributed_drafter_update_takes(engines):
    """The random drafter's tensors, broadcast by a trainer under selector
    "draft", put the server back in the state of the disk update's run: the
    drafter's checksums as at start, and the same verify counts."""
    live = engines["live"]
    (ok, message), (_, _, sums) = live["distributed"]["weights"]
    assert ok, message
    assert sums == live["start"]["weights"][0][2]
    assert _verify_counts(live["distributed"]) == _verify_counts(live["disk"])
    assert _verify_counts(live["distributed"]) != _verify_counts(engines["fresh"])
