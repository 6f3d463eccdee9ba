"""Build the tiny sliding-window test pair: a Laguna target and a drafter trained on it.

    python -m sglang_dflash.tools.tiny_swa --out python/sglang_dflash/assets/tiny

writes, next to the dense tiny models (`tiny_models.py`, whose tokenizer it reuses):

* `swa-target/`: a random HF `LagunaForCausalLM` of the dense tiny target's
  sizes (H 64, 4 layers, FFN 128, vocab 1024), layers 0 and 2 sliding-window
  attention over the last `WINDOW` tokens, 1 and 3 full attention, each with
  Laguna's per-head softplus output gate, every FFN dense, with the dense
  target's embedding and head scales. SGLang serves Laguna as a hybrid
  sliding-window model: the sliding layers' K/V live in a second, smaller pool
  whose slots are the full pool's translated, and a decoding request's slots
  that fell out of the window are freed as it goes, so the pair exercises the
  worker against that pool. The window is a few tokens, so every prompt
  outgrows it.
* `swa-drafter-trained/`: DFlash v1, 2 layers, block 8, taps [0, 2], trained on
  the target's own greedy continuations as `drafter-trained/` is; its measured
  acceptance goes to `SWA.md`.
* `swa-drafter-laguna/`: the same, as SGLang's Laguna drafter architecture
  (`DFlashLagunaForCausalLM`: a per-head softplus gate on each attention
  output, a norm per target layer's features, the layers' input norms on the
  context), so the test serves that layout end to end.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..checkpoint import save_drafter
from . import tiny_models as tiny

WINDOW = 8  # HF's sliding_window: a query sees itself and the 7 tokens before it
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def build_swa_target(tokenizer, seed: int):
    from transformers import LagunaConfig, LagunaForCausalLM

    eos, pad = tiny.special_ids(tokenizer)
    layers = tiny.TARGET_DIMS["num_hidden_layers"]
    config = LagunaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
        pad_token_id=pad, sliding_window=WINDOW, layer_types=LAYER_TYPES, gating="per-head",
        mlp_layer_types=["dense"] * layers, **tiny.TARGET_DIMS)
    return tiny.random_target(LagunaForCausalLM, config, seed)


def write_swa_md(path: Path, info: dict, laguna_info: dict, args, seconds: float) -> None:
    path.write_text(f"""# Tiny sliding-window test pair

Built by `sglang_dflash.tools.tiny_swa` (float32, seed {args.seed}; see its
docstring), with the tokenizer of `target/`:

* `swa-target/`: random HF LagunaForCausalLM: H 64, 4 layers (0 and 2 sliding
  window of {WINDOW} tokens, 1 and 3 full attention, per-head softplus output gate),
  dense FFN 128, vocab 1024, untied head; embeddings std {tiny.EMBED_STD}, head std
  {tiny.HEAD_STD}.
""" + tiny.trained_drafter_md("swa", info, args, seconds) + f"""\
* `swa-drafter-laguna/`: `swa-drafter-trained/`'s recipe as SGLang's
  `DFlashLagunaForCausalLM` (per-head gates, context norms); held-out greedy
  acceptance {laguna_info['report'].mean_acceptance_length:.3f}. (The build time
  above covers both drafters.)
""")


def main(argv=None) -> None:
    args = tiny.build_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    log = tiny.deterministic_build("tiny_swa")
    start = time.time()
    target, tokenizer, corpus, info = tiny.target_and_trained_drafter(args, log, "swa", build_swa_target)
    laguna, laguna_dict, laguna_info = tiny.train_tiny_drafter(
        target, tokenizer, corpus, args, log, architecture="DFlashLagunaForCausalLM",
        top={"gating": "per-head"})
    save_drafter(laguna, laguna_dict, tiny._fresh_dir(args.out / "swa-drafter-laguna"))
    write_swa_md(args.out / "SWA.md", info, laguna_info, args, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
