"""A random-weight Qwen3ForCausalLM checkpoint in the HF layout, for benchmarks
that need a target of a given shape (a large vocabulary, a wide model) and not
a trained one. Imports torch and safetensors only."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Qwen3Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    max_pos: int
    rope_theta: float = 1000000.0
    eos: int = 2
    pad: int = 0


def write_random_qwen3(out: str, shape: Qwen3Shape, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                       device: str = "cpu", std: float = 0.02, embed_std: float | None = None,
                       head_std: float | None = None, tokenizer_from: str | None = None) -> int:
    """Write config.json, generation_config.json and model.safetensors (untied
    head, weights N(0, std), norms 1) to `out`; copy tokenizer.json and
    tokenizer_config.json from `tokenizer_from` (SGLang reads them at start-up
    even with --skip-tokenizer-init). Returns the parameter count."""
    from safetensors.torch import save_file

    s = shape
    h, hd, L = s.hidden, s.head_dim, s.layers
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*dims, scale=std):
        return (torch.randn(*dims, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    tensors = {"model.embed_tokens.weight": rnd(s.vocab, h, scale=embed_std or std),
               "model.norm.weight": ones(h), "lm_head.weight": rnd(s.vocab, h, scale=head_std or std)}
    for i in range(L):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": rnd(s.heads * hd, h),
            p + "self_attn.k_proj.weight": rnd(s.kv_heads * hd, h),
            p + "self_attn.v_proj.weight": rnd(s.kv_heads * hd, h),
            p + "self_attn.o_proj.weight": rnd(h, s.heads * hd),
            p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rnd(s.inter, h), p + "mlp.up_proj.weight": rnd(s.inter, h),
            p + "mlp.down_proj.weight": rnd(h, s.inter),
        })
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    params = sum(t.numel() for t in tensors.values())
    del tensors
    config = {  # transformers 5 layout
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": s.eos, "pad_token_id": s.pad,
        "dtype": str(dtype).removeprefix("torch."), "head_dim": hd, "hidden_act": "silu",
        "hidden_size": h, "initializer_range": std, "intermediate_size": s.inter,
        "layer_types": ["full_attention"] * L, "max_position_embeddings": s.max_pos,
        "max_window_layers": L, "num_attention_heads": s.heads, "num_hidden_layers": L,
        "num_key_value_heads": s.kv_heads, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
        "use_sliding_window": False, "vocab_size": s.vocab,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": s.eos, "pad_token_id": s.pad, "do_sample": False}, f)
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_from, name), os.path.join(out, name))
    return params
