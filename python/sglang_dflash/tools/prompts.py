"""The bundled prompt sets: math (GSM8K), code (HumanEval), conversation (MT-Bench)."""

from __future__ import annotations

import json
import os

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
WORKLOADS = {"math": "gsm8k.jsonl", "code": "humaneval.jsonl", "chat": "mtbench.jsonl"}


def load_prompts(workload: str, limit: int | None = None) -> list[str]:
    """Prompts of one workload ('math', 'code' or 'chat'), in file order."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {sorted(WORKLOADS)}")
    with open(os.path.join(DATA_DIR, WORKLOADS[workload])) as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    return rows[:limit] if limit is not None else rows


def mixed_prompts(n: int) -> list[str]:
    """n prompts taken round-robin from the three workloads."""
    per = {w: load_prompts(w) for w in WORKLOADS}
    order = list(WORKLOADS)
    return [per[order[i % 3]][i // 3] for i in range(n)]


def chat_text(tokenizer, prompt: str) -> str:
    """One user turn under the tokenizer's chat template, ready for the reply."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def mixed_chat_prompts(model_path: str, n: int) -> list[str]:
    """`mixed_prompts(n)` as chat texts under the model's own template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return [chat_text(tok, p) for p in mixed_prompts(n)]
