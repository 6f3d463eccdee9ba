"""Acceptance report of a drafter against its target (reference loop, no server).

    python -m sglang_dflash.tools.acceptance_report --target T --drafter D --prompts math \\
        [--n 32 --max-new-tokens 128 --k 16 --json out.json]

`--prompts` is a bundled workload (`math` = GSM8K test, `code` = HumanEval,
`chat` = MT-Bench first turns; comma-separate several) or a .jsonl file with a
"prompt" field. Each prompt is wrapped as one user turn with the target's chat
template (generation prompt included) and decoded greedily by the reference
loop (`sglang_dflash.reference.decode`): DFlash 2 drafters draft through the
selector, v1 drafters take the argmax; decoding stops at EOS or
`--max-new-tokens`, and a step's length counts only the tokens kept, so
sum(lengths) == generated tokens.

Printed: mean acceptance length (accepted + 1 per step, bonus included), the
histogram of per-step lengths, per-position acceptance (P(slot j accepted |
slot j reached)), and the K-coverage: how often the target's token was among
the drafter's top-K candidates at every reached slot (K = selector_top_k for
DFlash 2, else `--k`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch

from ..reference import AcceptanceStats, decode

__all__ = ["AcceptanceStats", "acceptance_report", "encode_prompt", "format_report",
           "load_prompt_texts", "main", "speculative_decode"]


def speculative_decode(target, drafter, prompt: Sequence[int], max_new_tokens: int,
                       mask_token_id: int, eos_token_id: int | None, stats: AcceptanceStats,
                       use_selector: bool) -> list:
    """Decode one prompt into `stats`; returns its generated tokens."""
    result = decode(target, drafter, prompt, max_new_tokens, mask_token_id,
                    eos_token_id=eos_token_id, k=stats.k, use_selector=use_selector)
    stats.add(result)
    return result.tokens


def load_prompt_texts(spec: str, n: int | None) -> list:
    """Bundled workloads and/or .jsonl files (comma list), n prompts from each."""
    from .prompts import WORKLOADS, load_prompts

    texts = []
    for part in spec.split(","):
        if part in WORKLOADS:
            texts += load_prompts(part, n)
        else:
            with open(part) as f:
                rows = [json.loads(x) for x in f if x.strip()]
            texts += [r["prompt"] for r in rows][:n]
    return texts


def encode_prompt(tokenizer, text: str, max_len: int) -> list:
    """One chat-templated user turn, its last `max_len` tokens."""
    from ..train.data import prompt_ids

    ids = prompt_ids(tokenizer, text)
    return ids[-max_len:]


def acceptance_report(target, tokenizer, drafter, texts: Sequence[str], *, max_new_tokens: int,
                      k: int | None = None, log=None) -> AcceptanceStats:
    cfg = drafter.cfg
    use_selector = drafter.candidate_selector is not None
    k = cfg.selector_top_k if use_selector else (k or 16)
    stats = AcceptanceStats(block_size=cfg.block_size, k=k)
    limit = target.config.max_position_embeddings - max_new_tokens - 2 * cfg.block_size
    for i, text in enumerate(texts):
        prompt = encode_prompt(tokenizer, text, limit)
        speculative_decode(target, drafter, prompt, max_new_tokens, cfg.mask_token_id,
                           tokenizer.eos_token_id, stats, use_selector)
        if log:
            log(f"prompt {i + 1}/{len(texts)}: AL {stats.per_prompt[-1]:.2f} "
                f"(running {stats.mean_acceptance_length:.3f})")
    return stats


def format_report(stats: AcceptanceStats, title: str = "") -> str:
    hist = stats.histogram()
    total = max(1, sum(hist))
    lines = [f"acceptance report{(' - ' + title) if title else ''}",
             f"prompts: {stats.prompts}  steps: {stats.steps}  new tokens: {stats.new_tokens}",
             f"mean acceptance length (bonus included): {stats.mean_acceptance_length:.3f}",
             "histogram of accepted lengths:"]
    for n, c in enumerate(hist, start=1):
        lines.append(f"  {n}: {c:6d} ({100 * c / total:5.1f}%) {'#' * round(40 * c / total)}")
    lines.append("per-position acceptance (slot: accepted/reached):")
    for j, (a, r) in enumerate(zip(stats.accepted, stats.reached), start=1):
        lines.append(f"  {j}: {a / r if r else float('nan'):.3f} ({a}/{r})")
    lines.append(f"target token among top-{stats.k} candidates: {stats.topk_coverage:.3f} "
                 f"({stats.covered}/{stats.coverage_total} reached slots)")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_dflash.tools.acceptance_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", default="math", help="math, code, chat (comma list) or a .jsonl")
    p.add_argument("--n", type=int, default=32, help="prompts per workload / file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=16, help="K for the coverage of v1 drafters")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the numbers here")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from ..checkpoint import load_drafter
    from ..train.cli import load_target

    target, tokenizer = load_target(args.target)
    c = target.config
    drafter = load_drafter(args.drafter, target_hidden_size=c.hidden_size,
                           target_vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers)
    t0 = time.time()
    stats = acceptance_report(
        target, tokenizer, drafter, load_prompt_texts(args.prompts, args.n),
        max_new_tokens=args.max_new_tokens, k=args.k,
        log=(lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None)
    kind = "DFlash 2 (selector walk)" if drafter.candidate_selector is not None else "DFlash"
    print(format_report(stats, f"{kind}, prompts {args.prompts}, greedy, block "
                               f"{drafter.cfg.block_size}"))
    print(f"({time.time() - t0:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": args.prompts, "drafter": args.drafter, "target": args.target,
                       "max_new_tokens": args.max_new_tokens, **stats.summary()}, f, indent=1)


if __name__ == "__main__":
    main()
