"""Start-up cost profile for the speculation policy, measured on the actual device.

A verify step's cost grows with the tokens it processes (bs * (W+1)): the
target's dense layers and LM head over those tokens dominate at the batch sizes
where speculation is in question, and attention over the context adds a part
that the policy's online correction learns from real steps. We time exactly
those parts with the target's own weights: every 2-D weight of the target's
decoder layers plus the LM head, applied to bs * q tokens, and the drafter's
real block forward for `bs` requests over a context of `context_len` tokens.
"""

from __future__ import annotations

import time

import torch

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def _time(fn, reps: int = 3) -> float:
    fn()  # warm-up (allocator, kernel selection)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _dense_weights(target_model) -> list[torch.Tensor]:
    layers = target_model.model.layers
    weights = [p for p in layers.parameters() if p.dim() == 2]
    return weights + [target_model.lm_head.weight]


@torch.no_grad()
def profile_costs(target_model, drafter, block_size: int, *, widths=None,
                  batch_sizes=BATCH_SIZES, context_len: int = 256) -> list[tuple]:
    """Samples `(bs, tokens_per_request, drafted, seconds)` for `CostModel.from_profile`."""
    weights = _dense_weights(target_model)
    widths = sorted(set(widths or range(block_size)) | {0})
    samples = []
    for bs in batch_sizes:
        for width in widths:
            samples.append((bs, width + 1, False, _time_verify(weights, bs * (width + 1))))
        # A drafted step = a plain step plus the drafter's block forward.
        plain = samples[-len(widths)][3]
        draft = _time_draft(drafter, bs, block_size, context_len, weights[-1])
        samples.append((bs, 1, True, plain + draft))
    return samples


def _time_verify(weights, num_tokens: int) -> float:
    dev, dt = weights[0].device, weights[0].dtype
    inputs = {w.shape[1]: torch.randn(num_tokens, w.shape[1], device=dev, dtype=dt) for w in weights}

    def verify():
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    return _time(verify)


def _time_draft(drafter, bs, block_size, context_len, lm_head_weight) -> float:
    cfg = drafter.cfg
    param = next(drafter.parameters())
    device, dtype = param.device, param.dtype
    embeds = torch.randn(bs, block_size, cfg.hidden_size, device=device, dtype=dtype)
    positions = torch.arange(context_len, context_len + block_size, device=device).expand(bs, -1)
    kv_shape = (cfg.num_hidden_layers, bs, context_len, cfg.num_key_value_heads, cfg.head_dim)
    ctx_k = torch.randn(kv_shape, device=device, dtype=dtype)
    ctx_v = torch.randn(kv_shape, device=device, dtype=dtype)
    valid = torch.ones(bs, context_len, dtype=torch.bool, device=device)

    def draft():
        h = drafter.forward_block(embeds, positions, ctx_k, ctx_v, valid)
        (h[:, 1:] @ lm_head_weight.T).argmax(-1)

    return _time(draft)
