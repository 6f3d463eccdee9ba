"""Prompts given as embeddings (`input_embeds`) reach the target in its own dtype.

SGLang 0.5.23 casts a request's `input_embeds` to bfloat16 before the target's
forward (`ModelRunner._extend_forward_kwargs`) whatever the model's dtype, so a
float32 or float16 target fails its first matmul on such a request and the
scheduler dies with every running request: plain decoding and DFLASH alike, and
every CPU server that serves a float32 checkpoint in float32 (`sglang-dflash
serve`'s default). An AFTER hook hands the forward the request's embeddings in
the model's dtype instead (token-embedding overrides scattered over them again,
as SGLang does), so a prompt given as its own token embeddings decodes as the
same prompt given as ids. A bfloat16 target is left as SGLang serves it.
"""

from __future__ import annotations

EXTEND_KWARGS_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs"


def embeds_in_model_dtype(kwargs: dict, runner, forward_batch, *args, **kw) -> dict:
    """AFTER SGLang builds an extend's forward kwargs: `input_embeds` from the
    request in the runner's dtype rather than bfloat16."""
    embeds = forward_batch.input_embeds
    dtype = runner.dtype
    if embeds is None or kwargs.get("input_embeds") is None or kwargs["input_embeds"].dtype == dtype:
        return kwargs
    positions = forward_batch.replace_positions
    if forward_batch.replace_embeds is not None and positions is not None:
        embeds = embeds.to(dtype, copy=True)  # the overrides must not write into the batch's tensor
        embeds[positions] = forward_batch.replace_embeds.to(dtype)
    else:
        embeds = embeds.to(dtype)
    kwargs["input_embeds"] = embeds
    return kwargs
