"""Build the tiny hybrid test pairs: a Gated DeltaNet target and a drafter trained on it.

    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind moe
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind next
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind lfm2
    python -m sglang_dflash.tools.tiny_hybrid --out python/sglang_dflash/assets/tiny --kind nemotron_h

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
(window 3), 1 and 3 full attention, FFN 128. With `--kind nemotron_h`,
`nemotron-h-*` (`NEMOTRON_H.md`): a Mamba2 hybrid, a random HF
`NemotronHForCausalLM` of H 64 with SGLang's layer pattern "M*M-" (Mamba2 of
4 heads of 16, 2 groups, state 16, conv width 4; attention of 4 / 2 heads of
16; a ReLU^2 MLP of 128).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

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
    "nemotron_h": ("nemotron-h", "NemotronH", {}, "ReLU^2 MLP 128 (layer 3)"),
}
CONV_WINDOW = 3  # LFM2's conv_L_cache: the conv looks at the token and the two before
# Weight scales of the conv layers. At the default init (std 0.02) their output
# (three products of small weights) is too small to change a greedy token, so a
# wrong conv window would go unseen. At these, dropping the window (the two
# inputs before the token) changes about one greedy choice in ten: a wrong
# window shows within a few dozen tokens, and the chains stay bigram-like
# enough for a small drafter to learn (at ten in ten it learns nothing).
CONV_STDS = {"in_proj": 0.05, "conv": 0.3, "out_proj": 0.02}
# Nemotron-H: mamba, attention, mamba, MLP. SGLang reads the legacy layer names
# (transformers writes linear_attention / full_attention, which SGLang's config
# rejects) and the mixer's groups from mamba_n_groups (default 8; the state
# pool reads n_groups), so both go into config.json.
NEMOTRON_LAYERS = ["mamba", "attention", "mamba", "mlp"]
MAMBA2_DIMS = dict(mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, expand=1,
                   chunk_size=16, use_conv_bias=True, mamba_proj_bias=False)
# As CONV_STDS, for the mixer: at the default init its output changes no greedy
# token (and a drafter learns the chains no better than from the embeddings).
MAMBA2_STDS = {"in_proj": 0.05, "conv1d": 0.3, "out_proj": 0.005}


def build_mamba2_target(tokenizer, seed: int):
    """The Nemotron-H layout (layers by NEMOTRON_LAYERS)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    eos, pad = tiny.special_ids(tokenizer)
    dims = tiny.TARGET_DIMS
    hf_names = {"mamba": "linear_attention", "attention": "full_attention", "mlp": "mlp"}
    config = NemotronHConfig(
        vocab_size=len(tokenizer), hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
        layers_block_type=[hf_names[k] for k in NEMOTRON_LAYERS], num_hidden_layers=len(NEMOTRON_LAYERS),
        num_attention_heads=dims["num_attention_heads"], num_key_value_heads=dims["num_key_value_heads"],
        head_dim=dims["head_dim"], mlp_hidden_act="relu2", max_position_embeddings=dims["max_position_embeddings"],
        layer_norm_epsilon=dims["rms_norm_eps"], tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=eos, pad_token_id=pad, **MAMBA2_DIMS)
    model = tiny.random_target(NemotronHForCausalLM, config, seed)
    return tiny.redrawn(model, NEMOTRON_LAYERS, "mamba", "mixer", MAMBA2_STDS)


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
    return tiny.redrawn(tiny.random_target(Lfm2ForCausalLM, config, seed), kinds, "conv", "conv", CONV_STDS)


def build_hybrid_target(tokenizer, seed: int, kind: str = "dense"):
    import transformers

    if kind == "lfm2":
        return build_short_conv_target(tokenizer, seed)
    if kind == "nemotron_h":
        return build_mamba2_target(tokenizer, seed)

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
    if model.config.model_type == "nemotron_h":
        config.update(layers_block_type=NEMOTRON_LAYERS, mamba_n_groups=MAMBA2_DIMS["n_groups"])
    else:
        config["full_attention_interval"] = FULL_ATTENTION_INTERVAL
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_hybrid_md(path: Path, info: dict, args, seconds: float) -> None:
    name, prefix, _, ffn = KINDS[args.kind]
    cls = f"{prefix}ForCausalLM ({info['model_type']})"
    flag = "" if args.kind == "dense" else f" --kind {args.kind}"
    layers = {"lfm2": f"0 and 2 gated short convolutions (window {CONV_WINDOW}), 1 and 3 full attention",
              "nemotron_h": "0 and 2 Mamba2, 1 attention, 3 an MLP"}.get(
                  args.kind, "0 and 2 Gated DeltaNet, 1 and 3 gated full attention")
    stds = {"lfm2": ("conv layers'", CONV_STDS), "nemotron_h": ("Mamba2 mixers'", MAMBA2_STDS)}.get(args.kind)
    scales = f"; {stds[0]} weights std " + ", ".join(f"{k} {v}" for k, v in stds[1].items()) if stds else ""
    path.write_text(f"""# Tiny {name} test pair

Built by `sglang_dflash.tools.tiny_hybrid{flag}` (float32, seed {args.seed};
see its docstring), with the tokenizer of `target/`:

* `{name}-target/`: random HF {cls}: H 64, 4 layers
  ({layers}), {ffn}, vocab 1024,
  untied head; embeddings std {tiny.EMBED_STD}, head std {tiny.HEAD_STD}{scales}.
""" + tiny.trained_drafter_md(name, info, args, seconds))


def main(argv=None) -> None:
    parser = tiny.build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=list(KINDS), default="dense",
                        help="Qwen3.5 (dense FFN), Qwen3.5 MoE, Qwen3-Next (MoE), LFM2 (short conv) "
                             "or Nemotron-H (Mamba2)")
    args = parser.parse_args(argv)
    log = tiny.deterministic_build("tiny_hybrid")
    start = time.time()
    name = KINDS[args.kind][0]
    target, _, _, info = tiny.target_and_trained_drafter(
        args, log, name, lambda tok, seed: build_hybrid_target(tok, seed, args.kind), save_hybrid_target)
    info["model_type"] = target.config.model_type
    write_hybrid_md(args.out / f"{name.upper().replace('-', '_')}.md", info, args, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
