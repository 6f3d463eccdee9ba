"""Mixed chunked prefill (`--enable-mixed-chunk`) under our DFLASH worker.

A mixed step runs a prefill chunk and every running request's pending token (the
last verify's bonus) as one extend; the worker's prefill path then commits the
running rows' hidden states to the drafter context like any extend row, and the
scheduler folds their one token into their output. SGLang samples those rows with
its own sampler, which is exact for them except for penalties: SGLang's penalizers
count output tokens only in plain decoding (`prepare_for_decode`), never for a
speculative batch, whose committed tokens our verify counts instead
(`verify_logits.OutputCounts`), and a request's grammar has not yet accepted the
bonus token it would constrain the next one after (our verify advances it with
the block). A running request with a frequency, presence or repetition penalty,
`min_new_tokens` or a grammar would be sampled against stale state, so while one
runs, the prefill is not mixed (SGLang keeps requests with logprobs out of mixed
steps the same way). Logit bias and custom logit processors are applied from the
request alone.
"""

from __future__ import annotations

from sglang_dflash.adapter.server_args import is_dflash

MIX_TARGET = "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw"


def no_mixing_with_stateful_requests(original, scheduler, *args, **kwargs):
    """AROUND the scheduler's prefill batching (`prefill_delayer_single_pass,
    running_batch`): an unmixed prefill while a request with penalties or a
    grammar decodes (DFLASH only; plain servers are untouched)."""
    from sglang_dflash.adapter.verify_logits import penalized

    running = kwargs["running_batch"] if "running_batch" in kwargs else args[1]
    hold = (getattr(scheduler, "is_mixed_chunk", False)
            and is_dflash(getattr(scheduler.server_args, "speculative_algorithm", ""))
            and any(penalized(req) or req.grammar is not None for req in running.reqs))
    if not hold:
        return original(scheduler, *args, **kwargs)
    scheduler.is_mixed_chunk = False
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        scheduler.is_mixed_chunk = True
