"""host_syncs.HostSyncCounter, and the decode step's stages read nothing back:
the selector walk, verification and acceptance, the commit plan and the
deferred context flush run without a host read of a device value (on CPU
tensors standing in for CUDA ones). The worker's whole step is counted on the
real engine in test/integration/test_host_syncs.py."""

import torch

from sglang_dflash.context import DraftContext, DraftKVCache
from sglang_dflash.draft import plan_commit
from sglang_dflash.host_syncs import HostSyncCounter
from sglang_dflash.randomness import counter_uniforms
from sglang_dflash.select import one_hot, walk
from sglang_dflash.verify import SamplingRows, VerifyUniforms, verify_block

torch.set_num_threads(1)


def test_counter_sees_each_kind_of_read_and_skips_paused_sections():
    x = torch.arange(6)
    with HostSyncCounter() as counter:
        int(x.max())
        bool((x > 2).any())
        x[x > 2]
        x.tolist()
        x.nonzero()
        x.repeat_interleave(torch.ones(6, dtype=torch.int64))
        x.repeat_interleave(2)  # int repeats: the size is known, no read
        torch.nn.functional.one_hot(x, 6)  # checks the index range on the host
        with counter.paused():
            x.tolist()
    assert counter.reads == {"aten._local_scalar_dense": 4, "aten.index": 1, "Tensor.tolist": 1,
                             "aten.nonzero": 1, "aten.repeat_interleave": 1}, counter.reads
    assert x.tolist() == list(range(6))  # tolist is restored after the block


def test_one_hot_equals_torch_without_a_read():
    index = torch.randint(9, (4, 5))
    with HostSyncCounter() as counter:
        ours = one_hot(index, 9)
    assert counter.total == 0
    assert torch.equal(ours, torch.nn.functional.one_hot(index, 9).float())


def test_stages_of_a_sampled_step_read_nothing_back():
    gen = torch.Generator().manual_seed(0)
    bs, slots, k, vocab = 4, 5, 6, 50
    scores = torch.randn(bs, slots, k, k, generator=gen)
    cand_ids = torch.randint(vocab, (bs, slots, k), generator=gen)
    greedy = torch.tensor([True, False, False, True])
    rows = SamplingRows(temperature=torch.tensor([1.0, 0.7, 1.3, 1.0]), top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]),
                        top_k=torch.tensor([1, 20, -1, 1]), min_p=torch.zeros(bs))
    logits = torch.randn(bs, slots + 1, vocab, generator=gen)
    kv = DraftKVCache(num_layers=2, num_slots=64, num_kv_heads=1, head_dim=4, dtype=torch.float32,
                      device="cpu")
    project = lambda f, p: (f[:, :4].view(1, -1, 1, 4).expand(2, -1, -1, -1),) * 2  # noqa: E731
    context = DraftContext(kv, project)
    with HostSyncCounter() as counter:
        path = walk(scores, cand_ids, rows.temperature, greedy, torch.rand(bs, slots, generator=gen))
        seeded = counter_uniforms(torch.tensor([1, 2, 3, 4]), torch.tensor([10, 11, 12, 13]), 2 * slots + 1)
        uniforms = VerifyUniforms(accept=seeded[:, :slots], sample=seeded[:, slots:])
        result = verify_block(path.tokens, logits, rows, uniforms, q_ids=cand_ids, q_probs=path.q)
        plan = plan_commit(result.accept_len, torch.tensor([7, 9, 3, 12]))
        rows_slots = torch.arange(bs * (slots + 1)) % 40  # repeated slots: the flush keeps the last
        context.commit(torch.randn(bs * (slots + 1), 8), torch.arange(bs * (slots + 1)), rows_slots,
                       defer=True)
        context.flush()
    assert counter.total == 0, counter.reads
    assert plan.commit_lens.shape == (bs,)
