"""Build the tiny multi-head latent attention test pair: a DeepSeek-V3 target and a drafter trained on it.

    python -m sglang_dflash.tools.tiny_mla --out python/sglang_dflash/assets/tiny

writes, next to the dense tiny models (`tiny_models.py`, whose tokenizer it reuses):

* `mla-target/`: a random HF `DeepseekV3ForCausalLM` of H 64 and 4 layers with
  DeepSeek's multi-head latent attention (4 heads; queries through a rank-32
  LoRA, keys and values through a compressed latent of rank 32 plus a shared
  16-dim rotary key, so SGLang caches one 48-wide latent row per token), layer 0
  a dense FFN of 128, layers 1-3 a sparse block of 4 experts of 64 (sigmoid
  scores, top 2 renormalized, routed_scaling_factor 2.5) plus a shared expert
  of 64, with the dense target's embedding and head scales and its attention
  weights redrawn at `ATTENTION_STDS`. SGLang serves DeepSeek-V3-layout
  targets through this model class (Kimi-K2.5 as its language model).
* `mla-drafter-trained/`: DFlash v1, 2 layers, block 8, taps [0, 2], trained on
  the target's own greedy continuations as `drafter-trained/` is; its measured
  acceptance goes to `MLA.md`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import tiny_models as tiny

MLA_DIMS = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
MOE_DIMS = dict(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                moe_intermediate_size=64, n_group=1, topk_group=1, norm_topk_prob=True,
                routed_scaling_factor=2.5)
# Attention weights redrawn: at the default init (std 0.02) the prompt's tokens
# barely steer the bigram-like chains, so a prefill attending wrongly (a
# dropped causal mask, zeros) changed few greedy tokens; at these it changes
# most prompts' continuations.
ATTENTION_STDS = {"o_proj": 0.08, "kv_b_proj": 0.08}
# SGLang's CPU rotary factory takes DeepSeek's rope only with a scaling dict
# (a yarn of factor 1 is the plain rope); transformers 5 writes it as
# rope_parameters, SGLang reads rope_scaling.
ROPE = {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": tiny.ROPE_THETA}
# Keys SGLang's DeepSeek model reads that transformers' config no longer writes
# (the published DeepSeek-V3 config.json carries them; these are its values).
SGLANG_KEYS = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
               "rope_scaling": ROPE, "rope_theta": tiny.ROPE_THETA}


def build_mla_target(tokenizer, seed: int):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    eos, pad = tiny.special_ids(tokenizer)
    dims = tiny.TARGET_DIMS
    config = DeepseekV3Config(
        vocab_size=len(tokenizer), hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"], max_position_embeddings=dims["max_position_embeddings"],
        rms_norm_eps=dims["rms_norm_eps"], rope_scaling=ROPE, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=eos, pad_token_id=pad, **MLA_DIMS, **MOE_DIMS)
    model = tiny.random_target(DeepseekV3ForCausalLM, config, seed)
    layers = config.num_hidden_layers
    return tiny.redrawn(model, ["attention"] * layers, "attention", "self_attn", ATTENTION_STDS)


def save_mla_target(model, tokenizer, out: Path) -> None:
    tiny.save_target(model, tokenizer, out)
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.update(SGLANG_KEYS)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_mla_md(path: Path, info: dict, args, seconds: float) -> None:
    path.write_text(f"""# Tiny MLA test pair

Built by `sglang_dflash.tools.tiny_mla` (float32, seed {args.seed}; see its
docstring), with the tokenizer of `target/`:

* `mla-target/`: random HF DeepseekV3ForCausalLM (deepseek_v3): H 64, 4 layers of
  multi-head latent attention (4 heads, q LoRA rank {MLA_DIMS['q_lora_rank']}, KV latent rank
  {MLA_DIMS['kv_lora_rank']}, rotary key {MLA_DIMS['qk_rope_head_dim']}), layer 0 dense FFN 128, layers 1-3
  4 experts of 64 (top 2) + a shared expert of 64, routed scaling
  {MOE_DIMS['routed_scaling_factor']}, vocab 1024, untied head; embeddings std {tiny.EMBED_STD}, head std
  {tiny.HEAD_STD}; attention weights std {', '.join(f'{k} {v}' for k, v in ATTENTION_STDS.items())}.
""" + tiny.trained_drafter_md("mla", info, args, seconds))


def main(argv=None) -> None:
    args = tiny.build_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    log = tiny.deterministic_build("tiny_mla")
    start = time.time()
    _, _, _, info = tiny.target_and_trained_drafter(args, log, "mla", build_mla_target, save_mla_target)
    write_mla_md(args.out / "MLA.md", info, args, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
