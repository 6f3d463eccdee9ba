"""Build the tiny hybrid test pairs: a Gated DeltaNet target and a drafter trained on it.

    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind moe
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind next

writes, next to the dense tiny models (`tiny_models.py`, whose tokenizer it reuses):

* `hybrid-target/`: a random HF `Qwen3_5ForCausalLM` (model_type qwen3_5_text) of
  the dense tiny target's sizes (H 64, 4 layers, FFN 128, vocab 1024), layers
  0 and 2 Gated DeltaNet (2 key / 4 value heads of 16, conv width 4), layers 1
  and 3 gated full attention (4 / 2 heads of 16), with the dense target's
  embedding and head scales (a bigram-like chain a small drafter learns).
  Its config.json carries `full_attention_interval` (SGLang places the
  full-attention layers by it; transformers writes only `layer_types`).
* `hybrid-drafter-trained/`: DFlash v1, 2 layers, block 8, taps [0, 2], trained on
  the target's own greedy continuations as `drafter-trained/` is; its measured
  acceptance goes to `HYBRID.md`.

With `--kind moe`, `hybrid-moe-target/` and `hybrid-moe-drafter-trained/` instead
(report `HYBRID_MOE.md`): the same layout as a `Qwen3_5MoeForCausalLM`
(qwen3_5_moe_text), each layer's FFN a sparse block of 4 experts of 64 (top 2,
renormalized) plus a sigmoid-gated shared expert of 64. With `--kind next`,
`hybrid-next-*` (`HYBRID_NEXT.md`): that MoE layout as a `Qwen3NextForCausalLM`
(qwen3_next: fused input projections, its own weight layout). With `--kind lfm2`,
`lfm2-*` (`LFM2.md`): a short-convolution hybrid, a random HF `Lfm2ForCausalLM`
(model_type lfm2) of the same sizes, layers 0 and 2 gated short convolutions
(window 3), 1 and 3 full attention, FFN 128.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..checkpoint import save_drafter
from . import tiny_models as tiny

LINEAR_DIMS = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, linear_conv_kernel_dim=4)
FULL_ATTENTION_INTERVAL = 2  # layers 1 and 3 (SGLang: full where (i + 1) % interval == 0)
MOE_DIMS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                shared_expert_intermediate_size=64, norm_topk_prob=True)
MOE_FFN = "FFN 4 experts of 64 (top 2) + a gated shared expert of 64"  # MOE_DIMS as the report says it
# kind -> (asset name, transformers class prefix, FFN, the FFN as the report says it)
KINDS = {
    "dense": ("hybrid", "Qwen3_5", {}, "FFN 128"),
    "moe": ("hybrid-moe", "Qwen3_5Moe", MOE_DIMS, MOE_FFN),
    "next": ("hybrid-next", "Qwen3Next", MOE_DIMS, MOE_FFN),
    "lfm2": ("lfm2", "Lfm2", {}, "FFN 128"),
}
CONV_WINDOW = 3  # LFM2's conv_L_cache: the conv looks at the token and the two before
# Weight scales of the conv layers. At the default init (std 0.02) their output
# (three products of small weights) is too small to change a greedy token, so a
# wrong conv window would go unseen. At these, dropping the window (the two
# inputs before the token) changes about one greedy choice in ten: a wrong
# window shows within a few dozen tokens, and the chains stay bigram-like
# enough for a small drafter to learn (at ten in ten it learns nothing).
CONV_STDS = {"in_proj": 0.05, "conv": 0.3, "out_proj": 0.02}


def build_short_conv_target(tokenizer, seed: int):
    """The LFM2 layout: conv where the GDN pairs have linear attention."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    eos, pad = tiny.special_ids(tokenizer)
    dims = tiny.TARGET_DIMS
    kinds = ["full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "conv"
             for i in range(dims["num_hidden_layers"])]
    config = Lfm2Config(
        vocab_size=len(tokenizer), hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"], block_auto_adjust_ff_dim=False,
        num_hidden_layers=dims["num_hidden_layers"], num_attention_heads=dims["num_attention_heads"],
        num_key_value_heads=dims["num_key_value_heads"],
        max_position_embeddings=dims["max_position_embeddings"], norm_eps=dims["rms_norm_eps"],
        conv_L_cache=CONV_WINDOW, conv_bias=False, layer_types=kinds,
        full_attn_idxs=[i for i, k in enumerate(kinds) if k == "full_attention"],
        rope_theta=tiny.ROPE_THETA, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=eos, pad_token_id=pad)
    model = tiny.random_target(Lfm2ForCausalLM, config, seed)
    with torch.no_grad():
        for i, kind in enumerate(kinds):
            if kind == "conv":
                for name, std in CONV_STDS.items():
                    getattr(model.model.layers[i].conv, name).weight.normal_(0.0, std)
    return model


def build_hybrid_target(tokenizer, seed: int, kind: str = "dense"):
    import transformers

    if kind == "lfm2":
        return build_short_conv_target(tokenizer, seed)

    eos, pad = tiny.special_ids(tokenizer)
    layers = tiny.TARGET_DIMS["num_hidden_layers"]
    kinds = ["full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
             for i in range(layers)]
    _, prefix, ffn, _ = KINDS[kind]
    dims = {**tiny.TARGET_DIMS, **LINEAR_DIMS, **ffn}
    if ffn:  # a sparse block replaces the dense FFN in every layer
        del dims["intermediate_size"]
    config_class = "Qwen3NextConfig" if kind == "next" else f"{prefix}TextConfig"
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
        pad_token_id=pad, layer_types=kinds, **dims)
    return tiny.random_target(getattr(transformers, f"{prefix}ForCausalLM"), config, seed)


def save_hybrid_target(model, tokenizer, out: Path) -> None:
    tiny.save_target(model, tokenizer, out)
    if model.config.model_type == "lfm2":  # SGLang places its layers by layer_types
        return
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["full_attention_interval"] = FULL_ATTENTION_INTERVAL
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_hybrid_md(path: Path, info: dict, args, seconds: float) -> None:
    name, prefix, _, ffn = KINDS[args.kind]
    cls = f"{prefix}ForCausalLM ({info['model_type']})"
    flag = "" if args.kind == "dense" else f" --kind {args.kind}"
    linear, attention = ((f"gated short convolutions (window {CONV_WINDOW})", "full attention")
                         if args.kind == "lfm2" else ("Gated DeltaNet", "gated full attention"))
    scales = ("; conv layers' weights std " + ", ".join(f"{k} {v}" for k, v in CONV_STDS.items())
              if args.kind == "lfm2" else "")
    path.write_text(f"""# Tiny {name} test pair

Built by `sglang_dflash.tools.tiny_hybrid{flag}` (float32, seed {args.seed};
see its docstring), with the tokenizer of `target/`:

* `{name}-target/`: random HF {cls}: H 64, 4 layers
  (0 and 2 {linear}, 1 and 3 {attention}), {ffn}, vocab 1024,
  untied head; embeddings std {tiny.EMBED_STD}, head std {tiny.HEAD_STD}{scales}.
""" + tiny.trained_drafter_md(name, info, args, seconds))


def main(argv=None) -> None:
    from transformers import AutoTokenizer

    parser = tiny.build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=list(KINDS), default="dense",
                        help="Qwen3.5 (dense FFN), Qwen3.5 MoE, Qwen3-Next (MoE) or LFM2 (short conv)")
    args = parser.parse_args(argv)
    log = tiny.deterministic_build("tiny_hybrid")
    start = time.time()
    name = KINDS[args.kind][0]
    tokenizer = AutoTokenizer.from_pretrained(args.out / "target")
    target = build_hybrid_target(tokenizer, args.seed, args.kind)
    save_hybrid_target(target, tokenizer, tiny._fresh_dir(args.out / f"{name}-target"))
    corpus = tiny.load_corpus(args.data_dir)
    drafter, cfg_dict, info = tiny.train_tiny_drafter(target, tokenizer, corpus, args, log)
    info["model_type"] = target.config.model_type
    save_drafter(drafter, cfg_dict, tiny._fresh_dir(args.out / f"{name}-drafter-trained"))
    write_hybrid_md(args.out / f"{name.upper().replace('-', '_')}.md", info, args, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
