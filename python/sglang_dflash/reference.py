"""The plain-torch reference of greedy speculative decoding (no SGLang, no KV cache).

One sequence at a time, against an HF causal-LM target:

* the prefill's target pass gives the first token (the first anchor) and the
  target features of every prompt position;
* a step drafts the block [anchor, MASK x (B-1)] from the target features of
  the committed tokens before the anchor, with the served proposal (DFlash 2:
  the selector's greedy walk, `propose_selector`; v1: the head's argmax,
  `propose_argmax`);
* one target pass over [committed..., drafts] verifies it: the longest draft
  prefix equal to the target's argmax is accepted, plus the target's bonus
  token; the pass is causal, so its features of the committed positions are
  the next block's context;
* decoding stops at EOS or at the token budget, and a step keeps only the
  tokens the request keeps.

Greedy verification is lossless, so the generated tokens are the target's own
greedy continuation (`greedy_generate` is the oracle). The acceptance report
(`sglang_dflash.tools.acceptance_report`), the trainer's acceptance probe
(`train.trainer.measure_acceptance`) and benchmark/step_analysis.py all score
drafters through `decode`, which records every step (`Step`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .candidates import Candidates
from .model import target_features
from .propose import propose_argmax, propose_selector
from .vocab_head import VocabHead


@dataclass
class DraftBlock:
    """One drafted block: the drafter's states, the proposal and (optionally) the top-K."""

    hidden: torch.Tensor  # [1, S, H] drafter states at block slots 1..S
    drafts: list  # [S] proposed tokens
    candidates: Candidates | None  # ids / unary [1, S, K], when asked for


@dataclass
class Step:
    """One draft-and-verify step of `decode`."""

    position: int  # the anchor's index in the sequence (= tokens of context)
    anchor: int  # the last committed token, block slot 0
    drafts: list  # [S] proposed tokens
    verified: list  # [B] the target's argmax after the anchor and after each draft
    accepted: int  # leading drafts equal to the target's argmax
    tokens: list  # committed: accepted drafts + bonus, cut at EOS and at the budget
    candidates: Candidates | None = None  # the drafter's top-K ([1, S, K]) when k was given
    hidden: torch.Tensor | None = None  # [1, S, H] with keep_hidden

    @property
    def reached(self) -> int:
        """Slots the verifier looked at: every accepted one and the first rejected one."""
        return min(self.accepted + 1, len(self.drafts))

    @property
    def candidate_ids(self) -> list:
        """[S][K] candidate token ids (empty without candidates)."""
        return self.candidates.ids[0].tolist() if self.candidates is not None else []


@dataclass
class Decoded:
    tokens: list  # generated tokens, the prefill's first
    steps: list  # [Step]


def _device(target) -> torch.device:
    return next(target.parameters()).device


def draft_hidden(drafter, target, ctx_feats: torch.Tensor, anchor: int,
                 mask_token_id: int) -> torch.Tensor:
    """Drafter hidden states at block slots 1..B-1 for [anchor, MASK x (B-1)].

    The computation of `model.reference_draft_step`, with the context's target
    features given instead of recomputed (the verify pass already has them).

    Args:
        ctx_feats: [L, n*H] target features of the committed tokens before the
            anchor (positions 0..L-1); the anchor sits at position L.
    Returns:
        [1, S, H].
    """
    cfg = drafter.cfg
    ctx_len, dev = ctx_feats.shape[0], ctx_feats.device
    positions = torch.arange(ctx_len + cfg.block_size, device=dev)
    ctx_k, ctx_v = drafter.context_kv(drafter.context_features(ctx_feats), positions[:ctx_len])
    block = torch.full((1, cfg.block_size), mask_token_id, device=dev, dtype=torch.long)
    block[0, 0] = anchor
    embeds = target.get_input_embeddings()(block)
    valid = torch.ones(1, ctx_len, dtype=torch.bool, device=dev)
    hidden = drafter.forward_block(embeds, positions[None, ctx_len:], ctx_k[:, None],
                                   ctx_v[:, None], valid)
    return hidden[:, 1:]


def draft_block(drafter, target, ctx_feats: torch.Tensor, anchor: int, mask_token_id: int, *,
                k: int | None = None, use_selector: bool = False) -> DraftBlock:
    """Draft one block as the served worker does (greedy), plus the top-k candidates
    of every slot when `k` is given (for coverage and path statistics)."""
    cfg = drafter.cfg
    hidden = draft_hidden(drafter, target, ctx_feats, anchor, mask_token_id)
    head = VocabHead.whole(target.get_output_embeddings().weight, cfg.vocab_size)
    cands = None
    if k:
        cands = head.topk(hidden, k, output_multiplier=cfg.output_multiplier,
                          softcap=cfg.final_logit_softcapping)
    if use_selector:
        dev, slots = hidden.device, hidden.shape[1]
        prop = propose_selector(drafter, hidden, torch.tensor([anchor], device=dev), head,
                                temperature=torch.zeros(1, device=dev),
                                greedy=torch.ones(1, dtype=torch.bool, device=dev),
                                uniforms=torch.zeros(1, slots, device=dev), all_greedy=True)
    else:
        prop = propose_argmax(hidden, head)
    return DraftBlock(hidden=hidden, drafts=prop.drafts[0].tolist(), candidates=cands)


def leading_matches(path: Sequence[int], truth: Sequence[int]) -> int:
    """Length of the common prefix: the drafts a greedy verifier accepts."""
    n = 0
    for a, b in zip(path, truth):
        if a != b:
            break
        n += 1
    return n


def _kept(tokens: list, eos_token_id: int | None, room: int) -> list:
    """The step's tokens the request keeps: up to EOS (included) and within the budget."""
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[:tokens.index(eos_token_id) + 1]
    return tokens[:room]


@torch.no_grad()
def decode(target, drafter, prompt: Sequence[int], max_new_tokens: int, mask_token_id: int, *,
           eos_token_id: int | None = None, k: int | None = None,
           use_selector: bool | None = None, keep_hidden: bool = False) -> Decoded:
    """Greedy speculative decoding of one prompt, every step recorded.

    Args:
        k: also keep the drafter's top-k candidates per slot (Step.candidates).
        use_selector: draft through the selector; default: when the drafter has one.
        keep_hidden: keep each block's drafter states (Step.hidden).
    """
    cfg = drafter.cfg
    if use_selector is None:
        use_selector = drafter.candidate_selector is not None
    dev = _device(target)
    ids = list(prompt)
    feats, logits = target_features(target, torch.tensor([ids], device=dev), cfg.target_layer_ids)
    feats = feats[0]
    ids.append(int(logits[0, -1].argmax()))
    if max_new_tokens <= 1 or ids[-1] == eos_token_id:
        ids = ids[:len(prompt) + max_new_tokens]
    steps = []
    while len(ids) - len(prompt) < max_new_tokens and ids[-1] != eos_token_id:
        pos = len(ids) - 1
        block = draft_block(drafter, target, feats[:pos], ids[-1], mask_token_id, k=k,
                            use_selector=use_selector)
        f, logits = target_features(target, torch.tensor([ids + block.drafts], device=dev),
                                    cfg.target_layer_ids)
        verified = logits[0, pos:].argmax(-1).tolist()  # [B]
        n = leading_matches(block.drafts, verified)
        room = max_new_tokens - (len(ids) - len(prompt))
        step = Step(position=pos, anchor=ids[-1], drafts=block.drafts, verified=verified,
                    accepted=n, tokens=_kept(block.drafts[:n] + [verified[n]], eos_token_id, room),
                    candidates=block.candidates, hidden=block.hidden if keep_hidden else None)
        steps.append(step)
        ids += step.tokens
        feats = f[0]  # causal: valid for every committed position
    return Decoded(tokens=ids[len(prompt):], steps=steps)


@torch.no_grad()
def greedy_generate(target, prompt: Sequence[int], max_new_tokens: int) -> list:
    """Plain greedy decoding without a KV cache (the equivalence oracle)."""
    dev = _device(target)
    ids = list(prompt)
    for _ in range(max_new_tokens):
        logits = target(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


def speculative_generate(target, drafter, prompt: Sequence[int], max_new_tokens: int,
                         mask_token_id: int) -> tuple:
    """(generated tokens, per-step acceptance lengths): accepted drafts + 1, the
    last step not cut at the budget (how sglang and vLLM count a step)."""
    out = decode(target, drafter, prompt, max_new_tokens, mask_token_id)
    return out.tokens, [s.accepted + 1 for s in out.steps]


@dataclass
class AcceptanceStats:
    """Acceptance of a drafter over prompts decoded by `decode` (with candidates)."""

    block_size: int
    k: int
    steps: int = 0
    accepted_lengths: list = field(default_factory=list)  # per step, tokens kept (bonus included)
    reached: list = field(default_factory=list)  # [S] slot j reached
    accepted: list = field(default_factory=list)  # [S] slot j accepted
    covered: int = 0  # target token within top-K, over reached slots
    coverage_total: int = 0
    new_tokens: int = 0
    prompts: int = 0
    per_prompt: list = field(default_factory=list)

    def __post_init__(self):
        s = self.block_size - 1
        self.reached = self.reached or [0] * s
        self.accepted = self.accepted or [0] * s

    def add(self, result: Decoded) -> None:
        """Count one decoded prompt."""
        for step in result.steps:
            cand_ids = step.candidate_ids
            for j in range(step.reached):
                self.reached[j] += 1
                self.accepted[j] += int(j < step.accepted)
                self.coverage_total += 1
                self.covered += int(step.verified[j] in cand_ids[j])
        lengths = [len(s.tokens) for s in result.steps]
        self.accepted_lengths += lengths
        self.steps += len(lengths)
        self.prompts += 1
        self.new_tokens += len(result.tokens)
        self.per_prompt.append(sum(lengths) / len(lengths) if lengths else math.nan)

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.accepted_lengths) / max(1, len(self.accepted_lengths))

    def histogram(self) -> list:
        counts = [0] * self.block_size
        for n in self.accepted_lengths:
            counts[n - 1] += 1
        return counts

    def per_position(self) -> list:
        return [a / r if r else math.nan for a, r in zip(self.accepted, self.reached)]

    @property
    def topk_coverage(self) -> float:
        return self.covered / max(1, self.coverage_total)

    def summary(self) -> dict:
        return {"mean_acceptance_length": self.mean_acceptance_length, "steps": self.steps,
                "prompts": self.prompts, "new_tokens": self.new_tokens,
                "histogram": self.histogram(), "per_position_acceptance": self.per_position(),
                "k": self.k, "topk_coverage": self.topk_coverage,
                "per_prompt": self.per_prompt}
