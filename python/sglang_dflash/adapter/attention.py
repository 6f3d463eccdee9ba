"""TARGET_VERIFY support for SGLang's `torch_native` attention backend.

SGLang 0.5.23's `TorchNativeAttnBackend` handles EXTEND and DECODE only: a
TARGET_VERIFY batch carries no `extend_prefix_lens`/`extend_seq_lens`, and its
`seq_lens` are the committed prefix lengths (backends widen them by the block
width themselves). We install this subclass in place of the original (a
HookRegistry class REPLACE), so `--attention-backend torch_native` can verify a
DFLASH block: a verify block is exactly an extend of `draft_token_num` tokens
on top of the committed prefix, with causal masking (the block is a linear
chain). A verify batch with a tree mask (SGLang's NGRAM; on CPU it carries
the `[bs, n, n]` mask among the block's own tokens only) is attended through
that mask; any other mask layout is refused rather than ignored.

Hybrid sliding-window targets (Laguna, gpt-oss, Gemma 4, MiMo-V2: SGLang's
`SWAKVPool`) keep their sliding layers' K/V in a second, smaller pool whose
slots are the full pool's translated (`translate_loc_from_full_to_swa`).
Upstream's EXTEND and DECODE write those layers at the translated slots but
read them at the untranslated ones: right only while both allocators happen
to hand out the same ids, then wrong values, and an IndexError once a full
slot id passes the windowed pool's size. Here every read of a sliding
layer (EXTEND, DECODE, TARGET_VERIFY) goes through the mapping; otherwise
EXTEND behaves exactly as upstream.

DECODE is a one-token verify block per request and goes through the same
grouped attention (one SDPA call per length-sorted group, not upstream's
call per request; a single request unmasked over the keys it may see), in
every server the plugin is loaded in, so plain decoding, speculation off
and verify steps share one attention. Its output equals upstream's loop
within float rounding.

Multi-head latent attention targets (DeepSeek-V2/V3, Kimi-K2.5) prefill a batch
with no cached prefix through per-head K/V while caching the compressed latent
themselves; upstream's EXTEND attends over the pool's latent rows instead (a
shape error), so that prefill attends over the K/V it is handed. Their other
steps (extends over a prefix, decode, verify) attend over the latent rows as
one shared KV head, which the generic paths already do.
"""

from __future__ import annotations

import contextlib
import os

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MLATokenToKVPool
from torch.nn.functional import scaled_dot_product_attention

from sglang_dflash.verify_attention import verify_attention

# SGLANG_DFLASH_DECODE_LOOP=1 keeps upstream's DECODE (one SDPA call per
# request) on every batch: for A/B runs and as the way back.
DECODE_LOOP_ENV = "SGLANG_DFLASH_DECODE_LOOP"


class SlotsThroughMapping:
    """A slot table read through the pool's full -> windowed slot translation:
    indexing it gives windowed-pool slots (0, SGLang's dummy slot, for tokens
    whose window slot was already freed; the window mask hides them)."""

    def __init__(self, table, pool):
        self.table, self.pool = table, pool

    def __getitem__(self, index):
        return self.pool.translate_loc_from_full_to_swa(self.table[index])


class VerifyCapableTorchNativeAttnBackend(TorchNativeAttnBackend):
    # The slot table upstream's per-request SDPA loops read: set to a
    # SlotsThroughMapping while a windowed-pool layer runs (see _reads_for).
    _window_slots = None

    def __init__(self, model_runner):
        super().__init__(model_runner)
        self._decode_loop = os.environ.get(DECODE_LOOP_ENV, "0") == "1"

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.forward_mode.is_target_verify():
            return self._forward_target_verify(q, k, v, layer, forward_batch, save_kv_cache)
        if self._is_mla_expanded_prefill(k, layer, save_kv_cache):
            return self._forward_own_kv(q, k, v, layer, forward_batch)
        with self._reads_for(layer):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if not self._decode_loop and _grouped_decode(layer, forward_batch):
            # A decode row is a one-token block on top of the request's
            # committed tokens (DECODE lengths count the new one).
            lens = forward_batch.seq_lens
            return self._attend_over_prefix(q, k, v, layer, forward_batch, save_kv_cache, lens - 1, 1,
                                            int(lens.max()))
        with self._reads_for(layer):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)

    def _is_mla_expanded_prefill(self, k, layer, save_kv_cache) -> bool:
        """An MLA model's MHA prefill: it caches the compressed latent itself and
        hands over per-head K/V, which the latent pool's rows are not."""
        return (not save_kv_cache and k is not None and isinstance(self.token_to_kv_pool, MLATokenToKVPool)
                and layer.qk_head_dim != self.token_to_kv_pool.get_key_buffer(layer.layer_id).shape[-1])

    def _forward_own_kv(self, q, k, v, layer, forward_batch):
        """Causal attention of each request's new tokens over the K/V passed in.
        SGLang picks MLA's MHA prefill (the triton backend's rule, which
        torch_native inherits) only when no request has a cached prefix; the
        latent path handles the rest, so a prefix here is refused."""
        if any(forward_batch.extend_prefix_lens_cpu):
            raise NotImplementedError("torch_native: an MLA per-head prefill over a cached prefix")
        heads = layer.tp_q_head_num
        q_ = q.reshape(-1, heads, layer.qk_head_dim).transpose(0, 1)
        k_ = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim).transpose(0, 1)
        v_ = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim).transpose(0, 1)
        out = q.new_empty((heads, q_.shape[1], layer.v_head_dim))
        start = 0
        for n in forward_batch.extend_seq_lens_cpu:
            rows = slice(start, start + n)
            out[:, rows] = scaled_dot_product_attention(
                q_[:, rows], k_[:, rows].to(q.dtype), v_[:, rows].to(q.dtype), is_causal=True,
                scale=layer.scaling, enable_gqa=heads != layer.tp_k_head_num)
            start += n
        return out.transpose(0, 1).reshape(q.shape[0], heads * layer.v_head_dim)

    def _in_window_pool(self, layer) -> bool:
        return self.use_sliding_window_kv_pool and self.token_to_kv_pool.layers_mapping[layer.layer_id][1]

    @contextlib.contextmanager
    def _reads_for(self, layer):
        """Upstream's loops index the table they are handed; for a layer of the
        windowed pool they get it through the mapping."""
        if not self._in_window_pool(layer):
            yield
            return
        self._window_slots = SlotsThroughMapping(self.req_to_token_pool.req_to_token, self.token_to_kv_pool)
        try:
            yield
        finally:
            self._window_slots = None

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, *args, **kwargs):
        table = req_to_token if self._window_slots is None else self._window_slots
        return super()._run_sdpa_forward_extend(query, output, k_cache, v_cache, table, *args, **kwargs)

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, *args, **kwargs):
        table = req_to_token if self._window_slots is None else self._window_slots
        return super()._run_sdpa_forward_decode(query, output, k_cache, v_cache, table, *args, **kwargs)

    def _forward_target_verify(self, q, k, v, layer, forward_batch, save_kv_cache):
        if layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY:
            raise NotImplementedError(
                "torch_native TARGET_VERIFY supports causal decoder self-attention only"
            )
        width = int(forward_batch.spec_info.draft_token_num)
        # Only the columns the block can see: the table is as wide as the model's
        # context, and a full row per request per layer is a large copy.
        span = int(forward_batch.seq_lens.max()) + width
        return self._attend_over_prefix(q, k, v, layer, forward_batch, save_kv_cache, forward_batch.seq_lens,
                                        width, span, tree_mask=_tree_mask(forward_batch, width))

    def _attend_over_prefix(self, q, k, v, layer, forward_batch, save_kv_cache, prefix_lens, width, span,
                            tree_mask=None):
        """A `width`-token block per request on top of its prefix_lens [bs]
        cached tokens, through `verify_attention` (length-sorted groups, one
        SDPA each); `span` bounds every request's prefix + width."""
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        window = layer.sliding_window_size
        rows = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices, :span]
        if self._in_window_pool(layer):
            rows = self.token_to_kv_pool.translate_loc_from_full_to_swa(rows)
        query = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = verify_attention(
            query,
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            rows,
            prefix_lens,
            width,
            scaling=layer.scaling,
            sliding_window=window if window is not None and window > -1 else None,
            tree_mask=tree_mask,
        )
        return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)


def _grouped_decode(layer, forward_batch) -> bool:
    """DECODE through the grouped path: decoder self-attention. Upstream's loop
    calls SDPA once per request, whose fixed cost outweighs the attention itself
    at the contexts a CPU serves, and gathers K / V by advanced indexing, slower
    on a CPU than `index_select` even for one request (docs/decisions.md).
    Cross-attention and encoder-decoder batches keep upstream's loop."""
    return (not layer.is_cross_attention and layer.attn_type == AttentionType.DECODER
            and forward_batch.encoder_lens is None)


def _tree_mask(forward_batch, width):
    """The verify batch's [bs, n, n] tree mask, or None for a chain block."""
    mask = getattr(forward_batch.spec_info, "custom_mask", None)
    if mask is None:
        return None
    bs = forward_batch.seq_lens.shape[0]
    if mask.numel() != bs * width * width:
        raise NotImplementedError(
            f"torch_native TARGET_VERIFY: custom mask of {mask.numel()} entries for {bs} requests x "
            f"{width} tokens; only a [bs, n, n] mask among the block's tokens is supported"
        )
    return mask.view(bs, width, width).bool()
