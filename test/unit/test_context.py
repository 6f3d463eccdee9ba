"""Drafter context rows: deferred (speculation off) writes end in the same cache
as eager ones, including slots reused while rows wait in the queue."""

import random
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.context import DraftContext, DraftKVCache, last_per_slot  # noqa: E402
from sglang_dflash.model import DFlashDrafter  # noqa: E402

from test_model import make_cfg, randomise  # noqa: E402

torch.set_num_threads(1)

LAYERS, SLOTS, HEADS, DIM = 2, 40, 2, 4
FEATURES = HEADS * DIM


def rowwise_projector(features, positions):
    """Exact per row (no reductions): a deferred batch must give bit-identical rows."""
    x = features.view(-1, HEADS, DIM)
    k = torch.stack([x * (layer + 1) + positions[:, None, None] for layer in range(LAYERS)])
    return k, -k


def make_context(project=rowwise_projector, **kw):
    kv = DraftKVCache(num_layers=LAYERS, num_slots=SLOTS, num_kv_heads=HEADS, head_dim=DIM,
                      dtype=torch.float32, device="cpu")
    return DraftContext(kv, project, **kw)


def test_last_per_slot_matches_python():
    rng = random.Random(0)
    for _ in range(50):
        slots = [rng.randrange(10) for _ in range(rng.randrange(1, 30))]
        want = [all(s != t for t in slots[i + 1:]) for i, s in enumerate(slots)]
        got = last_per_slot(torch.tensor(slots), 10).tolist()
        assert got == want, slots


def random_steps(seed, n_steps=60):
    """(features, positions, slots, defer) per step: distinct slots within a step,
    slots reused across steps (a finished request's slots handed to another)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(n_steps):
        n = rng.randrange(0, 6)
        slots = torch.tensor(rng.sample(range(SLOTS), n), dtype=torch.int64)
        positions = torch.tensor([rng.randrange(100) for _ in range(n)], dtype=torch.int64)
        steps.append((torch.randn(n, FEATURES, generator=gen), positions, slots, rng.random() < 0.7))
    return steps


@pytest.mark.parametrize("seed", range(5))
def test_deferred_rows_read_as_eager_writes(seed):
    eager, lazy = make_context(), make_context()
    rng = random.Random(seed + 100)
    for features, positions, slots, defer in random_steps(seed):
        eager.commit(features, positions, slots)
        lazy.commit(features, positions, slots, defer=defer)
        assert eager.pending_rows == 0
        if rng.random() < 0.2:  # a draft step reads some slots
            read = torch.tensor([rng.sample(range(SLOTS), 5)])
            for a, b in zip(eager.gather(read), lazy.gather(read)):
                assert torch.equal(a, b)
            assert lazy.pending_rows == 0
    lazy.flush()
    slots = slice(0, eager.kv.num_slots)  # the sink row past them holds superseded rows
    assert torch.equal(eager.kv.k[:, slots], lazy.kv.k[:, slots])
    assert torch.equal(eager.kv.v[:, slots], lazy.kv.v[:, slots])


def test_reused_slot_keeps_the_newest_row():
    ctx = make_context()
    old, new = torch.ones(1, FEATURES), torch.full((1, FEATURES), 7.0)
    slot = torch.tensor([3])
    ctx.commit(old, torch.tensor([5]), slot, defer=True)
    ctx.commit(new, torch.tensor([9]), slot, defer=True)
    k, _ = ctx.gather(slot[None])
    assert torch.equal(k[0, 0, 0], new.view(HEADS, DIM) + 9)
    # An eager write after a deferred row of the same slot wins too (flushed first).
    ctx.commit(old, torch.tensor([5]), slot, defer=True)
    ctx.commit(new, torch.tensor([2]), slot)
    assert torch.equal(ctx.kv.k[0, 3], new.view(HEADS, DIM) + 2)


def test_full_queue_flushes():
    row_bytes = FEATURES * 4
    ctx = make_context(max_pending_bytes=3 * row_bytes)
    for i in range(3):
        ctx.commit(torch.ones(1, FEATURES), torch.tensor([i]), torch.tensor([i]), defer=True)
    assert ctx.pending_rows == 3 and ctx.flushes == 0
    ctx.commit(torch.ones(1, FEATURES), torch.tensor([3]), torch.tensor([3]), defer=True)
    assert ctx.pending_rows == 0 and ctx.flushes == 1
    assert torch.equal(ctx.kv.k[1, 3], torch.full((HEADS, DIM), 2.0 + 3))


def test_deferred_drafter_projection_matches_eager():
    """With the real drafter's projection one batched pass equals per-step writes
    up to float rounding of the batched matmul."""
    cfg = make_cfg(version=2)
    drafter = randomise(DFlashDrafter(cfg))
    n_feat = drafter.fc.in_features

    def project(features, positions):
        return drafter.context_kv(drafter.context_features(features), positions)

    def ctx():
        kv = DraftKVCache(num_layers=cfg.num_hidden_layers, num_slots=SLOTS,
                          num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                          dtype=torch.float32, device="cpu")
        return DraftContext(kv, project)

    eager, lazy = ctx(), ctx()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for step in range(8):
            slots = torch.arange(4) + 4 * step
            feats = torch.randn(4, n_feat, generator=gen)
            eager.commit(feats, slots + 10, slots)
            lazy.commit(feats, slots + 10, slots, defer=True)
        read = torch.arange(32)[None]
        for a, b in zip(eager.gather(read), lazy.gather(read)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert lazy.flushes == 1
