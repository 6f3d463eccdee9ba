"""LoRA adapters under DFLASH on the real engine, against the same engine with
the same adapters and no speculation.

The adapters apply to the target only: it verifies with the adapted weights,
so every committed token is the adapted target's, while the drafter reads the
target's plain embedding and head (an adapter on those is a SGLang LoRA wrapper
the drafter must not call with the verify's LoRA batch layout). Greedy output
must be token-identical to plain LoRA serving, in one batch mixing requests
without an adapter, with an attention / MLP adapter and with one that also
adapts the embedding, and for an adapter loaded while the server runs; at the full block, at a narrower eager width, and with
speculation off (W = 0 through the target's DECODE path, whose LoRA segments
are one token per request). Sampling needs no separate test here: an adapter
changes only the target's logits p, and the accept rule is exact for any p
(test_sampling.py). No adapter here targets `lm_head`: on SGLang's CPU LoRA
backend (torch_native) such an adapter leaves plain output unchanged in most
runs and changes the whole batch in some, so plain serving is no oracle for it.
"""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from harness import PATHS, Job, chat_prompts, dflash_args, output_ids, run_engines

RANK = 8


def make_adapter(path: str, seed: int, with_embedding: bool = False) -> str:
    """A random LoRA adapter for the tiny target, in PEFT's layout."""
    cfg = json.load(open(os.path.join(PATHS["target"], "config.json")))
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q_out = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_out = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out),
              "o_proj": (q_out, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
              "down_proj": (inter, hidden)}
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):  # large enough that the adapted model's greedy tokens change
        return torch.randn(*shape, generator=g) * 0.3

    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, (fan_in, fan_out) in shapes.items():
            block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{name}"
            tensors[prefix + ".lora_A.weight"] = rand(RANK, fan_in)
            tensors[prefix + ".lora_B.weight"] = rand(fan_out, RANK)
    modules = list(shapes)
    if with_embedding:
        tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = rand(RANK, vocab)
        tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = rand(hidden, RANK)
        modules.append("embed_tokens")
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 2 * RANK,
               "lora_dropout": 0.0, "bias": "none", "target_modules": modules,
               "base_model_name_or_path": PATHS["target"]},
              open(os.path.join(path, "adapter_config.json"), "w"))
    return path


POLICIES = ('{"mode": "on"}', '{"mode": "fixed", "fixed_width": 2}', '{"mode": "off"}')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Plain LoRA serving's runs, DFLASH's under each policy and at --tp-size 2,
    the engines started together."""
    root = tmp_path_factory.mktemp("lora")
    adapters = {"layers": make_adapter(str(root / "layers"), 0),
                "embedding": make_adapter(str(root / "embedding"), 1, with_embedding=True)}
    late = make_adapter(str(root / "late"), 2)
    engine = dict(enable_lora=True, lora_paths=adapters, max_lora_rank=RANK, max_loras_per_batch=4)
    prompts = chat_prompts(4)
    greedy = {"max_new_tokens": 24, "temperature": 0.0}
    mixed = [None, "layers", "embedding"]
    runs = [
        {"name": "mixed", "prompts": [p for p in prompts for _ in mixed], "batch_size": 12,
         "lora_path": mixed * len(prompts), "sampling_params": greedy},
        {"name": "late", "prompts": prompts, "batch_size": 4, "load_lora": {"late": late},
         "lora_path": ["late", None, "late", "layers"], "sampling_params": greedy},
    ]
    spec = {**engine, **dflash_args("drafter-trained")}
    jobs = {"plain": Job(engine, runs), "tp2": Job({**spec, "tp_size": 2}, runs[:1])}
    for policy in POLICIES:
        jobs[policy] = Job(spec, runs, True, {"SGLANG_DFLASH_POLICY": policy})
    return dict(zip(jobs, run_engines(list(jobs.values()))))


def test_adapters_change_the_plain_output(setup):
    """Else identity with plain would not show that the adapters are applied."""
    out = output_ids(setup["plain"]["mixed"])
    for prompt in range(4):
        base, layers, embedding = out[3 * prompt: 3 * prompt + 3]
        assert base != layers and base != embedding and layers != embedding, prompt


@pytest.mark.parametrize("policy, width", zip(POLICIES, (7, 2, 0)), ids=["full-block", "width-2", "off"])
def test_lora_greedy_identical_to_plain_lora(setup, policy, width):
    spec, state = setup[policy]
    for name in ("mixed", "late"):
        want, got = output_ids(setup["plain"][name]), output_ids(spec[name])
        for i, (w, g) in enumerate(zip(want, got)):
            assert g == w, f"{name} request {i}: {g} != plain {w}"
    by_width = state["steps_by_width"]
    assert by_width[width] == state["steps"] > 0, by_width
    if width:
        accepted = [r["meta_info"]["spec_accept_length"] for r in spec["mixed"]["results"][0::3]]
        assert max(accepted) > 1.0, accepted  # requests without an adapter accept drafts


def test_lora_under_tp2_identical_to_plain_lora(setup):
    """--tp-size 2: the adapters' weights sharded with the target's, the drafter's
    embedding and vocabulary-parallel head unwrapped per rank. The oracle is plain
    LoRA serving on one rank (test_tensor_parallel.py shows plain --tp 2 equals it
    on this target)."""
    spec = setup["tp2"]
    want, got = output_ids(setup["plain"]["mixed"]), output_ids(spec["mixed"])
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, f"request {i}: {g} != plain {w}"
