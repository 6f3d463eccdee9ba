"""Targets beyond the dense attention stack under DFLASH on the CPU engine:
hybrids of Gated DeltaNet (Qwen3.5, Qwen3.5 MoE, Qwen3-Next), short convolution
(LFM2) and Mamba2 (Nemotron-H), and multi-head latent attention (DeepSeek-V3).

The tiny hybrid pairs (`tools/tiny_hybrid.py`): layers 0 and 2 linear attention,
1 and 3 full attention, a dense FFN or a sparse MoE block with a gated shared
expert, and a drafter trained on each target, so verifies accept several drafts
and the worker commits the recurrent state at positions past the anchor.
Oracle: the same engine without speculation, which in turn equals
transformers' reference (the stand-in's GDN ops and our CPU shared-expert gate
serve plain decoding). Chunked prefill (chunks of 32) makes the prompts' states
continue across chunks. On the Qwen3.5 pair DFLASH runs always on (the whole
block) and adaptive (the default: the width changes between steps, W = 0, a
plain DECODE forward through our worker, included); on
the MoE and Qwen3-Next pairs (the latter SGLang's other
GDN model class, made to build and run on a CPU by our hooks) always on: the
other widths share their code with the Qwen3.5 pair's, which neither touches.
The LFM2 pair has gated short convolutions where the others have linear
attention (a conv window per request, no recurrent state), SGLang's other
state-pool layout; always on and adaptive. The Nemotron-H pair (mamba,
attention, mamba, MLP) runs its Mamba2 mixers through our CPU twins of
SGLang's Triton scan and state update; always on. The Qwen3.5, LFM2 and
Nemotron-H engines keep SGLang's hybrid radix cache (no_buffer) and serve each
prompt extended after the prompts themselves: those resume from the cached
states.

The DeepSeek-V3 pair (`tools/tiny_mla.py`; MLA in every layer, MoE in layers
1-3) keeps one compressed latent row per token in SGLang's MLA pool. SGLang
prefills a batch with no cached prefix through per-head K/V (its MHA path) and
everything else, extends of a cached prefix, decode steps and verify blocks,
through the latent (the absorbed path), as on a GPU with the triton backend;
always on and adaptive, with the ordinary radix cache. Its engines also
record each token's routed experts (--enable-return-routed-experts), which
requests get back equal to plain's: a verify block records every row, the
accepted ones stay.

The Llama pair (`tools/tiny_llama.py`; LlamaForCausalLM, the published
LLaMA-3.1 DFlash target's class, with Llama 3.1's RoPE scaling, which changes
most of these prompts' greedy outputs) runs always on with the ordinary radix
cache.
"""

import base64
import json
import os

import numpy as np
import pytest

from harness import Job, chat_prompts, not_transformers_greedy, output_ids, run_engines
from sglang_dflash.demo import tiny_paths

NUM_PROMPTS = 8
BATCH_SIZES = (1, 4)
GREEDY = {"max_new_tokens": 32, "temperature": 0.0}
PATHS = tiny_paths()
# The mamba state pool is otherwise sized from free host memory (gigabytes,
# a minute to allocate); a few slots per running request are plenty.
# float32 stated: SGLang's "auto" serves a float32 checkpoint in float16, and
# transformers' float32 reference is matched token for token only in float32.
ENGINE = {"max_mamba_cache_size": 64, "chunked_prefill_size": 32, "dtype": "float32"}
# On a CPU SGLang's default radix cache for hybrids (extra_buffer) needs state
# snapshots it has only on GPUs (start-up fails). Its no_buffer strategy keeps
# a request's state at the end of its prompt: a later prompt that extends it
# resumes from that state (an identical prompt is recomputed). The Qwen3.5,
# LFM2 and Nemotron-H targets run with it, the other hybrids without a radix cache.
RADIX = {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}
NO_RADIX = {"disable_radix_cache": True}
# Per target, engine settings over ENGINE (NO_RADIX unless given). An
# attention-only target (MLA) keeps SGLang's ordinary radix cache. MLA
# prefills through per-head K/V only a batch with no cached prefix: whole
# prompts in one chunk make that the first batch's every prompt; the later
# batches hit the chat template's cached prefix and extend through the latent.
TARGET_ENGINE = {"dense": RADIX, "lfm2": RADIX, "nemotron": RADIX,
                 "mla": {"chunked_prefill_size": 512, "enable_return_routed_experts": True}, "llama": {}}
# Targets whose requests ask for their routed experts (an MoE target on the
# overlap scheduler, where the records wait on the step's result).
EXPERT_TARGETS = ("mla",)
# Targets served with a radix cache: each also serves its prompts extended.
RADIX_TARGETS = ("dense", "lfm2", "nemotron", "mla", "llama")
POLICIES = {"on": '{"mode": "on"}', "adaptive": '{"mode": "adaptive", "probe_interval": 8}'}
# name -> (target, drafter, policies, batch sizes)
TARGETS = {"dense": ("hybrid-target", "hybrid-drafter-trained", list(POLICIES), BATCH_SIZES),
           "moe": ("hybrid-moe-target", "hybrid-moe-drafter-trained", ["on"], (4,)),
           "next": ("hybrid-next-target", "hybrid-next-drafter-trained", ["on"], (4,)),
           "lfm2": ("lfm2-target", "lfm2-drafter-trained", ["on", "adaptive"], (4,)),
           "nemotron": ("nemotron-h-target", "nemotron-h-drafter-trained", ["on", "adaptive"], (4,)),
           "mla": ("mla-target", "mla-drafter-trained", ["on", "adaptive"], (4,)),
           "llama": ("llama-target", "llama-drafter-trained", ["on"], (4,))}
# SGLang keeps a Mamba2 mixer's conv window in bfloat16 unless told otherwise
# (whatever --dtype), which moves greedy choices off transformers' float32 ones.
TARGET_ENV = {"nemotron": {"SGLANG_MAMBA_CONV_DTYPE": "float32"}}
# The Nemotron-H drafter accepts less on these chat prompts (about 1.3 in the
# transformers reference loop, 2.5 on its held-out prompts) than the others.
MIN_ACCEPT = {"nemotron": 1.2}
CASES = [(target, policy) for target, (_, _, policies, _) in TARGETS.items() for policy in policies]


@pytest.fixture(scope="module")
def prompts():
    """Token ids (all the tiny targets share one tokenizer): the reference sees
    exactly the tokens the engines do."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PATHS["hybrid-target"])
    return [tok(text).input_ids for text in chat_prompts(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def inputs(prompts):
    """Per target, {run name: (prompts, batch size)}. On a radix target every
    prompt is sent again with three more tokens ("extend", after the prompts
    themselves): it hits the radix cache at the prompt's end."""
    out = {}
    for target, (_, _, _, batch_sizes) in TARGETS.items():
        out[target] = {f"bs{bs}": (prompts, bs) for bs in batch_sizes}
        if target in RADIX_TARGETS:
            out[target]["extend"] = ([ids + ids[:3] for ids in prompts], 4)
    return out


@pytest.fixture(scope="module")
def engines(inputs):
    jobs = {}
    for target, (model, drafter, policies, _) in TARGETS.items():
        experts = {"return_routed_experts": True} if target in EXPERT_TARGETS else {}
        runs = [{"name": name, "input_ids": ids, "batch_size": bs, "sampling_params": GREEDY, **experts}
                for name, (ids, bs) in inputs[target].items()]
        plain = {**ENGINE, **TARGET_ENGINE.get(target, NO_RADIX), "model_path": PATHS[model]}
        env = TARGET_ENV.get(target, {})
        jobs[target, "plain"] = Job(plain, runs, env=env)
        dflash = {**plain, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": PATHS[drafter]}
        for policy in policies:
            jobs[target, policy] = Job(dflash, runs, True, {**env, "SGLANG_DFLASH_POLICY": POLICIES[policy]})
    return dict(zip(jobs, run_engines(list(jobs.values()))))


@pytest.mark.parametrize("target", list(TARGETS))
def test_plain_serving_equals_transformers(engines, inputs, target):
    for name, (prompts, bs) in inputs[target].items():  # extend: served from the cached states
        if name != "extend" and bs != 4:
            continue  # the other batch sizes are checked against this one through DFLASH == plain
        wrong = not_transformers_greedy(PATHS[TARGETS[target][0]], prompts, output_ids(engines[target, "plain"][name]))
        assert not wrong, f"{target} {name}: {{prompt: positions}} not transformers' greedy choice: {wrong}"


@pytest.mark.parametrize("target,policy", CASES)
def test_dflash_greedy_identical_to_plain(engines, inputs, target, policy):
    spec, state = engines[target, policy]
    batch_sizes = TARGETS[target][3]
    for name in inputs[target]:
        want, got = output_ids(engines[target, "plain"][name]), output_ids(spec[name])
        diff = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
        assert len(got) == NUM_PROMPTS and not diff, f"{target} {policy} {name}: prompts {diff} differ"
    widths = state["steps_by_width"]
    if policy == "adaptive":  # the default: widths change between steps, W = 0 included
        assert state["width_changes"] > 0 and 0 < widths[0] < sum(widths) == state["steps"], state
        return
    assert widths[0] == 0 and state["steps"] > 0, widths
    lengths = [r["meta_info"]["spec_accept_length"] for r in spec[f"bs{batch_sizes[0]}"]["results"]]
    # Drafts accepted: the state is committed past the anchor on many steps.
    assert sum(lengths) / len(lengths) > MIN_ACCEPT.get(target, 1.5), lengths


@pytest.mark.parametrize("target", RADIX_TARGETS)
def test_extended_prompts_resume_from_the_radix_cache(engines, prompts, target):
    """Every extended prompt hit its prompt's cached state, plainly and under
    DFLASH (whose drafter context for the cached tokens is the prompt's); their
    outputs are checked above (plain against transformers, DFLASH against plain)."""
    for policy in ["plain", *TARGETS[target][2]]:
        runs = engines[target, policy] if policy == "plain" else engines[target, policy][0]
        cached = [r["meta_info"]["cached_tokens"] for r in runs["extend"]["results"]]
        assert cached == [len(ids) for ids in prompts], f"{target} {policy}: cached tokens {cached}"


@pytest.mark.parametrize("target", EXPERT_TARGETS)
def test_routed_experts_equal_plain(engines, inputs, target):
    """Each request's routed experts, one row per token but the last (prompt
    and output; every layer's top-k ids), equal plain decoding's under every
    policy (adaptive: steps at W = 0, the target's DECODE forward, included).
    Under the overlap scheduler a step's records are stored when its result is
    processed; a decode result without them left the output tokens' rows stale."""
    config = json.load(open(os.path.join(PATHS[TARGETS[target][0]], "config.json")))
    per_token = config["num_hidden_layers"] * config["num_experts_per_tok"]
    for policy in TARGETS[target][2]:
        for name, (prompts, _) in inputs[target].items():
            want = engines[target, "plain"][name]["results"]
            got = engines[target, policy][0][name]["results"]
            for i, (w, g) in enumerate(zip(want, got)):
                w, g = (np.frombuffer(base64.b64decode(r["meta_info"]["routed_experts"]), dtype=np.int32)
                        for r in (w, g))
                tokens = len(prompts[i]) + want[i]["meta_info"]["completion_tokens"] - 1
                assert w.size == g.size == tokens * per_token, (target, policy, name, i, w.size, g.size)
                rows = np.unique(np.nonzero(w != g)[0] // per_token)
                assert not rows.size, f"{target} {policy} {name} prompt {i}: token rows {rows[:8]} differ"
