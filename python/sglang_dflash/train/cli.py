"""`sglang-dflash train` / `python -m sglang_dflash.train`: train a DFlash drafter.

    python -m sglang_dflash.train --target TARGET_DIR --data train.jsonl --out OUT \\
        [--arch dflash2] [--self-distill] [--steps 1000] [--resume]

* target hidden states of `--target-layer-ids` are computed on the fly by the
  frozen HF target;
* loss = block-diffusion CE (train/objective.py) + `--selector-weight` x the
  selector's K-way CE over the target's top-K (train/selector_loss.py, DFlash 2);
* `--self-distill` regenerates every response with the target's greedy
  decoding first (cached in `--distill-cache` when given);
* checkpoints every `--save-every` steps to OUT/checkpoint-STEP (drafter in the
  published layout + trainer_state.pt); `--resume` continues from the latest
  one (or a given directory) bit for bit; the final drafter is written to OUT
  with `checkpoint.save_drafter` and a `training_log.json`.

Deterministic: seeded generators, one thread by default.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

from ..checkpoint import save_drafter
from ..config import build_target_layer_ids, parse_drafter_config
from ..model import DFlashDrafter, reference_draft_logits, target_features
from .data import load_examples, read_examples, save_examples, self_distill
from .objective import (
    block_labels,
    draft_hidden_for_anchors,
    sample_anchors,
    weighted_block_ce,
)
from .selector_loss import selector_kway_loss
from .trainer import TrainConfig, _lr_factor, pad_batch

STATE_NAME = "trainer_state.pt"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang-dflash train", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HF target directory (model + tokenizer)")
    p.add_argument("--data", nargs="+", required=True, help=".jsonl or plain-text files")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--arch", choices=["dflash", "dflash2"], default="dflash2")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--target-layer-ids", default=None, help="comma-separated, e.g. 0,2")
    p.add_argument("--intermediate-size", type=int, default=None, help="default: target's")
    p.add_argument("--conv-kernel-size", type=int, default=2)
    p.add_argument("--conv-group-size", type=int, default=16)
    p.add_argument("--selector-rank", type=int, default=32)
    p.add_argument("--selector-top-k", type=int, default=16)
    p.add_argument("--selector-weight", type=float, default=1.0)
    p.add_argument("--mask-token", default="<|MASK|>")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--self-distill", action="store_true")
    p.add_argument("--max-new-tokens", type=int, default=256, help="self-distillation length")
    p.add_argument("--distill-cache", type=Path, default=None,
                   help="jsonl of token ids: read if it exists, else written after distilling")
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="continue from OUT's latest checkpoint or from the given one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a bar")
    return p


def drafter_config_dict(target_config, args, mask_token_id: int) -> dict:
    """HF-style drafter config.json for the target (model_type qwen3)."""
    n_target = target_config.num_hidden_layers
    if args.target_layer_ids:
        layer_ids = [int(x) for x in str(args.target_layer_ids).split(",")]
    else:
        layer_ids = build_target_layer_ids(n_target, args.num_layers)
    dflash = {"block_size": args.block_size, "target_layer_ids": layer_ids,
              "mask_token_id": mask_token_id, "mask_token": args.mask_token}
    arch = "DFlashDraftModel"
    if args.arch == "dflash2":
        arch = "DFlash2DraftModel"
        dflash.update(conv_kernel_size=args.conv_kernel_size,
                      conv_group_size=args.conv_group_size,
                      selector_rank=args.selector_rank, selector_top_k=args.selector_top_k)
    tc = target_config
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    return {
        "architectures": [arch], "model_type": "qwen3", "hidden_size": tc.hidden_size,
        "intermediate_size": args.intermediate_size or tc.intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads, "head_dim": head_dim,
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": float(getattr(tc, "rope_theta", None)
                            or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta",
                                                                                  10000.0)),
        "max_position_embeddings": tc.max_position_embeddings, "vocab_size": tc.vocab_size,
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "num_target_layers": n_target, "block_size": args.block_size, "dflash_config": dflash,
    }


def load_target(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    target.requires_grad_(False)
    return target, tokenizer


def train_step_loss(drafter, target, batch, gen, cfg: TrainConfig, mask_token_id: int,
                    selector_weight: float):
    """Block-diffusion loss (+ selector K-way loss for DFlash 2) of one batch -> (loss, stats)."""
    tokens, loss_mask, attention = batch
    with torch.no_grad():
        feats, _ = target_features(target, tokens, drafter.cfg.target_layer_ids, attention)
    anchors, valid = sample_anchors(loss_mask, cfg.num_anchors, gen)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    hidden = draft_hidden_for_anchors(drafter, feats, tokens, anchors, embed, mask_token_id)
    logits = reference_draft_logits(hidden[:, 1:], head)
    labels, counted = block_labels(tokens, loss_mask, anchors, valid, drafter.cfg.block_size)
    labels, counted = labels.flatten(0, 1), counted.flatten(0, 1)
    out = weighted_block_ce(logits, labels, counted, cfg.gamma)
    stats = {"ce": out.loss.item(), "acc": out.accuracy.item(), "acc1": out.first_accuracy.item()}
    loss = out.loss
    if drafter.candidate_selector is not None and selector_weight > 0:
        sel = selector_kway_loss(drafter, hidden[:, 1:], logits,
                                 tokens.gather(1, anchors).flatten(), labels, counted, cfg.gamma)
        loss = loss + selector_weight * sel.loss
        stats.update(sel=sel.loss.item(), sel_acc=sel.accuracy.item(),
                     topk=sel.gold_in_topk.item())
    stats["loss"] = loss.item()
    return loss, stats


def _latest_checkpoint(out: Path) -> Path | None:
    best, best_step = None, -1
    for d in out.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", d.name)
        if m and (d / STATE_NAME).is_file() and int(m.group(1)) > best_step:
            best, best_step = d, int(m.group(1))
    return best


def save_checkpoint(directory: Path, drafter, cfg_dict, opt, sched, gen, step, history) -> None:
    save_drafter(drafter, cfg_dict, directory)
    torch.save({"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "generator": gen.get_state(), "history": history,
                "rng": torch.get_rng_state()}, directory / STATE_NAME)


def _prepare_examples(args, target, tokenizer, log):
    if args.distill_cache is not None and args.distill_cache.is_file():
        examples = read_examples(args.distill_cache)
        log(f"read {len(examples)} examples from {args.distill_cache}")
        return examples
    examples = load_examples(tokenizer, args.data, args.max_examples)
    log(f"loaded {len(examples)} examples from {', '.join(map(str, args.data))}")
    if args.self_distill:
        t0 = time.time()
        examples = self_distill(target, examples, max_new_tokens=args.max_new_tokens,
                                eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, max_len=args.max_len,
                                log=log)
        log(f"self-distilled {len(examples)} responses in {time.time() - t0:.0f}s")
        if args.distill_cache is not None:
            args.distill_cache.parent.mkdir(parents=True, exist_ok=True)
            save_examples(examples, args.distill_cache)
    examples = [e for e in examples if e.response]
    if not examples:
        raise SystemExit("no training examples with a response (use --self-distill for "
                         "prompt-only data)")
    return examples


def run(argv=None, log=None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    log = log or (lambda m: print(f"[train] {m}", file=sys.stderr, flush=True))
    target, tokenizer = load_target(args.target)
    mask_id = tokenizer.convert_tokens_to_ids(args.mask_token)
    if mask_id is None or mask_id == tokenizer.unk_token_id:
        raise SystemExit(f"the target tokenizer has no mask token {args.mask_token!r}")
    cfg_dict = drafter_config_dict(target.config, args, mask_id)
    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(parse_drafter_config(cfg_dict))
    examples = _prepare_examples(args, target, tokenizer, log)
    pairs = [e.tokens_and_mask(args.max_len) for e in examples]
    pairs = [(t, m) for t, m in pairs if int(m[2:].sum()) > 0]
    sequences, masks = [t for t, _ in pairs], [m for _, m in pairs]
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, num_anchors=args.num_anchors,
                      lr=args.lr, weight_decay=args.weight_decay,
                      warmup_steps=args.warmup_steps, gamma=args.gamma, seed=args.seed,
                      log_every=args.log_every)
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    history, start_step = [], 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        ckpt = _latest_checkpoint(args.out) if args.resume == "latest" else Path(args.resume)
        if ckpt is None:
            log("--resume: no checkpoint under OUT; starting from scratch")
        else:
            from ..checkpoint import load_drafter

            loaded = load_drafter(ckpt, target_hidden_size=None, target_vocab_size=None,
                                  target_num_layers=None)
            drafter.load_state_dict(loaded.state_dict())
            state = torch.load(ckpt / STATE_NAME, weights_only=False)
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            gen.set_state(state["generator"])
            torch.set_rng_state(state["rng"])
            history, start_step = state["history"], state["step"]
            log(f"resumed from {ckpt} at step {start_step}")
    target.eval()
    drafter.train()
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=start_step, desc="train", dynamic_ncols=True)
        except ImportError:
            bar = None
    window, t0 = [], time.time()
    for step in range(start_step, cfg.steps):
        idx = torch.randint(len(sequences), (cfg.batch_size,), generator=gen).tolist()
        batch = pad_batch([sequences[i] for i in idx], [masks[i] for i in idx],
                          tokenizer.pad_token_id)
        loss, stats = train_step_loss(drafter, target, batch, gen, cfg, mask_id,
                                      args.selector_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        window.append(stats)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", acc=f"{stats['acc']:.3f}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            row = {"step": step + 1, **{k: sum(w[k] for w in window) / len(window)
                                        for k in window[0]},
                   "seconds": round(time.time() - t0, 1)}
            history.append(row)
            log(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items()))
            window = []
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(args.out / f"checkpoint-{step + 1}", drafter, cfg_dict, opt, sched,
                            gen, step + 1, history)
    if bar is not None:
        bar.close()
    drafter.eval()
    save_drafter(drafter, cfg_dict, args.out)
    summary = {"steps": cfg.steps, "examples": len(sequences),
               "label_tokens": int(sum(int(m.sum()) for m in masks)),
               "seconds_this_run": round(time.time() - t0, 1), "history": history,
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    (args.out / "training_log.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"saved drafter to {args.out}")
    return {"drafter": drafter, "cfg_dict": cfg_dict, "history": history, "target": target,
            "tokenizer": tokenizer}


def main(argv=None) -> None:
    run(argv)
