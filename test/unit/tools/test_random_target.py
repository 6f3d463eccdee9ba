"""tools.random_target: a random Qwen3 checkpoint that transformers loads with the asked shape."""

import torch

from sglang_dflash.tools.random_target import Qwen3Shape, write_random_qwen3


def test_random_qwen3_loads_with_its_shape(tmp_path):
    from transformers import AutoModelForCausalLM

    shape = Qwen3Shape(vocab=300, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=64,
                       max_pos=128)
    params = write_random_qwen3(str(tmp_path), shape, seed=3, head_std=0.5)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.lm_head.weight.shape == (300, 32) and model.config.num_key_value_heads == 2
    assert 0.4 < float(model.lm_head.weight.std()) < 0.6  # head_std applied
    again = tmp_path / "again"
    write_random_qwen3(str(again), shape, seed=3, head_std=0.5)
    reloaded = AutoModelForCausalLM.from_pretrained(str(again))
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)  # seeded
