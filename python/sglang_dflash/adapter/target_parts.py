"""Where a target model keeps its decoder stack.

The worker reads the target's token embedding (the drafter embeds its block
with it) and the start-up profile times its decoder layers. A text model keeps
both in `model` (`model.embed_tokens`, `model.layers`); a multimodal wrapper
keeps them in its language model (LFM2-VL: `language_model.model`; Gemma 4's
wrapper: `language_model` itself), and Qwen3-VL in `model` again.
"""

from __future__ import annotations


def decoder_stack(target):
    """The module holding the target's `embed_tokens` and `layers`."""
    for module in (target, getattr(target, "model", None)):
        if module is not None and hasattr(module, "embed_tokens") and hasattr(module, "layers"):
            return module
    language_model = getattr(target, "language_model", None)
    if language_model is not None:
        return decoder_stack(language_model)
    raise AttributeError(f"{type(target).__name__}: no decoder stack (embed_tokens and layers) in the "
                         "model, its `model` or its `language_model`")
