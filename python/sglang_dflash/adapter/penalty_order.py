"""Sampling penalties in one fixed order, in every server.

SGLang 0.5.23 builds a batch's penalizers from a *set* of classes
(`SamplingBatchInfo.from_schedule_batch`) and applies them in that set's
iteration order, which follows the classes' addresses: it changes from one
process to the next. Frequency and presence penalties subtract, repetition
scales (divides a positive logit, multiplies a negative one), so a request
combining them got (l - f) / r from one server start and l / r - f from
another: plain decoding's own greedy output with combined penalties depended
on the start. A BEFORE hook hands the orchestrator the penalizers in the order
SGLang's source lists them (frequency, min_new_tokens, presence, repetition:
every additive penalty before the scaling), the order our verify rows apply
(penalties.py), so plain decoding, speculation off and DFLASH's verify agree
from any start.
"""

from __future__ import annotations

ORCHESTRATOR_TARGET = "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.__init__"

# SGLang's listing order; a penalizer not named here goes last (by name).
_ORDER = ("BatchedFrequencyPenalizer", "BatchedMinNewTokensPenalizer", "BatchedPresencePenalizer",
          "BatchedRepetitionPenalizer")


def ordered(penalizers) -> list:
    """The penalizer classes in `_ORDER`, others after them by name."""
    rank = {name: i for i, name in enumerate(_ORDER)}
    return sorted(penalizers, key=lambda cls: (rank.get(cls.__name__, len(_ORDER)), cls.__name__))


def fixed_penalty_order(*args, **kwargs):
    """BEFORE BatchedPenalizerOrchestrator(vocab_size, batch, penalizers):
    the same call with the penalizers as a list in `_ORDER`."""
    if "penalizers" in kwargs:
        kwargs["penalizers"] = ordered(kwargs["penalizers"])
    elif len(args) >= 4:
        args = (*args[:3], ordered(args[3]), *args[4:])
    return args, kwargs
