"""Build the tiny Llama test pair: a Llama-3.1-layout target and a drafter trained on it.

    python -m sglang_dflash.tools.tiny_llama --out python/sglang_dflash/assets/tiny

writes, next to the dense tiny models (`tiny_models.py`, whose tokenizer and
dimensions it reuses):

* `llama-target/`: a random HF `LlamaForCausalLM` (the class of the published
  LLaMA-3.1-8B-Instruct DFlash target): no q/k norms, grouped-query attention,
  and Llama 3.1's frequency-dependent RoPE scaling (`rope_type` llama3) with an
  original context shorter than the prompts plus outputs; the dense target's
  embedding and head scales, and its attention's query, key and output weights
  redrawn at `ATTENTION_STDS`.
* `llama-drafter-trained/`: DFlash v1, 2 layers, block 8, taps [0, 2], trained
  on the target's own greedy continuations as `drafter-trained/` is; its
  measured acceptance goes to `LLAMA.md`.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import tiny_models as tiny

# Llama 3.1's published scaling (factor 8, bands 1 / 4) on a short original
# context: frequencies of wavelength above 64 positions are scaled, below 16
# kept, in between blended, so each branch applies to some of the 8
# frequencies of a 16-dim head.
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": tiny.ROPE_THETA}
# At the default init (std 0.02) attention barely steers the bigram-like
# chains: greedy outputs were the same with and without the scaling, so a
# server ignoring it would pass. At these most test prompts' outputs change.
ATTENTION_STDS = {"q_proj": 0.07, "k_proj": 0.07, "o_proj": 0.04}


def build_llama_target(tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    eos, pad = tiny.special_ids(tokenizer)
    config = LlamaConfig(vocab_size=len(tokenizer), rope_scaling=ROPE, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=eos, pad_token_id=pad, **tiny.TARGET_DIMS)
    model = tiny.random_target(LlamaForCausalLM, config, seed)
    layers = config.num_hidden_layers
    return tiny.redrawn(model, ["attention"] * layers, "attention", "self_attn", ATTENTION_STDS)


def write_llama_md(path: Path, info: dict, args, seconds: float) -> None:
    path.write_text(f"""# Tiny Llama test pair

Built by `sglang_dflash.tools.tiny_llama` (float32, seed {args.seed}; see its
docstring), with the tokenizer of `target/`:

* `llama-target/`: random HF LlamaForCausalLM (llama): the dense target's dimensions
  (H 64, 4 layers, 4 / 2 heads, head_dim 16, FFN 128, vocab 1024, untied head), no
  q/k norms, RoPE scaling llama3 (factor {ROPE['factor']}, low / high frequency factors
  {ROPE['low_freq_factor']} / {ROPE['high_freq_factor']}, original context {ROPE['original_max_position_embeddings']});
  embeddings std {tiny.EMBED_STD}, head std {tiny.HEAD_STD}; attention weights std
  {', '.join(f'{k} {v}' for k, v in ATTENTION_STDS.items())}.
""" + tiny.trained_drafter_md("llama", info, args, seconds))


def main(argv=None) -> None:
    args = tiny.build_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    log = tiny.deterministic_build("tiny_llama")
    start = time.time()
    _, _, _, info = tiny.target_and_trained_drafter(args, log, "llama", build_llama_target)
    write_llama_md(args.out / "LLAMA.md", info, args, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
