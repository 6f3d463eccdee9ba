"""adapter/penalty_order.py: penalizers reach SGLang's orchestrator in one fixed order."""

from sglang_dflash.adapter.penalty_order import fixed_penalty_order, ordered


def _classes(*names):
    return [type(name, (), {}) for name in names]


def test_additive_penalties_before_the_scaling_one_from_any_set_order():
    freq, min_new, pres, rep, other = _classes("BatchedFrequencyPenalizer", "BatchedMinNewTokensPenalizer",
                                               "BatchedPresencePenalizer", "BatchedRepetitionPenalizer",
                                               "BatchedThingPenalizer")
    for given in ([rep, pres, other, min_new, freq], [other, freq, rep, min_new, pres], {rep, freq, pres}):
        names = [cls.__name__ for cls in ordered(given)]
        want = [c.__name__ for c in (freq, min_new, pres, rep, other) if c in list(given)]
        assert names == want


def test_hook_rewrites_keyword_and_positional_penalizers():
    freq, rep = _classes("BatchedFrequencyPenalizer", "BatchedRepetitionPenalizer")
    args, kwargs = fixed_penalty_order("self", vocab_size=8, batch="b", penalizers={rep, freq})
    assert args == ("self",) and kwargs["penalizers"] == [freq, rep] and kwargs["vocab_size"] == 8
    args, kwargs = fixed_penalty_order("self", 8, "b", [rep, freq])
    assert args == ("self", 8, "b", [freq, rep]) and kwargs == {}
