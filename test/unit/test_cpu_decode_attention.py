"""The torch_native backend's DECODE on a CPU: a batch attends in
length-sorted groups (`verify_attention` with a one-token block; one request
unmasked over the keys it may see); its output equals upstream's per-request
loop, on SGLang's own KV pools, with grouped-query heads, a sliding window and
a hybrid pool's windowed layers (read through the full -> windowed slot mapping)."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_dflash.adapter.attention import VerifyCapableTorchNativeAttnBackend

SLOTS, CONTEXT, HEADS, KV_HEADS, DIM = 16384, 320, 4, 2, 16


def _never(*args, **kwargs):
    raise AssertionError("upstream's per-request loop ran")


def _pool(windowed: bool):
    if not windowed:
        return MHATokenToKVPool(size=SLOTS, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=DIM,
                                layer_num=2, device="cpu", enable_memory_saver=False)
    pool = SWAKVPool(size=SLOTS, size_swa=SLOTS, page_size=1, dtype=torch.float32, head_num=KV_HEADS,
                     head_dim=DIM, swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
    # Windowed slots differ from full ones: a read that skips the mapping
    # attends to other tokens' K/V.
    mapping = torch.randperm(SLOTS + 1, generator=torch.Generator().manual_seed(1)).to(torch.int64)
    pool.register_mapping(torch.cat([mapping, torch.tensor([-1])]))
    return pool


def _batch(lens, gen):
    """A DECODE batch of len(lens) requests whose lengths count the new token;
    each request's tokens sit in distinct random slots (slot 0 is SGLang's dummy)."""
    bs = len(lens)
    req_pool = ReqToTokenPool(size=bs + 2, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
    rows = req_pool.req_to_token.shape[0]
    slots = torch.randperm(SLOTS - 1, generator=gen)[: rows * CONTEXT] + 1
    req_pool.req_to_token.copy_(slots.view(rows, CONTEXT).to(torch.int32))
    req_pool_indices = torch.randperm(bs + 2, generator=gen)[:bs]
    seq_lens = torch.tensor(lens, dtype=torch.int64)
    new_slots = req_pool.req_to_token[req_pool_indices, seq_lens - 1].to(torch.int64)
    forward_batch = SimpleNamespace(seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(), req_pool_indices=req_pool_indices,
                                    out_cache_loc=new_slots, encoder_lens=None, forward_mode=ForwardMode.DECODE)
    return req_pool, forward_batch


def _decode(pool, req_pool, forward_batch, layer, q, k, v, loop: bool, monkeypatch):
    backend = VerifyCapableTorchNativeAttnBackend(
        SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=pool))
    backend._decode_loop = loop
    backend.init_forward_metadata(forward_batch)
    with monkeypatch.context() as patch:
        if not loop:
            patch.setattr(TorchNativeAttnBackend, "_run_sdpa_forward_decode", _never)
        return backend.forward_decode(q, k, v, layer, forward_batch)


@pytest.mark.parametrize("lens", [[3], [300], [5, 9], [1, 40, 7, 300, 12],
                                  [int(n) for n in torch.arange(3, 320, 15)]],
                         ids=["1-inside-window", "1", "2", "5", "22"])
@pytest.mark.parametrize("kind", ["full", "window", "hybrid-windowed", "hybrid-full"])
def test_grouped_decode_equals_upstream_loop(lens, kind, monkeypatch):
    gen = torch.Generator().manual_seed(len(lens))
    pool = _pool(kind.startswith("hybrid"))
    for layer_id in (0, 1):
        pool.get_key_buffer(layer_id).copy_(torch.randn(pool.get_key_buffer(layer_id).shape, generator=gen))
        pool.get_value_buffer(layer_id).copy_(torch.randn(pool.get_value_buffer(layer_id).shape, generator=gen))
    layer = RadixAttention(HEADS, DIM, DIM ** -0.5, KV_HEADS, layer_id=1 if kind == "hybrid-full" else 0,
                           sliding_window_size=6 if kind in ("window", "hybrid-windowed") else -1)
    req_pool, forward_batch = _batch(lens, gen)
    bs = len(lens)
    q = torch.randn(bs, HEADS * DIM, generator=gen)
    k, v = torch.randn(bs, KV_HEADS, DIM, generator=gen), torch.randn(bs, KV_HEADS, DIM, generator=gen)

    grouped = _decode(pool, req_pool, forward_batch, layer, q, k, v, False, monkeypatch)
    loop = _decode(pool, req_pool, forward_batch, layer, q, k, v, True, monkeypatch)
    assert grouped.shape == (bs, HEADS * DIM)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-5)


def test_cross_attention_keeps_upstream_loop(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    pool = _pool(False)
    calls = []
    original = TorchNativeAttnBackend._run_sdpa_forward_decode

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TorchNativeAttnBackend, "_run_sdpa_forward_decode", counted)
    backend = VerifyCapableTorchNativeAttnBackend(
        SimpleNamespace(device="cpu", req_to_token_pool=None, token_to_kv_pool=pool))
    for lens in ([9], [9, 4]):
        req_pool, forward_batch = _batch(lens, gen)
        backend.req_to_token_pool = req_pool
        forward_batch.encoder_out_cache_loc = forward_batch.out_cache_loc
        layer = RadixAttention(HEADS, DIM, DIM ** -0.5, KV_HEADS, layer_id=0, is_cross_attention=True)
        backend.init_forward_metadata(forward_batch)
        q = torch.randn(len(lens), HEADS * DIM, generator=gen)
        backend.forward_decode(q, None, None, layer, forward_batch, save_kv_cache=False)
    assert len(calls) == 2
