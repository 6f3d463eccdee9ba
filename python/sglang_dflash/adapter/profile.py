"""Start-up cost profile for the speculation policy, measured on the actual device.

A verify step's cost grows with the tokens it processes (bs * (W+1)): the
target's dense layers and LM head over those tokens dominate at the batch sizes
where speculation is in question, and attention over the context adds a part
that the policy's online correction learns from real steps. We time exactly
those parts with the target's own weights: every 2-D weight of the target's
decoder layers plus the LM head, applied to bs * q tokens, and the drafter's
real block forward for `bs` requests over a context of `context_len` tokens
followed by the worker's own proposal step (the head, and for DFlash 2 the
candidates, selector and walk).
"""

from __future__ import annotations

import functools
import time

import torch

from sglang_dflash.adapter.target_parts import decoder_stack
from sglang_dflash.propose import propose
from sglang_dflash.vocab_head import VocabHead

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def _best_times(makers: list, passes: int = 3) -> list[float]:
    """The fastest of `passes` timings of each sample; `makers[i]()` builds
    sample i's inputs and returns the call to time (warmed up once, in the
    first pass).

    Passes sweep all samples in turn rather than repeating one back to back:
    a server profiles while its other processes (tokenizer, detokenizer)
    start on the same cores, and a burst of other work then covers one pass of
    a sample, not all its repetitions, and the minimum drops it. Inputs are
    built per sample and pass, so only one sample's inputs are alive at a
    time."""
    best = [float("inf")] * len(makers)
    for p in range(passes):
        for i, make in enumerate(makers):
            fn = make()
            if p == 0:
                fn()  # warm-up (allocator, kernel selection)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            best[i] = min(best[i], time.perf_counter() - start)
            del fn
    return best


def _dense_weights(target_model) -> list[torch.Tensor]:
    layers = decoder_stack(target_model).layers
    weights = [p for p in layers.parameters() if p.dim() == 2]
    from sglang.srt.lora.layers import unwrap_lora_layer

    return weights + [unwrap_lora_layer(target_model.lm_head).weight]


def _timed_weights(weights: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """The weights as the profile multiplies them, in the activation dtype.

    A weight stored in another type (int8 / FP8 / packed AWQ storage) cannot
    multiply activations directly; it is timed as a dense weight of its stored
    shape in the activation dtype, one stand-in per distinct shape. That
    approximates a quantized matmul; the policy's online correction learns the
    rest from real steps."""
    stand_ins: dict[tuple, torch.Tensor] = {}
    timed = []
    for w in weights:
        if w.dtype == dtype:
            timed.append(w)
            continue
        key = tuple(w.shape)
        if key not in stand_ins:
            stand_ins[key] = torch.randn(key, device=w.device, dtype=dtype)
        timed.append(stand_ins[key])
    return timed


@torch.no_grad()
def profile_costs(target_model, drafter, block_size: int, *, dtype=None, widths=None,
                  batch_sizes=BATCH_SIZES, context_len: int = 256) -> list[tuple]:
    """Samples `(bs, tokens_per_request, drafted, seconds)` for `CostModel.from_profile`.

    `dtype`: the target's activation dtype (SGLang's `model_runner.dtype`);
    None takes the LM head's. Inputs are built in it, never in the type a
    quantized layer stores its weights in."""
    weights = _dense_weights(target_model)
    dtype = dtype or weights[-1].dtype
    weights = _timed_weights(weights, dtype)
    widths = sorted(set(widths or range(block_size)) | {0})
    keys, makers = [], []
    for bs in batch_sizes:
        for width in widths:
            keys.append((bs, width + 1, False))
            makers.append(functools.partial(_verify_fn, weights, bs * (width + 1)))
        keys.append((bs, None, True))
        makers.append(functools.partial(_draft_fn, drafter, bs, block_size, context_len, weights[-1]))
    seconds = dict(zip(keys, _best_times(makers)))
    samples = []
    for bs in batch_sizes:
        samples += [(bs, width + 1, False, seconds[bs, width + 1, False]) for width in widths]
        # A drafted step = a plain step plus the drafter's block forward.
        samples.append((bs, 1, True, seconds[bs, 1, False] + seconds[bs, None, True]))
    return samples


def _verify_fn(weights, num_tokens: int):
    dev, dt = weights[-1].device, weights[-1].dtype  # every timed weight is in the activation dtype
    inputs = {w.shape[1]: torch.randn(num_tokens, w.shape[1], device=dev, dtype=dt) for w in weights}

    def verify():
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    return verify


def _draft_fn(drafter, bs, block_size, context_len, lm_head_weight):
    cfg = drafter.cfg
    param = next(drafter.parameters())
    device, dtype = param.device, param.dtype
    embeds = torch.randn(bs, block_size, cfg.hidden_size, device=device, dtype=dtype)
    positions = torch.arange(context_len, context_len + block_size, device=device).expand(bs, -1)
    kv_shape = (cfg.num_hidden_layers, bs, context_len, cfg.num_key_value_heads, cfg.head_dim)
    ctx_k = torch.randn(kv_shape, device=device, dtype=dtype)
    ctx_v = torch.randn(kv_shape, device=device, dtype=dtype)
    valid = torch.ones(bs, context_len, dtype=torch.bool, device=device)

    anchor = torch.zeros(bs, dtype=torch.int64, device=device)
    greedy = torch.ones(bs, dtype=torch.bool, device=device)
    temperature = torch.ones(bs, device=device)
    uniforms = torch.rand(bs, block_size - 1, device=device)
    # This rank's head rows, without a gather: the profile times local work only
    # (no collective, so ranks need not profile in step).
    head = VocabHead.whole(lm_head_weight, lm_head_weight.shape[0])

    def draft():
        # The worker's own path from block states to drafts (`_draft`): the
        # head, and for DFlash 2 the candidates, selector scores and walk.
        h = drafter.forward_block(embeds, positions, ctx_k, ctx_v, valid)[:, 1:]
        propose(drafter, h, anchor, head, temperature, greedy, uniforms, all_greedy=True)

    return draft
