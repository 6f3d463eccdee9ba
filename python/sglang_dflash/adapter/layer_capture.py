"""Qwen3-VL targets hand the drafter their layers.

SGLang 0.5.23's `Qwen3VLForConditionalGeneration.set_dflash_layers_to_capture`
(the Qwen3-VL dense and MoE targets) forwards the layer ids to its language
model's `set_dflash_layers_to_capture`, which that model class
(`Qwen3LLMModel`, a `Qwen3Model`) does not have: every DFLASH server with a
Qwen3-VL target fails at start-up with an AttributeError, before any request.
The language model captures its layers as Qwen3's does (a `layers_to_capture`
list, read in its forward), so the REPLACE hook sets that list: capture before
layer k + 1 for the target's layer k, the convention of SGLang's Qwen3 and
Gemma 4 multimodal classes. Everything else of the multimodal target (vision
tower, deepstack features, M-RoPE positions of verify blocks) is SGLang's.
"""

from __future__ import annotations

QWEN3_VL_CAPTURE_TARGET = (
    "sglang.srt.models.qwen3_vl.Qwen3VLForConditionalGeneration.set_dflash_layers_to_capture")


def capture_qwen3_vl_layers(model, layer_ids) -> None:
    """REPLACE: the language model records the hidden states after each of the
    target's layers `layer_ids` (0-based, HF numbering)."""
    if not model.pp_group.is_last_rank:
        return
    if layer_ids is None:
        raise ValueError("DFLASH requires explicit layer_ids for aux hidden capture.")
    model.capture_aux_hidden_states = True
    model.model.layers_to_capture = [int(i) + 1 for i in layer_ids]
