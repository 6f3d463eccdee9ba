"""A small, deterministic drafter trainer and a reference acceptance probe.

`train_drafter` runs AdamW on the block-diffusion objective (objective.py)
with target features computed on the fly by a frozen HF causal LM.
`measure_acceptance` decodes prompts greedily with the reference loop
(`sglang_dflash.reference`: HF target + drafter, no KV cache, one sequence at
a time) and reports the mean acceptance length, bonus included, as sglang and
vLLM count it.

Determinism: every random draw comes from a `torch.Generator` seeded from
`TrainConfig.seed`; with `torch.set_num_threads(1)` on CPU two runs give the
same weights bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..model import DFlashDrafter, target_features
from ..reference import speculative_generate
from .objective import block_diffusion_loss, sample_anchors


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_size: int = 8  # sequences per step
    num_anchors: int = 16  # blocks per sequence per step
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    grad_clip: float = 1.0
    gamma: float = 7.0
    seed: int = 0
    log_every: int = 50

    def __post_init__(self):
        for name in ("steps", "batch_size", "num_anchors", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} = {getattr(self, name)} must be >= 1")
        if not (self.lr > 0 and self.gamma > 0 and self.grad_clip > 0):
            raise ValueError("TrainConfig.lr, gamma and grad_clip must be > 0")


@dataclass
class TrainHistory:
    """Per-log-interval means: step, loss, accuracy, slot-1 accuracy."""

    rows: list = field(default_factory=list)

    def first_loss(self) -> float:
        return self.rows[0]["loss"]

    def last_loss(self) -> float:
        return self.rows[-1]["loss"]


def pad_batch(sequences: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], pad_id: int):
    """Right-pad 1-D token / loss-mask tensors -> tokens, loss_mask, attention_mask [bs, T]."""
    seq_len = max(int(s.shape[0]) for s in sequences)
    tokens = torch.full((len(sequences), seq_len), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(sequences), seq_len, dtype=torch.bool)
    attention = torch.zeros(len(sequences), seq_len, dtype=torch.long)
    for i, (s, m) in enumerate(zip(sequences, masks)):
        tokens[i, : len(s)] = s
        loss_mask[i, : len(s)] = m
        attention[i, : len(s)] = 1
    return tokens, loss_mask, attention


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _train_step(drafter, target, batch, gen, cfg: TrainConfig, mask_token_id: int):
    tokens, loss_mask, attention = batch
    with torch.no_grad():
        feats, _ = target_features(target, tokens, drafter.cfg.target_layer_ids, attention)
    anchors, valid = sample_anchors(loss_mask, cfg.num_anchors, gen)
    return block_diffusion_loss(
        drafter, feats, tokens, loss_mask, anchors, valid, target.get_input_embeddings(),
        target.get_output_embeddings().weight, mask_token_id, cfg.gamma)


def train_drafter(
    drafter: DFlashDrafter,
    target,
    sequences: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    cfg: TrainConfig,
    *,
    mask_token_id: int,
    pad_token_id: int,
    history: TrainHistory | None = None,
    log: Callable[[str], None] = print,
) -> DFlashDrafter:
    """Train `drafter` in place against a frozen HF `target`; returns it.

    Args:
        sequences: 1-D int64 token tensors; loss_masks: matching 1-D bool
            tensors, True where a token may serve as a label (e.g. responses).
    """
    target.eval().requires_grad_(False)
    drafter.train()
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    history = history if history is not None else TrainHistory()
    window, start = [], time.time()
    for step in range(cfg.steps):
        idx = torch.randint(len(sequences), (cfg.batch_size,), generator=gen).tolist()
        batch = pad_batch([sequences[i] for i in idx], [loss_masks[i] for i in idx], pad_token_id)
        out = _train_step(drafter, target, batch, gen, cfg, mask_token_id)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        window.append((out.loss.item(), out.accuracy.item(), out.first_accuracy.item()))
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            row = _summarise(step + 1, window)
            history.rows.append(row)
            log(f"step {row['step']:5d}  loss {row['loss']:.4f}  acc {row['accuracy']:.3f}  "
                f"acc@1 {row['first_accuracy']:.3f}  ({time.time() - start:.0f}s)")
            window = []
    return drafter.eval()


def _summarise(step: int, window: list) -> dict:
    n = len(window)
    loss, acc, acc1 = (sum(w[i] for w in window) / n for i in range(3))
    return {"step": step, "loss": loss, "accuracy": acc, "first_accuracy": acc1}


# ---------------------------------------------------------------------------
# Acceptance probe (the reference loop of sglang_dflash.reference)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceReport:
    mean_acceptance_length: float  # mean over all steps of (accepted + 1)
    per_prompt: tuple  # mean AL per prompt
    outputs: tuple  # generated token lists per prompt


def measure_acceptance(target, drafter: DFlashDrafter, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int, mask_token_id: int) -> AcceptanceReport:
    """Mean acceptance length (bonus included) of greedy DFlash over `prompts`."""
    all_steps, per_prompt, outputs = [], [], []
    for prompt in prompts:
        out, steps = speculative_generate(target, drafter, prompt, max_new_tokens, mask_token_id)
        all_steps += steps
        per_prompt.append(sum(steps) / len(steps))
        outputs.append(out)
    return AcceptanceReport(sum(all_steps) / len(all_steps), tuple(per_prompt), tuple(outputs))
