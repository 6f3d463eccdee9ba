"""adapter/input_embeds.py: a request's embeddings reach the target in its dtype."""

from types import SimpleNamespace

import torch

from sglang_dflash.adapter.input_embeds import embeds_in_model_dtype


def _batch(embeds, replace_embeds=None, replace_positions=None):
    return SimpleNamespace(input_embeds=embeds, replace_embeds=replace_embeds,
                           replace_positions=replace_positions)


def test_float32_target_gets_the_requests_values():
    embeds = torch.randn(5, 8)
    batch = _batch(embeds)
    kwargs = {"input_embeds": embeds.bfloat16(), "pp": 1}  # what SGLang builds
    out = embeds_in_model_dtype(kwargs, SimpleNamespace(dtype=torch.float32), batch)
    assert out["input_embeds"].dtype == torch.float32 and out["pp"] == 1
    assert torch.equal(out["input_embeds"], embeds)  # not the bfloat16 rounding


def test_overrides_are_scattered_again():
    embeds, override = torch.randn(5, 8), torch.randn(2, 8)
    before = embeds.clone()
    positions = torch.tensor([1, 3])
    for dtype in (torch.float16, torch.float32):
        kwargs = {"input_embeds": embeds.bfloat16()}
        out = embeds_in_model_dtype(kwargs, SimpleNamespace(dtype=dtype), _batch(embeds, override, positions))
        want = embeds.to(dtype, copy=True)
        want[positions] = override.to(dtype)
        assert out["input_embeds"].dtype == dtype and torch.equal(out["input_embeds"], want)
        assert torch.equal(embeds, before)  # the batch's own tensor is not written


def test_bfloat16_target_and_id_prompts_untouched():
    embeds = torch.randn(3, 4)
    sglang = embeds.bfloat16()
    out = embeds_in_model_dtype({"input_embeds": sglang}, SimpleNamespace(dtype=torch.bfloat16), _batch(embeds))
    assert out["input_embeds"] is sglang
    kwargs = {"pp": 1}
    assert embeds_in_model_dtype(kwargs, SimpleNamespace(dtype=torch.float32), _batch(None)) == {"pp": 1}
