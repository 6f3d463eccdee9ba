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
that mask; any other mask layout is refused rather than ignored. EXTEND and
DECODE behave exactly as upstream.
"""

from __future__ import annotations

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_dflash.verify_attention import verify_attention


class VerifyCapableTorchNativeAttnBackend(TorchNativeAttnBackend):
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if not forward_batch.forward_mode.is_target_verify():
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        return self._forward_target_verify(q, k, v, layer, forward_batch, save_kv_cache)

    def _forward_target_verify(self, q, k, v, layer, forward_batch, save_kv_cache):
        if layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY:
            raise NotImplementedError(
                "torch_native TARGET_VERIFY supports causal decoder self-attention only"
            )
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        window = layer.sliding_window_size
        width = int(forward_batch.spec_info.draft_token_num)
        # Only the columns the block can see: the table is as wide as the model's
        # context, and a full row per request per layer is a large copy.
        span = int(forward_batch.seq_lens.max()) + width
        query = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = verify_attention(
            query,
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices, :span],
            forward_batch.seq_lens,
            width,
            scaling=layer.scaling,
            sliding_window=window if window is not None and window > -1 else None,
            tree_mask=_tree_mask(forward_batch, width),
        )
        return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)


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
