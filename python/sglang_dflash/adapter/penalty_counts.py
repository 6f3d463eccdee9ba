"""A request re-prefilled with output already generated keeps its penalty counts.

SGLang 0.5.23 counts a request's output for the frequency, presence and
repetition penalties step by step in the batch's penalizer orchestrator, and
builds a new orchestrator, with zero counts, for every prefill batch. A request
retracted under KV pressure (or by `/pause_generation` in `retract` mode) comes
back through such a prefill with its output so far in `req.output_ids`, so from
then on plain decoding penalized only the tokens generated after the re-prefill
(the re-prefill's own token not at all): the same request's output depended on
whether the server ran short of memory. DFLASH's verify rows count the whole
output (verify_logits.py resets a slot's counts to `req.output_ids` at every
prefill). An AFTER hook on the orchestrator's constructor counts, for an extend
batch, the output each request arrives with, so plain decoding, speculation off
and DFLASH penalize a retracted request as if it had never left.

Only extend batches: a fresh request has no output, and a prefill-decode
disaggregation decode server's prebuilt batch (its requests arrive with the
prefill server's token) counts that token at its first decode step, as SGLang's
decode step counts the token before it.
"""

from __future__ import annotations

import torch

ORCHESTRATOR_INIT_TARGET = (
    "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.__init__")

# penalizer class -> (its counts [bs, V], its per-request value [bs, 1], whether
# each occurrence adds the value (frequency) or the first sets it)
_COUNTED = {
    "BatchedFrequencyPenalizer": ("cumulated_frequency_penalties", "frequency_penalties", True),
    "BatchedPresencePenalizer": ("cumulated_presence_penalties", "presence_penalties", False),
    "BatchedRepetitionPenalizer": ("cumulated_repetition_penalties", "repetition_penalties", False),
}


def count_earlier_output(result, orchestrator, *args, **kwargs):
    """AFTER BatchedPenalizerOrchestrator(vocab_size, batch, penalizers)."""
    batch = orchestrator.batch
    mode = getattr(batch, "forward_mode", None)
    if not orchestrator.is_required or mode is None or not mode.is_extend():
        return result
    counted = [(penalizer, _COUNTED[type(penalizer).__name__])
               for penalizer in orchestrator.penalizers.values()
               if type(penalizer).__name__ in _COUNTED and penalizer.is_prepared()]
    earlier = [(i, req.output_ids) for i, req in enumerate(batch.reqs) if req.output_ids]
    if not counted or not earlier:  # e.g. min_new_tokens alone, or no retracted request
        return result
    device = orchestrator.device
    rows = torch.tensor([i for i, ids in earlier for _ in ids], dtype=torch.int64, device=device)
    tokens = torch.tensor([t for _, ids in earlier for t in ids], dtype=torch.int64, device=device)
    for penalizer, (counts_name, value_name, adds) in counted:
        add_counts(getattr(penalizer, counts_name), getattr(penalizer, value_name), rows, tokens, adds)
    return result


def add_counts(counts: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor,
               adds: bool) -> None:
    """Count tokens [n] of rows [n] into counts [bs, V] in place, as the
    penalizer's step-by-step update would: value [bs, 1] of the row added per
    occurrence (`adds`) or set at each token that occurred."""
    counts.index_put_((rows, tokens), values[rows, 0].to(counts.dtype), accumulate=adds)
