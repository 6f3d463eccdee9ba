"""Multimodal targets: the Qwen3-VL capture hook (adapter/layer_capture.py),
where a wrapper keeps its decoder stack (adapter/target_parts.py), and the tiny
Qwen3-VL pair (tools/tiny_vl.py)."""

import types

import pytest
import torch

from sglang_dflash.adapter.layer_capture import capture_qwen3_vl_layers
from sglang_dflash.adapter.target_parts import decoder_stack
from sglang_dflash.demo import tiny_paths


def _model(last_rank=True):
    return types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=last_rank),
                                 capture_aux_hidden_states=False,
                                 model=types.SimpleNamespace(layers_to_capture=[]))


def test_capture_before_the_layer_after_each_tap():
    model = _model()
    capture_qwen3_vl_layers(model, [0, 2])
    assert model.capture_aux_hidden_states is True
    assert model.model.layers_to_capture == [1, 3]


def test_capture_left_alone_off_the_last_pipeline_rank_and_refused_without_ids():
    model = _model(last_rank=False)
    capture_qwen3_vl_layers(model, [0, 2])
    assert model.model.layers_to_capture == [] and not model.capture_aux_hidden_states
    with pytest.raises(ValueError, match="layer_ids"):
        capture_qwen3_vl_layers(_model(), None)


def test_decoder_stack_of_text_models_and_multimodal_wrappers():
    stack = types.SimpleNamespace(embed_tokens="E", layers=["L"])
    text = types.SimpleNamespace(model=stack, lm_head="H")  # Qwen3, Llama, ... and Qwen3-VL
    lfm2_vl = types.SimpleNamespace(language_model=types.SimpleNamespace(model=stack))
    gemma4_mm = types.SimpleNamespace(model=types.SimpleNamespace(), language_model=stack)
    for target in (text, lfm2_vl, gemma4_mm):
        assert decoder_stack(target) is stack
    with pytest.raises(AttributeError, match="no decoder stack"):
        decoder_stack(types.SimpleNamespace(model=types.SimpleNamespace(layers=[])))


def test_tiny_vl_target_decodes_text_as_the_dense_target():
    """Text positions are equal on M-RoPE's three axes, so the VL target's
    language model is the dense tiny target on a prompt without images (what
    lets the dense target's drafter draft for it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3VLForConditionalGeneration

    paths = tiny_paths()
    dense = AutoModelForCausalLM.from_pretrained(paths["target"], dtype=torch.float32)
    vl = Qwen3VLForConditionalGeneration.from_pretrained(paths["vl-target"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(paths["vl-target"])
    ids = tok("<|im_start|>user\nTom has 3 apples and buys 5 more.<|im_end|>\n<|im_start|>assistant\n",
              return_tensors="pt").input_ids
    want = dense.generate(ids, max_new_tokens=24, do_sample=False)
    got = vl.generate(input_ids=ids, max_new_tokens=24, do_sample=False)
    assert got.tolist() == want.tolist()
