"""Acceptance report of a drafter against its target (reference loop, no server).

    python -m sglang_dflash.acceptance --target T --drafter D --prompts math \\
        [--n 32 --max-new-tokens 128 --k 16 --json out.json]

`--prompts` is a bundled workload (`math` = GSM8K test, `code` = HumanEval,
`chat` = MT-Bench first turns; comma-separate several) or a .jsonl file with a
"prompt" field. Each prompt is wrapped as one user turn with the target's chat
template (generation prompt included) and decoded greedily:

* one target pass over [committed..., drafts] gives the verification argmax
  and (causal) the target features of every committed position, which are the
  next block's context;
* DFlash 2 drafters draft through the selector (top-K candidates, lattice
  scores, greedy walk: `propose.propose_selector`), v1 drafters take the argmax;
* the longest draft prefix equal to the target's argmax is accepted, plus the
  target's bonus token; decoding stops at EOS or `--max-new-tokens`, and a
  step's length counts only the tokens kept (the last step is cut at EOS or
  at the budget), so sum(lengths) == generated tokens.

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
from dataclasses import asdict, dataclass, field

import torch

from .model import reference_draft_logits, target_features


@dataclass
class AcceptanceStats:
    block_size: int
    k: int
    steps: int = 0
    accepted_lengths: list = field(default_factory=list)  # per step, bonus included
    reached: list = field(default_factory=list)  # [S] slot j reached
    accepted: list = field(default_factory=list)  # [S] slot j accepted
    covered: int = 0  # target token within top-K, over reached slots
    coverage_total: int = 0
    new_tokens: int = 0
    prompts: int = 0
    per_prompt: list = field(default_factory=list)
    # With record_steps: one (confidences [S], accepted drafts) per step, the
    # drafter's per-slot confidence (truncate.py) beside what the target accepted.
    record_steps: bool = False
    step_records: list = field(default_factory=list)

    def __post_init__(self):
        s = self.block_size - 1
        self.reached = self.reached or [0] * s
        self.accepted = self.accepted or [0] * s

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.accepted_lengths) / max(1, len(self.accepted_lengths))

    def histogram(self) -> list:
        counts = [0] * self.block_size
        for n in self.accepted_lengths:
            counts[n - 1] += 1
        return counts

    def per_position(self) -> list:
        return [a / r if r else float("nan") for a, r in zip(self.accepted, self.reached)]

    @property
    def topk_coverage(self) -> float:
        return self.covered / max(1, self.coverage_total)

    def summary(self) -> dict:
        return {"mean_acceptance_length": self.mean_acceptance_length, "steps": self.steps,
                "prompts": self.prompts, "new_tokens": self.new_tokens,
                "histogram": self.histogram(), "per_position_acceptance": self.per_position(),
                "k": self.k, "topk_coverage": self.topk_coverage,
                "per_prompt": self.per_prompt}


def _draft_block(drafter, target, feats: torch.Tensor, anchor_pos: int, anchor_tok: int,
                 mask_token_id: int, use_selector: bool, k: int):
    """Draft B-1 tokens after `anchor_tok` at position `anchor_pos`.

    Args:
        feats: [anchor_pos, n*H] target features of the context (positions < anchor).
    Returns:
        drafts [S] int64, candidate ids [S, k] and per-slot confidence [S]
        (select.path_confidence for DFlash 2, the head's peak probability for v1).
    """
    from .propose import propose_argmax, propose_selector

    cfg = drafter.cfg
    positions = torch.arange(anchor_pos + cfg.block_size)
    ctx_k, ctx_v = drafter.context_kv(drafter.context_features(feats), positions[:anchor_pos])
    block_ids = torch.full((1, cfg.block_size), mask_token_id)
    block_ids[0, 0] = anchor_tok
    embeds = target.get_input_embeddings()(block_ids)
    valid = torch.ones(1, anchor_pos, dtype=torch.bool)
    hidden = drafter.forward_block(embeds, positions[None, anchor_pos:], ctx_k[:, None],
                                   ctx_v[:, None], valid)[:, 1:]  # [1, S, H]
    head = target.get_output_embeddings().weight
    cand_ids = reference_draft_logits(hidden[0], head).topk(k, dim=-1).indices  # [S, k]
    if use_selector:
        s = hidden.shape[1]
        prop = propose_selector(drafter, hidden, torch.tensor([anchor_tok]), head,
                                torch.ones(1), torch.ones(1, dtype=torch.bool),
                                torch.zeros(1, s), with_confidence=True)
    else:
        prop = propose_argmax(hidden, head, with_confidence=True)
    return prop.drafts[0], cand_ids, prop.confidence[0]


@torch.no_grad()
def speculative_decode(target, drafter, prompt: Sequence[int], max_new_tokens: int,
                       mask_token_id: int, eos_token_id: int | None, stats: AcceptanceStats,
                       use_selector: bool):
    """Greedy speculative decoding of one prompt; updates `stats`, returns new tokens."""
    cfg = drafter.cfg
    ids = list(prompt)
    out = target_features(target, torch.tensor([ids]), cfg.target_layer_ids)
    feats, first = out[0][0], int(out[1][0, -1].argmax())
    ids.append(first)
    steps = []
    if max_new_tokens <= 1 or first == eos_token_id:
        ids = ids[:len(prompt) + max_new_tokens]
    while len(ids) - len(prompt) < max_new_tokens and ids[-1] != eos_token_id:
        anchor = len(ids) - 1
        drafts, cands, confidence = _draft_block(drafter, target, feats[:anchor], anchor, ids[-1],
                                                 mask_token_id, use_selector, stats.k)
        drafts = drafts.tolist()
        f, logits = target_features(target, torch.tensor([ids + drafts]), cfg.target_layer_ids)
        posterior = logits[0, anchor:].argmax(-1).tolist()  # [B]
        n = 0
        while n < len(drafts) and drafts[n] == posterior[n]:
            n += 1
        if stats.record_steps:
            stats.step_records.append((confidence.tolist(), n))
        for j in range(min(n + 1, len(drafts))):  # slots reached: 0..n
            stats.reached[j] += 1
            stats.accepted[j] += int(j < n)
            stats.coverage_total += 1
            stats.covered += int(posterior[j] in cands[j].tolist())
        new = drafts[:n] + [posterior[n]]
        # Stop at EOS and at the token budget: count only the tokens the request keeps.
        if eos_token_id in new:
            new = new[:new.index(eos_token_id) + 1]
        new = new[:max_new_tokens - (len(ids) - len(prompt))]
        ids += new
        feats = f[0]  # causal: valid for every committed position
        steps.append(len(new))
    stats.accepted_lengths += steps
    stats.steps += len(steps)
    stats.prompts += 1
    gen = ids[len(prompt):]
    stats.new_tokens += len(gen)
    stats.per_prompt.append(sum(steps) / len(steps) if steps else float("nan"))
    return gen


def load_prompt_texts(spec: str, n: int | None) -> list:
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
    from .train.data import prompt_ids

    ids = prompt_ids(tokenizer, text)
    return ids[-max_len:]


def acceptance_report(target, tokenizer, drafter, texts: Sequence[str], *, max_new_tokens: int,
                      k: int | None = None, log=None, record_steps: bool = False) -> AcceptanceStats:
    cfg = drafter.cfg
    use_selector = drafter.candidate_selector is not None
    k = cfg.selector_top_k if use_selector else (k or 16)
    stats = AcceptanceStats(block_size=cfg.block_size, k=k, record_steps=record_steps)
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
    p = argparse.ArgumentParser(prog="python -m sglang_dflash.acceptance",
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
    from .checkpoint import load_drafter
    from .train.cli import load_target

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
