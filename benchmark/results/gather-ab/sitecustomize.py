# Throwaway A/B switch (session 20): with AB_SLICE=s, odd s-second slices of
# time.perf_counter() run the new gathers / head matmul, even slices the old.
import os
if os.environ.get("AB_SLICE"):
    import time
    import torch
    from sglang_dflash import candidates, context, ragged, verify_attention
    _period = float(os.environ["AB_SLICE"])

    def _new():
        return int(time.perf_counter() / _period) % 2 == 1

    _new_gather = ragged.gather_rows

    def _old_gather(cache, slots, dim=0):
        return cache[slots.long()] if dim == 0 else cache[:, slots.long()]

    def _gather(cache, slots, dim=0):
        return (_new_gather if _new() else _old_gather)(cache, slots, dim)

    verify_attention.gather_rows = _gather
    context.gather_rows = _gather
    _new_head = candidates.head_logits

    def _old_head(hidden, weight):
        return torch.matmul(hidden.float(), weight.float().t())

    candidates.head_logits = lambda h, w: (_new_head if _new() else _old_head)(h, w)
