"""VocabHead: the drafter's argmax / top-K over a vocabulary split across
tensor-parallel ranks equals the same over the whole vocabulary.

The ranks are simulated in one process: each shard is a VocabHead over its
rows, and the gather stacks what every shard computed for the same hidden
states (what SGLang's all-gather returns on every rank)."""

import pytest
import torch

from sglang_dflash.vocab_head import VocabHead


def _shards(weight, vocab, bounds, pad_rows=3):
    """One VocabHead per [start, end) bound, each with padding rows after its
    real ones (as a ParallelLMHead shard has), all gathering from all."""
    heads = []
    for rank, (start, end) in enumerate(bounds):
        rows = torch.cat([weight[start:end], torch.randn(pad_rows, weight.shape[1]) * 100])
        heads.append(VocabHead(rows, start, end - start, vocab, gather=_unset))
    return heads


def _unset(x):
    raise AssertionError("gather used outside _run_ranks")


def _run_ranks(heads, fn):
    """Run fn(head) on every simulated rank in lock step: each gather call
    returns the stack of that call's inputs from every rank."""
    import threading

    n = len(heads)
    barrier = threading.Barrier(n)
    slots: dict[int, list] = {}
    results = [None] * n
    errors = []

    def run(rank):
        count = [0]

        def gather(x):
            i = count[0]
            count[0] += 1
            slots.setdefault(i, [None] * n)[rank] = x
            barrier.wait()
            out = torch.stack(slots[i])
            barrier.wait()
            return out

        heads[rank].gather = gather
        try:
            results[rank] = fn(heads[rank])
        except Exception as e:  # surfaced below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _bounds(vocab, tp):
    per = -(-vocab // tp)  # the last shard is shorter when tp does not divide the vocabulary
    return [(r * per, min(vocab, (r + 1) * per)) for r in range(tp)]


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_sharded_argmax_equals_whole(tp):
    torch.manual_seed(tp)
    vocab, hidden = 101, 16
    weight, h = torch.randn(vocab, hidden), torch.randn(3, 5, hidden)
    want = VocabHead.whole(weight, vocab).argmax(h)
    got = _run_ranks(_shards(weight, vocab, _bounds(vocab, tp)), lambda head: head.argmax(h))
    for ids in got:
        assert torch.equal(ids, want)


def test_sharded_argmax_ties_go_to_the_lowest_id():
    """Equal maxima in two shards: the lower global id wins, as argmax over the
    whole vocabulary returns it."""
    vocab, hidden = 8, 4
    weight = torch.zeros(vocab, hidden)
    weight[2] = weight[6] = torch.ones(hidden)  # rows 2 (shard 0) and 6 (shard 1) tie
    h = torch.ones(1, 1, hidden)
    assert VocabHead.whole(weight, vocab).argmax(h).item() == 2
    got = _run_ranks(_shards(weight, vocab, _bounds(vocab, 2)), lambda head: head.argmax(h))
    assert [ids.item() for ids in got] == [2, 2]


@pytest.mark.parametrize("tp,k", [(2, 8), (3, 5), (4, 30)])
def test_sharded_topk_equals_whole(tp, k):
    """Same ids in the same order and the same unary scores on every rank as
    the whole-vocabulary top-K (also when k exceeds a short last shard)."""
    torch.manual_seed(10 * tp + k)
    vocab, hidden = 97, 16
    weight, h = torch.randn(vocab, hidden), torch.randn(2, 7, hidden)
    kw = dict(output_multiplier=0.5, softcap=3.0)
    want = VocabHead.whole(weight, vocab).topk(h, k, **kw)
    got = _run_ranks(_shards(weight, vocab, _bounds(vocab, tp)), lambda head: head.topk(h, k, **kw))
    for cands in got:
        assert torch.equal(cands.ids, want.ids)
        torch.testing.assert_close(cands.unary, want.unary, rtol=0, atol=0)


def test_whole_head_ignores_padding_rows():
    """Rows past the vocabulary (a padded head) never become a draft or a candidate."""
    vocab, hidden = 10, 4
    weight = torch.cat([torch.randn(vocab, hidden), torch.full((6, hidden), 50.0)])
    h = torch.ones(1, 2, hidden)
    head = VocabHead.whole(weight, vocab)
    assert (head.argmax(h) < vocab).all()
    assert (head.topk(h, 10).ids < vocab).all()


def test_bad_shards_are_refused():
    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match="shard size"):
        VocabHead(w, 0, 9, 16, gather=lambda x: x)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        VocabHead(w, 12, 8, 16, gather=lambda x: x)
    with pytest.raises(ValueError, match="whole vocabulary"):
        VocabHead(w, 0, 8, 16)


@pytest.mark.parametrize("chunk_bytes", [1, 7 * 97 * 4, 3 * 7 * 97 * 4])
def test_chunked_rows_equal_one_pass(monkeypatch, chunk_bytes):
    """The head reduces its logits a few requests at a time (bounded memory);
    the result equals one pass over the whole batch, sharded or not (the same
    ids; scores up to the matmul's rounding, which depends on the rows it gets)."""
    import sglang_dflash.vocab_head as vh

    torch.manual_seed(0)
    vocab, hidden = 97, 16
    weight, h = torch.randn(vocab, hidden), torch.randn(5, 7, hidden)
    whole = VocabHead.whole(weight, vocab)
    want_ids, want_top = whole.argmax(h), whole.topk(h, 6)
    monkeypatch.setattr(vh, "_CHUNK_BYTES", chunk_bytes)
    assert torch.equal(whole.argmax(h), want_ids)
    got = whole.topk(h, 6)
    assert torch.equal(got.ids, want_top.ids)
    torch.testing.assert_close(got.unary, want_top.unary, rtol=1e-5, atol=1e-5)
    sharded = _run_ranks(_shards(weight, vocab, _bounds(vocab, 2)), lambda head: head.topk(h, 6))
    assert all(torch.equal(c.ids, want_top.ids) for c in sharded)


def test_all_greedy_walk_drafts_as_the_general_walk():
    """The all-greedy walk (no softmax, no CDF) drafts what the general walk
    drafts for greedy rows, with the same one-hot q; the [bs, S, V] dense q is
    built only on demand (a greedy verify never asks)."""
    from sglang_dflash.checkpoint import load_drafter
    from sglang_dflash.demo import tiny_paths
    from sglang_dflash.propose import propose_selector

    import json
    import os

    path = tiny_paths()["dflash2-random"]
    with open(os.path.join(tiny_paths()["target"], "config.json")) as f:
        t = json.load(f)
    drafter = load_drafter(path, target_hidden_size=t["hidden_size"], target_vocab_size=t["vocab_size"],
                           target_num_layers=t["num_hidden_layers"])
    cfg = drafter.cfg
    torch.manual_seed(0)
    bs, slots = 3, cfg.block_size - 1
    head = VocabHead.whole(torch.randn(cfg.vocab_size, cfg.hidden_size), cfg.vocab_size)
    h = torch.randn(bs, slots, cfg.hidden_size)
    anchor = torch.randint(0, cfg.vocab_size, (bs,))
    args = (drafter, h, anchor, head, torch.ones(bs), torch.ones(bs, dtype=torch.bool),
            torch.rand(bs, slots))
    with torch.no_grad():
        fast, general = propose_selector(*args, all_greedy=True), propose_selector(*args)
    assert torch.equal(fast.drafts, general.drafts)
    assert torch.equal(fast.q_probs, general.q_probs) and torch.equal(fast.q_ids, general.q_ids)
    assert general.q_probs.shape == general.q_ids.shape == (bs, slots, general.q_ids.shape[-1])
    torch.testing.assert_close(general.q_probs.sum(-1), torch.ones(bs, slots))
