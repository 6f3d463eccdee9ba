"""The draft step on static buckets (static_draft.py) against the dynamic path.

For random batches (ragged contexts, an empty one included; greedy and sampled
rows mixed; the walk's draws given): the bucketed step, padded to its bucket,
drafts exactly what the dynamic paged path drafts for the same requests
(tokens bit-identical, the walk's q over the same candidates), and matches the
gathered path the CPU worker runs by default. A larger batch before a smaller
one in the same bucket leaves no trace; a batch above the largest bucket is
not served. CUDA-graph capture and replay: test/gpu/test_static_draft_graph.py.
"""

import json
import os

import pytest
import torch

from sglang_dflash.checkpoint import load_drafter
from sglang_dflash.demo import tiny_paths
from sglang_dflash.draft import context_slots, make_blocks
from sglang_dflash.propose import propose
from sglang_dflash.ragged import gather_rows
from sglang_dflash.static_draft import DraftInputs, StaticDraftStep, default_buckets, paged_draft_body
from sglang_dflash.vocab_head import VocabHead

torch.set_num_threads(1)

NUM_SLOTS, POOL_ROWS, ROW_LEN = 600, 12, 40


def _setup(name, device="cpu"):
    paths = tiny_paths()
    with open(os.path.join(paths["target"], "config.json")) as f:
        t = json.load(f)
    drafter = load_drafter(paths[name], target_hidden_size=t["hidden_size"],
                           target_vocab_size=t["vocab_size"],
                           target_num_layers=t["num_hidden_layers"]).eval().to(device)
    cfg = drafter.cfg
    gen = torch.Generator().manual_seed(1)
    head = VocabHead.whole(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen), cfg.vocab_size)
    table = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    shape = (cfg.num_hidden_layers, NUM_SLOTS + 1, cfg.num_key_value_heads, cfg.head_dim)
    k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    req_to_token = torch.randperm(NUM_SLOTS, generator=gen)[:POOL_ROWS * ROW_LEN].view(POOL_ROWS, ROW_LEN)
    head, table, k, v = (VocabHead.whole(head.weight.to(device), cfg.vocab_size), table.to(device),
                         k.to(device), v.to(device))
    return dict(drafter=drafter, head=head, embed=lambda ids: table[ids], k=k, v=v,
                req_to_token=req_to_token.to(torch.int32).to(device), mask=cfg.mask_token_id or 0,
                block=cfg.block_size, device=device)


def _inputs(env, bs, seed, all_greedy=False):
    gen = torch.Generator().manual_seed(seed)
    cfg = env["drafter"].cfg
    x = _cpu_inputs(env, bs, gen, all_greedy, cfg)
    return DraftInputs(*(getattr(x, f).to(env["device"]) for f in
                         ("anchor", "prefix", "pool_index", "temperature", "greedy", "uniforms")))


def _cpu_inputs(env, bs, gen, all_greedy, cfg):
    prefix = torch.randint(0, ROW_LEN - env["block"], (bs,), generator=gen)
    prefix[0] = 0  # an empty context
    greedy = torch.ones(bs, dtype=torch.bool) if all_greedy else torch.rand(bs, generator=gen) < 0.5
    return DraftInputs(
        anchor=torch.randint(0, cfg.vocab_size, (bs,), generator=gen),
        prefix=prefix,
        pool_index=torch.randperm(POOL_ROWS, generator=gen)[:bs],
        temperature=torch.where(greedy, 1.0, 0.5 + torch.rand(bs, generator=gen)),
        greedy=greedy,
        uniforms=torch.rand(bs, env["block"] - 1, generator=gen),
    )


def _body(env):
    return paged_draft_body(env["drafter"], env["head"], env["embed"], env["k"], env["v"],
                            env["req_to_token"], env["mask"], env["block"])


def _gathered(env, x, all_greedy):
    """The worker's default CPU path: context copied out and padded."""
    block = make_blocks(x.anchor, x.prefix, env["mask"], env["block"])
    slots, valid = context_slots(env["req_to_token"][x.pool_index], x.prefix)
    k, v = gather_rows(env["k"], slots, dim=1), gather_rows(env["v"], slots, dim=1)
    hidden = env["drafter"].forward_block(env["embed"](block.token_ids), block.positions, k, v, valid)
    return propose(env["drafter"], hidden[:, 1:], x.anchor, env["head"], x.temperature, x.greedy,
                   x.uniforms, all_greedy=all_greedy)


def _assert_same(got, want, exact=True):
    assert torch.equal(got.drafts, want.drafts)
    if want.q_probs is None:
        assert got.q_probs is None
        return
    assert torch.equal(got.q_ids, want.q_ids)
    if exact:
        assert torch.equal(got.q_probs, want.q_probs)
    else:
        torch.testing.assert_close(got.q_probs, want.q_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dflash2-random", "drafter-random"])
@pytest.mark.parametrize("bs,seed", [(1, 0), (3, 1), (5, 2), (8, 3)])
def test_static_step_drafts_as_the_dynamic_paths(name, bs, seed):
    env = _setup(name)
    step = StaticDraftStep(_body(env), [1, 4, 8], env["block"] - 1, "cpu")
    x = _inputs(env, bs, seed)
    with torch.no_grad():
        got = step.run(x)
        _assert_same(got, _body(env)(x))  # the same body, unpadded: bit-identical
        _assert_same(got, _gathered(env, x, all_greedy=False), exact=False)
        greedy_x = _inputs(env, bs, seed, all_greedy=True)
        _assert_same(step.run(greedy_x), _gathered(env, greedy_x, all_greedy=True), exact=False)
        # The worker's eager paged path: the same body with the fast all-greedy walk.
        _assert_same(_body(env)(greedy_x, all_greedy=True), _gathered(env, greedy_x, all_greedy=True),
                     exact=False)
    assert got.drafts.shape == (bs, env["block"] - 1)


def test_a_larger_batch_leaves_no_trace_and_oversize_is_not_served():
    env = _setup("dflash2-random")
    step = StaticDraftStep(_body(env), [8], env["block"] - 1, "cpu")
    small, large = _inputs(env, 3, 10), _inputs(env, 8, 11)
    with torch.no_grad():
        fresh = step.run(small)
        step.run(large)
        _assert_same(step.run(small), fresh)
        assert step.run(_inputs(env, 9, 12)) is None
    assert step.bucket_size(1) == 8 and step.bucket_size(8) == 8 and step.bucket_size(9) is None


def test_padding_rows_are_the_harmless_request():
    env = _setup("drafter-random")
    step = StaticDraftStep(_body(env), [4], env["block"] - 1, "cpu")
    with torch.no_grad():
        step.run(_inputs(env, 4, 20))
        step.run(_inputs(env, 2, 21))
    padded = step._buckets[4].inputs
    assert padded.prefix[2:].tolist() == [0, 0] and padded.greedy[2:].all()
    assert padded.anchor[2:].tolist() == [0, 0] and padded.pool_index[2:].tolist() == [0, 0]


def test_default_buckets():
    assert default_buckets(5) == [1, 2, 4, 5]
    assert default_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert default_buckets(70) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 70]
    assert default_buckets(20, [1, 2, 4, 8, 16, 32, 64]) == [1, 2, 4, 8, 16, 20]
    assert default_buckets(256, [1, 2, 4, 8, 16, 32]) == [1, 2, 4, 8, 16, 32]  # --cuda-graph-max-bs 32
    with pytest.raises(ValueError, match="positive"):
        StaticDraftStep(lambda x: x, [], 3, "cpu")
