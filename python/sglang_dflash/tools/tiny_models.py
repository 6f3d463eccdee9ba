"""Build the tiny, deterministic test models (float32, fixed seeds).

    python -m sglang_dflash.tools.tiny_models --out python/sglang_dflash/assets/tiny

writes four directories:

* `target/`: a random HF `Qwen3ForCausalLM` (H 64, 4 layers, 4 heads / 2 KV
  heads, head_dim 16, FFN 128, untied head) with its own byte-level BPE
  tokenizer (vocab 1024; specials `<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>`, `<|MASK|>`) and a Qwen-style chat template.
* `drafter-random/`: DFlash v1, 1 layer, block 8, taps [1, 2], random.
* `dflash2-random/`: DFlash 2, 1 layer, block 8, 2-tap conv (group 16),
  selector r 16 / K 8, random (convs perturbed away from the identity so the
  conv path is exercised).
* `drafter-trained/`: DFlash v1, 2 layers, block 8, taps [0, 2], trained on
  the target's own greedy continuations with the block-diffusion objective;
  its measured acceptance goes to `TRAINING.md` (next to the four dirs).

Two init scales of the target differ from transformers' default (std 0.02):

* embeddings, std 0.1: the residual stream is then dominated by the current
  token, so the target behaves mostly like a random bigram chain (about 87% of
  its greedy choices equal the context-free bigram argmax) whose greedy
  trajectories fall into cycles. A 2-layer drafter learns that in minutes on
  one CPU thread; with the default scale it stays near AL 1.3.
* head, std 0.2: top-1 margins grow tenfold, so greedy comparisons are not at
  the mercy of float32 rounding, and T = 1 sampling is not near-uniform.

Tokenizer text comes from `--data-dir` (gsm8k train, HumanEval prompts,
MT-Bench questions; default `../shared/data` from the repo root), else from a
small bundled paragraph. Same seed, same bytes for the random models; training
is deterministic with one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

from ..checkpoint import save_drafter
from ..config import parse_drafter_config
from ..model import DFlashDrafter
from .chat_tokenizer import build_bpe_tokenizer

PACKAGE = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE.parents[1]
DEFAULT_OUT = PACKAGE / "assets" / "tiny"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
VOCAB_SIZE = 1024
TARGET_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=2048, rms_norm_eps=1e-6)
ROPE_THETA = 10000.0
EMBED_STD = 0.1
HEAD_STD = 0.2
BLOCK_SIZE = 8
PROMPT_LEN = 24  # tokens per training / evaluation prompt
RANDOM_LAYER_IDS = [1, 2]
# SGLang 0.5.23 captures "the output of layer k" as the input of layer k + 1, so
# the last target layer (3) cannot be tapped when serving: stay below it.
TRAINED_LAYER_IDS = [0, 2]
_FALLBACK_TEXT = """\
Natalia sold clips to 48 of her friends in April, and then she sold half as many
clips in May. How many clips did Natalia sell altogether in April and May?
Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether.
def has_close_elements(numbers, threshold):
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2 and abs(elem - elem2) < threshold:
                return True
    return False
Compose an engaging travel blog post about a recent trip to Hawaii, highlighting
cultural experiences and must-see attractions. Draft a professional email seeking
your supervisor's feedback on the quarterly financial report you prepared.
"""


# ---------------------------------------------------------------------------
# Text and tokenizer
# ---------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_corpus(data_dir: Path) -> dict:
    """Texts for the tokenizer, drafter-training prompts and held-out prompts.

    Drafter training uses gsm8k *train* only, so the HumanEval / MT-Bench
    prompts that acceptance reports use stay unseen; held-out = gsm8k test.
    Without `data_dir`, the package's bundled prompt sets are used, then a
    bundled paragraph (the tokenizer, hence every model, then differs).
    """
    gsm_train, gsm_test = data_dir / "gsm8k_train.jsonl", data_dir / "gsm8k_test.jsonl"
    if not gsm_train.is_file():
        return _bundled_corpus()
    train = [r["question"] + "\n" + r["answer"] for r in _read_jsonl(gsm_train)]
    heldout = [r["question"] for r in _read_jsonl(gsm_test)] if gsm_test.is_file() else train[-200:]
    extra = []
    for name, pick in (("HumanEval.jsonl", lambda r: [r["prompt"]]),
                       ("mt_bench_question.jsonl", lambda r: list(r["turns"]))):
        if (data_dir / name).is_file():
            extra += [text for row in _read_jsonl(data_dir / name) for text in pick(row)]
    return {"tokenizer": train + extra, "train": train, "heldout": heldout,
            "heldout_name": "gsm8k test questions", "source": str(data_dir)}


def _bundled_corpus() -> dict:
    bundled = PACKAGE / "data"
    files = [bundled / f"{name}.jsonl" for name in ("gsm8k", "humaneval", "mtbench")]
    if all(f.is_file() for f in files):
        gsm, rest = _read_jsonl(files[0]), _read_jsonl(files[1]) + _read_jsonl(files[2])
        train = [r["prompt"] for r in gsm[:150]]
        return {"tokenizer": train + [r["prompt"] for r in rest], "train": train,
                "heldout": [r["prompt"] for r in gsm[150:]],
                "heldout_name": "bundled gsm8k questions 150-199", "source": str(bundled)}
    lines = [line for line in _FALLBACK_TEXT.splitlines() if line.strip()]
    return {"tokenizer": lines * 40, "train": lines * 40, "heldout": lines,
            "heldout_name": "the fallback text", "source": "bundled fallback text"}


def build_tokenizer(texts: list):
    """Byte-level BPE (vocab 1024) wrapped as an HF fast tokenizer."""
    return build_bpe_tokenizer(texts, VOCAB_SIZE, TARGET_DIMS["max_position_embeddings"])


# ---------------------------------------------------------------------------
# Target
# ---------------------------------------------------------------------------


def special_ids(tokenizer) -> tuple[int, int]:
    """(eos, pad) token ids of the tiny tokenizer."""
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return eos, pad


def random_target(model_class, config, seed: int):
    """A random HF target of `model_class`, embeddings and head rescaled so its
    greedy chains are bigram-like (a small drafter learns them), eval mode; its
    generation config takes the config's eos and pad ids."""
    from transformers import GenerationConfig

    eos, pad = config.eos_token_id, config.pad_token_id
    torch.manual_seed(seed)
    model = model_class(config).float().eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, EMBED_STD)
        model.lm_head.weight.normal_(0.0, HEAD_STD)
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    return model


def redrawn(model, kinds: list[str], kind: str, block: str, stds: dict):
    """The model with the weights of each `kind` layer's `block` redrawn at `stds`."""
    with torch.no_grad():
        for layer, k in zip(model.model.layers, kinds):
            if k == kind:
                for name, std in stds.items():
                    getattr(getattr(layer, block), name).weight.normal_(0.0, std)
    return model


def build_target(tokenizer, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos, pad = special_ids(tokenizer)
    config = Qwen3Config(vocab_size=len(tokenizer), rope_theta=ROPE_THETA,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
                         pad_token_id=pad, dtype="float32", **TARGET_DIMS)
    return random_target(Qwen3ForCausalLM, config, seed)


def save_target(model, tokenizer, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # template in tokenizer_config.json


# ---------------------------------------------------------------------------
# Drafters
# ---------------------------------------------------------------------------


def drafter_config_dict(target_config, *, architecture: str, num_layers: int,
                        target_layer_ids: list, mask_token_id: int,
                        extra: dict | None = None) -> dict:
    """An HF-style drafter config.json (model_type qwen3, as published drafters)."""
    dflash = {"block_size": BLOCK_SIZE, "target_layer_ids": list(target_layer_ids),
              "mask_token_id": mask_token_id, "mask_token": "<|MASK|>", **(extra or {})}
    return {
        "architectures": [architecture], "model_type": "qwen3",
        "hidden_size": target_config.hidden_size,
        "intermediate_size": TARGET_DIMS["intermediate_size"],
        "num_hidden_layers": num_layers,
        "num_attention_heads": TARGET_DIMS["num_attention_heads"],
        "num_key_value_heads": TARGET_DIMS["num_key_value_heads"],
        "head_dim": TARGET_DIMS["head_dim"], "hidden_act": "silu", "attention_bias": False,
        "rms_norm_eps": TARGET_DIMS["rms_norm_eps"], "rope_theta": ROPE_THETA,
        "max_position_embeddings": TARGET_DIMS["max_position_embeddings"],
        "vocab_size": target_config.vocab_size, "tie_word_embeddings": False,
        "torch_dtype": "float32", "num_target_layers": target_config.num_hidden_layers,
        "block_size": BLOCK_SIZE, "dflash_config": dflash,
    }


def build_random_drafter(cfg_dict: dict, seed: int) -> DFlashDrafter:
    """Random drafter with non-degenerate outputs.

    Linear layers keep torch's default (fan-in scaled) init, so activations
    stay O(1); norm weights are 1 +- 0.1; DFlash 2 convs get base kernels and
    coefficient projections perturbed away from the identity, and codebooks
    std 0.5, so every published tensor affects the output.
    """
    torch.manual_seed(seed)
    model = DFlashDrafter(parse_drafter_config(cfg_dict))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("base_kernel"):
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith("kernel_projection.weight"):
                p.normal_(0.0, 0.1)
            elif "codebook" in name:
                p.normal_(0.0, 0.5)
    return model.eval()


# ---------------------------------------------------------------------------
# Training data and the trained drafter
# ---------------------------------------------------------------------------


def make_prompts(tokenizer, texts: list, count: int, seed: int) -> list:
    """`count` prompts of PROMPT_LEN tokens cut from `texts` at random offsets."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    order = torch.randperm(len(texts), generator=gen).tolist()
    for i in order:
        ids = tokenizer(texts[i])["input_ids"]
        if len(ids) < PROMPT_LEN:
            continue
        start = int(torch.randint(len(ids) - PROMPT_LEN + 1, (1,), generator=gen))
        prompts.append(ids[start:start + PROMPT_LEN])
        if len(prompts) == count:
            break
    return prompts


@torch.no_grad()
def self_generate(target, prompts: list, new_tokens: int, batch: int = 64) -> list:
    """The target's own greedy continuations (equal-length prompts: no padding)."""
    outputs = []
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i:i + batch])
        step_in, cache = ids, None
        for _ in range(new_tokens):
            out = target(input_ids=step_in, past_key_values=cache, use_cache=True)
            step_in, cache = out.logits[:, -1:].argmax(-1), out.past_key_values
            ids = torch.cat((ids, step_in), dim=1)
        outputs += list(ids)
    return outputs


def train_tiny_drafter(target, tokenizer, corpus: dict, args, log, architecture: str = "DFlashDraftModel",
                       top: dict | None = None) -> tuple:
    """A 2-layer v1-layout drafter of `architecture` (config keys `top` added at
    the top level) trained on the target's own greedy continuations."""
    from ..train import TrainConfig, TrainHistory, measure_acceptance, train_drafter

    mask_id = tokenizer.convert_tokens_to_ids("<|MASK|>")
    cfg_dict = drafter_config_dict(target.config, architecture=architecture, num_layers=2,
                                   target_layer_ids=TRAINED_LAYER_IDS, mask_token_id=mask_id)
    cfg_dict.update(top or {})
    torch.manual_seed(args.seed + 3)
    drafter = DFlashDrafter(parse_drafter_config(cfg_dict))
    t0 = time.time()
    prompts = make_prompts(tokenizer, corpus["train"], args.train_sequences, args.seed)
    sequences = self_generate(target, prompts, args.gen_tokens)
    masks = [torch.arange(len(s)) >= PROMPT_LEN for s in sequences]  # labels: generated only
    log(f"generated {len(sequences)} x {args.gen_tokens} tokens in {time.time() - t0:.0f}s")
    tcfg = TrainConfig(steps=args.steps, batch_size=16, num_anchors=16, lr=6e-3,
                       warmup_steps=50, seed=args.seed, log_every=max(1, args.steps // 10))
    history = TrainHistory()
    train_drafter(drafter, target, sequences, masks, tcfg, mask_token_id=mask_id,
                  pad_token_id=tokenizer.pad_token_id, history=history, log=log)
    heldout = make_prompts(tokenizer, corpus["heldout"], args.eval_prompts, args.seed + 1)
    report = measure_acceptance(target, drafter, heldout, args.eval_tokens, mask_id)
    log(f"held-out greedy mean acceptance length (bonus included): "
        f"{report.mean_acceptance_length:.3f} over {len(heldout)} prompts")
    return drafter, cfg_dict, {"config": tcfg, "history": history, "report": report,
                               "num_sequences": len(sequences), "heldout": len(heldout)}


def target_and_trained_drafter(args, log, name: str, build, save=None) -> tuple:
    """`name`-target/ built by `build(tokenizer, seed)` (saved by `save`, else as
    a plain HF checkpoint) and `name`-drafter-trained/ trained on it, both under
    args.out; returns (target, tokenizer, corpus, training info)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.out / "target")
    target = build(tokenizer, args.seed)
    (save or save_target)(target, tokenizer, _fresh_dir(args.out / f"{name}-target"))
    corpus = load_corpus(args.data_dir)
    drafter, cfg_dict, info = train_tiny_drafter(target, tokenizer, corpus, args, log)
    save_drafter(drafter, cfg_dict, _fresh_dir(args.out / f"{name}-drafter-trained"))
    return target, tokenizer, corpus, info


def _display(source: str) -> str:
    """Repo-relative path when `source` is a directory (stable across machines)."""
    return os.path.relpath(source, REPO_ROOT) if os.path.isdir(source) else source


def write_training_md(path: Path, info: dict, args, corpus: dict, seconds: float) -> None:
    tcfg, report = info["config"], info["report"]
    rows = "\n".join(f"| {r['step']} | {r['loss']:.4f} | {r['accuracy']:.3f} | "
                     f"{r['first_accuracy']:.3f} |" for r in info["history"].rows)
    per_prompt = ", ".join(f"{x:.2f}" for x in report.per_prompt)
    path.write_text(f"""# Tiny test models

Built by `sglang_dflash.tools.tiny_models` (float32, seed {args.seed}; see its docstring):

* `target/`: random HF Qwen3ForCausalLM (H 64, 4 layers, 4 / 2 heads, head_dim 16,
  FFN 128, vocab 1024, untied head; embeddings std {EMBED_STD}, head std {HEAD_STD})
  with a byte-level BPE tokenizer and a Qwen-style chat template; mask token `<|MASK|>`.
* `drafter-random/`: DFlash v1, 1 layer, block {BLOCK_SIZE},
  target_layer_ids {RANDOM_LAYER_IDS}, random.
* `dflash2-random/`: DFlash 2, 1 layer, block {BLOCK_SIZE}, conv 2 taps / group 16,
  selector r 16 / K 8, random (convs perturbed away from the identity).
* `drafter-trained/`: described below.

## drafter-trained

DFlash v1 drafter (2 layers, block {BLOCK_SIZE}, target_layer_ids {TRAINED_LAYER_IDS})
trained against `target/`. (Layer 3, the last, is not tapped: SGLang captures the
output of layer k at the input of layer k + 1.)

* **Data.** {info['num_sequences']} prompts of {PROMPT_LEN} tokens cut from the texts
  of `{_display(corpus['source'])}` (seed {args.seed}), each continued by the target's own
  greedy decoding for {args.gen_tokens} tokens. Labels are the generated tokens only.
* **Objective.** Block diffusion (`sglang_dflash.train.objective`): anchors in
  the generated region, block `[tok[a], MASK x 7]`, context = target features of
  positions < a, CE on tok[a+k] weighted by exp(-(k-1)/{tcfg.gamma}).
* **Optimiser.** AdamW lr {tcfg.lr}, weight decay {tcfg.weight_decay}, warm-up
  {tcfg.warmup_steps} then cosine to 10%, grad clip {tcfg.grad_clip};
  {tcfg.steps} steps x {tcfg.batch_size} sequences x {tcfg.num_anchors} anchors; seed {tcfg.seed}.
* **Build time.** {seconds:.0f} s for the whole script on CPU, 1 thread.

| step | loss | accuracy | slot-1 accuracy |
|---|---|---|---|
{rows}

**Measured acceptance.** Greedy reference speculative decoding (HF target +
drafter, block {BLOCK_SIZE}, accept while draft == target argmax), {info['heldout']}
held-out prompts of {PROMPT_LEN} tokens ({corpus['heldout_name']}), {args.eval_tokens}
new tokens each: **mean acceptance length {report.mean_acceptance_length:.3f}**
(bonus included). Per prompt: {per_prompt}.

Command:

    PYTHONPATH=python python3 -m sglang_dflash.tools.tiny_models --out {args.out_display} \\
        --seed {args.seed} --steps {args.steps}
""")


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def trained_drafter_md(name: str, info: dict, args, seconds: float) -> str:
    """The report lines of a pair's `{name}-drafter-trained/` (the tiny_hybrid and
    tiny_swa reports): what it is, how it was trained, its acceptance, build time."""
    return f"""* `{name}-drafter-trained/`: DFlash v1 drafter (2 layers, block {BLOCK_SIZE},
  target_layer_ids {TRAINED_LAYER_IDS}), trained as `drafter-trained/` is
  ({info['num_sequences']} prompts continued by the target's greedy decoding,
  {info['config'].steps} steps).
* **Held-out greedy acceptance** (bonus included, {info['heldout']} prompts of
  {PROMPT_LEN} tokens, {args.eval_tokens} new tokens, reference loop):
  {info['report'].mean_acceptance_length:.3f}.
* **Build time.** {seconds:.0f} s on CPU, 1 thread.
"""


def build_parser(description: str) -> argparse.ArgumentParser:
    """The output directory, the text source and the drafter-training settings."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--train-sequences", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=136)
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--eval-tokens", type=int, default=128)
    return p


def deterministic_build(name: str):
    """One thread, deterministic kernels; returns a progress logger."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return lambda msg: print(f"[{name}] {msg}", flush=True)


def _parse_args(argv=None):
    p = build_parser(__doc__.split("\n\n")[0])
    p.add_argument("--skip-training", action="store_true", help="random models only")
    args = p.parse_args(argv)
    args.out_display = os.path.relpath(args.out.resolve(), REPO_ROOT)
    return args


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def main(argv=None) -> None:
    args = _parse_args(argv)
    log = deterministic_build("tiny_models")
    start = time.time()
    corpus = load_corpus(args.data_dir)
    log(f"text from {corpus['source']}: {len(corpus['tokenizer'])} tokenizer texts")
    tokenizer = build_tokenizer(corpus["tokenizer"])
    target = build_target(tokenizer, args.seed)
    save_target(target, tokenizer, _fresh_dir(args.out / "target"))
    mask_id = tokenizer.convert_tokens_to_ids("<|MASK|>")
    v1 = drafter_config_dict(target.config, architecture="DFlashDraftModel", num_layers=1,
                             target_layer_ids=RANDOM_LAYER_IDS, mask_token_id=mask_id)
    save_drafter(build_random_drafter(v1, args.seed + 1), v1,
                 _fresh_dir(args.out / "drafter-random"))
    v2 = drafter_config_dict(target.config, architecture="DFlash2DraftModel", num_layers=1,
                             target_layer_ids=RANDOM_LAYER_IDS, mask_token_id=mask_id,
                             extra={"conv_kernel_size": 2, "conv_group_size": 16,
                                    "selector_rank": 16, "selector_top_k": 8})
    save_drafter(build_random_drafter(v2, args.seed + 2), v2,
                 _fresh_dir(args.out / "dflash2-random"))
    log(f"random models written to {args.out}")
    if args.skip_training:
        return
    drafter, cfg_dict, info = train_tiny_drafter(target, tokenizer, corpus, args, log)
    save_drafter(drafter, cfg_dict, _fresh_dir(args.out / "drafter-trained"))
    write_training_md(args.out / "TRAINING.md", info, args, corpus, time.time() - start)
    log(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
