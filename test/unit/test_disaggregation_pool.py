"""PD disaggregation pieces (adapter/disaggregation.py) that need no SGLang: the
context pool as SGLang's KV transfer registers it, moved page by page the way
the transfer moves it (bytes at pointer + page * item length), lands each row
in the decode pool's slot; the pool writes at once when it may not defer; the
decode-side hook starts transferred requests on the worker."""

import ctypes
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.adapter.disaggregation import (  # noqa: E402
    ContextPoolView, host_indices_on_cpu, start_transferred)
from sglang_dflash.context import DraftContext, DraftKVCache  # noqa: E402

LAYERS, PAGE, HEADS, DIM = 3, 4, 2, 8
SLOTS = 10 * PAGE


def _pool(seed=None):
    kv = DraftKVCache(num_layers=LAYERS, num_slots=SLOTS, num_kv_heads=HEADS, head_dim=DIM,
                      dtype=torch.bfloat16, device="cpu")
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        kv.k.copy_(torch.randn(kv.k.shape, generator=gen))
        kv.v.copy_(torch.randn(kv.v.shape, generator=gen))
    return kv


def _transfer(src: ContextPoolView, dst: ContextPoolView, src_pages, dst_pages):
    """What SGLang's Mooncake sender does per registered buffer: copy item-length
    bytes from each source page to the matching destination page."""
    src_ptrs, src_lens, src_items = src.get_contiguous_buf_infos()
    dst_ptrs, dst_lens, dst_items = dst.get_contiguous_buf_infos()
    assert src_items == dst_items and src_lens == dst_lens
    for sp, dp, item, length in zip(src_ptrs, dst_ptrs, src_items, src_lens):
        for s, d in zip(src_pages, dst_pages):
            assert (max(s, d) + 1) * item <= length
            ctypes.memmove(dp + d * item, sp + s * item, item)


def test_buffers_are_k_then_v_per_layer_with_a_page_per_item():
    kv = _pool(0)
    view = ContextPoolView(kv, PAGE)
    ptrs, lens, items = view.get_contiguous_buf_infos()
    assert view.layer_num == LAYERS and len(ptrs) == 2 * LAYERS
    assert ptrs == [kv.k[i].data_ptr() for i in range(LAYERS)] + [kv.v[i].data_ptr() for i in range(LAYERS)]
    row = HEADS * DIM * kv.k.element_size()
    assert items == [PAGE * row] * (2 * LAYERS)
    assert lens == [(SLOTS + 1) * row] * (2 * LAYERS)


def test_a_page_transfer_puts_each_row_in_the_destination_slot():
    src, dst = _pool(1), _pool()
    before = dst.k.clone(), dst.v.clone()
    src_pages, dst_pages = [2, 7, 3], [5, 0, 9]
    _transfer(ContextPoolView(src, PAGE), ContextPoolView(dst, PAGE), src_pages, dst_pages)
    moved = torch.zeros(SLOTS + 1, dtype=torch.bool)
    for s, d in zip(src_pages, dst_pages):
        src_rows, dst_rows = slice(s * PAGE, (s + 1) * PAGE), slice(d * PAGE, (d + 1) * PAGE)
        assert torch.equal(dst.k[:, dst_rows], src.k[:, src_rows])
        assert torch.equal(dst.v[:, dst_rows], src.v[:, src_rows])
        moved[dst_rows] = True
    assert torch.equal(dst.k[:, ~moved], before[0][:, ~moved])  # nothing else written
    assert torch.equal(dst.v[:, ~moved], before[1][:, ~moved])


def _project(features, positions):
    k = torch.stack([features.view(-1, HEADS, DIM) + layer for layer in range(LAYERS)])
    return k, -k


def test_a_pool_that_may_not_defer_writes_deferred_rows_at_once():
    context = DraftContext(_pool(), _project, deferrable=False)
    features = torch.randn(3, HEADS * DIM)
    slots = torch.tensor([4, 9, 30])
    context.commit(features, torch.arange(3), slots, defer=True)
    assert context.pending_rows == 0
    k, _ = _project(features, torch.arange(3))
    assert torch.equal(context.kv.k[:, slots], k.to(context.kv.k.dtype))


class _Batch(SimpleNamespace):
    def is_empty(self):
        return not self.reqs


def test_transferred_requests_reach_the_worker():
    seen = []
    scheduler = SimpleNamespace(draft_worker=SimpleNamespace(on_transferred=seen.append))
    batch = _Batch(reqs=["a", "b"])
    assert start_transferred(batch, scheduler, None) is batch
    assert start_transferred(None, scheduler, None) is None
    assert start_transferred(_Batch(reqs=[]), scheduler, None) is not None
    assert seen == [batch]
    plain = SimpleNamespace(draft_worker=None)  # a server without speculation
    assert start_transferred(batch, plain, None) is batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path; a CUDA host keeps SGLang's")
def test_sender_takes_plain_host_indices_without_cuda():
    class Sender:
        supports_host_tensor_indices = True

    req = SimpleNamespace(disagg_kv_sender=Sender())
    assert host_indices_on_cpu(None, req, last_chunk=True) is None
    assert req.disagg_kv_sender.supports_host_tensor_indices is False
    assert Sender.supports_host_tensor_indices is True  # the class is left alone
    host_indices_on_cpu(None, SimpleNamespace(disagg_kv_sender=None))  # no sender: nothing to do
