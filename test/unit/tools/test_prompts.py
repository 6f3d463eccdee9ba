"""tools.prompts: the bundled prompt sets and their chat form."""

import pytest

from sglang_dflash.demo import tiny_paths
from sglang_dflash.tools.prompts import WORKLOADS, load_prompts, mixed_chat_prompts, mixed_prompts


def test_mixed_prompts_take_the_workloads_round_robin():
    first = {w: load_prompts(w, limit=2) for w in WORKLOADS}
    assert mixed_prompts(6) == [first["math"][0], first["code"][0], first["chat"][0],
                                first["math"][1], first["code"][1], first["chat"][1]]


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="unknown workload"):
        load_prompts("poetry")


def test_chat_prompts_wrap_each_prompt_in_one_user_turn():
    texts = mixed_chat_prompts(tiny_paths()["target"], 3)
    for prompt, text in zip(mixed_prompts(3), texts):
        # One user turn holding the prompt, then the opened assistant turn.
        assert text.count("<|im_start|>user\n") == 1 and f"\n{prompt}<|im_end|>" in text
        assert text.endswith("<|im_start|>assistant\n")
