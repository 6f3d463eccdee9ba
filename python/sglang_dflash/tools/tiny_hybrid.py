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
(qwen3_next: fused input projections, its own weight layout).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

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
}


def build_hybrid_target(tokenizer, seed: int, kind: str = "dense"):
    import transformers

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
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["full_attention_interval"] = FULL_ATTENTION_INTERVAL
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_hybrid_md(path: Path, info: dict, args, seconds: float) -> None:
    name, prefix, _, ffn = KINDS[args.kind]
    cls = f"{prefix}ForCausalLM ({info['model_type']})"
    flag = "" if args.kind == "dense" else f" --kind {args.kind}"
    path.write_text(f"""# Tiny {name} test pair

Built by `sglang_dflash.tools.tiny_hybrid{flag}` (float32, seed {args.seed};
see its docstring), with the tokenizer of `target/`:

* `{name}-target/`: random HF {cls}: H 64, 4 layers
  (0 and 2 Gated DeltaNet, 1 and 3 gated full attention), {ffn}, vocab 1024,
  untied head; embeddings std {tiny.EMBED_STD}, head std {tiny.HEAD_STD}.
""" + tiny.trained_drafter_md(name, info, args, seconds))


def main(argv=None) -> None:
    from transformers import AutoTokenizer

    parser = tiny.build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=list(KINDS), default="dense",
                        help="Qwen3.5 (dense FFN), Qwen3.5 MoE or Qwen3-Next (MoE)")
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
