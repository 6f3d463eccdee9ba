"""Build the tiny multimodal test pair: a Qwen3-VL target and a drafter for it.

    python -m sglang_dflash.tools.tiny_vl --out python/sglang_dflash/assets/tiny

writes, from the dense tiny pair (`tiny_models.py`) already in `--out`:

* `vl-target/`: an HF `Qwen3VLForConditionalGeneration` whose language model
  is the dense tiny target (`target/`) with four vision tokens appended to its
  vocabulary (`<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`,
  `<|video_pad|>`, rows drawn at HF's initialisation), interleaved M-RoPE over
  sections [2, 3, 3] of its 8 rotary frequencies, and a random 2-layer vision
  tower (width 32, patches of 16 pixels merged 2 x 2 into the text width, one
  deepstack tap). Text positions are equal on M-RoPE's three axes, so on a
  text-only prompt it decodes as `target/` does; an image's tokens carry 2-D
  positions and shift the positions of the text after them. The processor
  (Qwen2-VL image processor, 32^2 to 128^2 pixels per image, so a 64 x 64 image
  is 4 tokens) and a chat template that puts an image's tokens where the
  message's image part is are saved with it.
* `vl-drafter/`: `drafter-trained/`'s weights (it reads the target's embedding
  and head, so it has none of its own) with the target's vocabulary size in its
  config: trained on `target/`, it drafts text after an image as well as the
  target's changed context lets it.
* `VL.md`: what was built.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from . import tiny_models as tiny

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VOCAB_SIZE = 1032  # the tiny vocabulary, its four vision tokens, padded to a multiple of 8
MROPE_SECTION = [2, 3, 3]  # temporal / height / width rotary frequencies (head_dim 16: 8)
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
              deepstack_visual_indexes=[0])
MIN_PIXELS, MAX_PIXELS = 32 * 32, 128 * 128
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def vl_tokenizer(text_dir: Path):
    """The dense tiny tokenizer with the vision tokens added, and their ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer, tokenizer.convert_tokens_to_ids(VISION_TOKENS)


def build_vl_target(text_dir: Path, tokenizer, ids: list[int], seed: int):
    """Qwen3-VL whose language model carries the dense tiny target's weights."""
    from safetensors.torch import load_file
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = json.loads((text_dir / "config.json").read_text())
    eos, pad = tiny.special_ids(tokenizer)
    dims = {k: text[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "rms_norm_eps", "max_position_embeddings")}
    rope = {"rope_theta": text["rope_parameters"]["rope_theta"], "rope_type": "default",
            "mrope_section": MROPE_SECTION, "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=VOCAB_SIZE, rope_parameters=rope, eos_token_id=eos,
                         pad_token_id=pad, **dims),
        vision_config=dict(out_hidden_size=dims["hidden_size"], **VISION),
        vision_start_token_id=ids[0], vision_end_token_id=ids[1], image_token_id=ids[2],
        video_token_id=ids[3], tie_word_embeddings=False, eos_token_id=eos, pad_token_id=pad)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).float().eval()
    state = model.state_dict()
    for name, weight in load_file(text_dir / "model.safetensors").items():
        mine = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        if mine not in state:
            raise KeyError(f"{name} of {text_dir} has no place in Qwen3-VL ({mine})")
        state[mine][: weight.shape[0]].copy_(weight)  # vocabulary rows past the text's stay drawn
    model.load_state_dict(state)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos,
                                               pad_token_id=pad, do_sample=False)
    return model


def save_vl_target(model, tokenizer, out: Path) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    image = Qwen2VLImageProcessor(patch_size=VISION["patch_size"], merge_size=VISION["spatial_merge_size"],
                                  temporal_patch_size=VISION["temporal_patch_size"],
                                  min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor = Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer,
                                 video_processor=Qwen3VLVideoProcessor(), chat_template=CHAT_TEMPLATE)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)


def save_vl_drafter(text_drafter: Path, out: Path) -> None:
    config = json.loads((text_drafter / "config.json").read_text())
    config["vocab_size"] = VOCAB_SIZE
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(text_drafter / "model.safetensors", out / "model.safetensors")


def write_vl_md(path: Path, ids: list[int], seed: int) -> None:
    v = VISION
    path.write_text(f"""# Tiny multimodal test pair

Built by `sglang_dflash.tools.tiny_vl` (float32, seed {seed}; see its docstring)
from `target/` and `drafter-trained/`:

* `vl-target/`: HF Qwen3VLForConditionalGeneration.
  Language model: `target/`'s weights (H 64, 4 layers, FFN 128); vocabulary
  {VOCAB_SIZE}: `target/`'s 1024, the vision tokens at ids {ids}, padding;
  interleaved M-RoPE sections {MROPE_SECTION}. On text alone it decodes as `target/`.
  Vision tower: random, {v['depth']} layers of width {v['hidden_size']}, patches of
  {v['patch_size']} pixels merged {v['spatial_merge_size']} x {v['spatial_merge_size']}, deepstack tap
  {v['deepstack_visual_indexes']}; {MIN_PIXELS} to {MAX_PIXELS} pixels per image.
* `vl-drafter/`: `drafter-trained/` with the vocabulary size above (it reads
  the target's embedding and head).
""")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=tiny.DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    log = tiny.deterministic_build("tiny_vl")
    tokenizer, ids = vl_tokenizer(args.out / "target")
    model = build_vl_target(args.out / "target", tokenizer, ids, args.seed)
    save_vl_target(model, tokenizer, tiny._fresh_dir(args.out / "vl-target"))
    save_vl_drafter(args.out / "drafter-trained", tiny._fresh_dir(args.out / "vl-drafter"))
    write_vl_md(args.out / "VL.md", ids, args.seed)
    log(f"vision token ids {ids}; wrote vl-target/ and vl-drafter/ under {args.out}")


if __name__ == "__main__":
    main()
