"""Training text for drafters: reading, chat formatting, self-distillation.

Accepted inputs (one or more files):

* `.jsonl` rows, any of
  - `{"messages": [{"role": ..., "content": ...}, ...]}` (last assistant turn = response),
  - `{"prompt": ..., "response" | "completion" | "answer": ...}`,
  - `{"question": ..., "answer": ...}` (GSM8K),
  - `{"conversations": [user, assistant, user, ...]}`,
  - `{"prompt": ...}` alone (a prompt for `--self-distill`),
  - `{"text": ...}` (plain text, no template);
* any other file: plain text, split at blank lines into documents.

An `Example` holds the prompt ids (chat template applied, generation prompt
included) and the response ids; labels are the response tokens only (plain
text: every token). With self-distillation the response is replaced by the
target's own greedy continuation, because the drafter must predict the
target, not the dataset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Example:
    prompt: list  # token ids (may be empty for plain text)
    response: list | None  # token ids; None = prompt only (needs self-distillation)

    def tokens_and_mask(self, max_len: int):
        resp = self.response or []
        ids = (self.prompt + resp)[:max_len]
        mask = ([False] * len(self.prompt) + [True] * len(resp))[:max_len]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)


def _chat_ids(tokenizer, messages: list, add_generation_prompt: bool) -> list:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def prompt_ids(tokenizer, prompt: str) -> list:
    """A single user turn with the generation prompt, as served."""
    return _chat_ids(tokenizer, [{"role": "user", "content": prompt}], True)


def _from_messages(tokenizer, messages: list) -> Example:
    if messages and messages[-1]["role"] == "assistant":
        head = _chat_ids(tokenizer, messages[:-1], True)
        full = _chat_ids(tokenizer, messages, False)
        if full[:len(head)] == head:
            return Example(head, full[len(head):])
        return Example([], full)
    return Example(_chat_ids(tokenizer, messages, True), None)


def _row_example(tokenizer, row: dict) -> Example | None:
    if "messages" in row:
        return _from_messages(tokenizer, row["messages"])
    if "conversations" in row:
        turns = row["conversations"]
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": str(t)}
                for i, t in enumerate(turns)]
        return _from_messages(tokenizer, msgs)
    prompt = row.get("prompt", row.get("question"))
    response = row.get("response", row.get("completion", row.get("answer")))
    if prompt is not None:
        msgs = [{"role": "user", "content": str(prompt)}]
        if response is not None:
            msgs.append({"role": "assistant", "content": str(response)})
        return _from_messages(tokenizer, msgs)
    if "text" in row:
        return Example([], tokenizer(str(row["text"]))["input_ids"])
    return None


def load_examples(tokenizer, paths: list, max_examples: int | None = None) -> list:
    """Examples from every file in `paths`, in order (then truncated to max_examples)."""
    examples = []
    for path in paths:
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for line in text.splitlines():
                if line.strip():
                    ex = _row_example(tokenizer, json.loads(line))
                    if ex is not None:
                        examples.append(ex)
        else:
            for doc in text.split("\n\n"):
                if doc.strip():
                    examples.append(Example([], tokenizer(doc)["input_ids"]))
    return examples[:max_examples] if max_examples else examples


@torch.no_grad()
def self_distill(target, examples: list, *, max_new_tokens: int, eos_token_id: int,
                 pad_token_id: int, batch_size: int = 16, max_len: int = 512,
                 log=print) -> list:
    """Replace each prompted example's response by the target's greedy one.

    Prompts are batched by length (left padding, HF `generate`, greedy); the
    response stops after the first EOS. Plain-text examples stay as they are.
    """
    target.eval()
    out = list(examples)
    todo = sorted((i for i, ex in enumerate(examples) if ex.prompt),
                  key=lambda i: len(examples[i].prompt))
    for start in range(0, len(todo), batch_size):
        idx = todo[start:start + batch_size]
        prompts = [examples[i].prompt[-(max_len - max_new_tokens):] for i in idx]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(idx), width), pad_token_id, dtype=torch.long)
        attn = torch.zeros(len(idx), width, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p)
            attn[r, width - len(p):] = 1
        gen = target.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                              do_sample=False, eos_token_id=eos_token_id,
                              pad_token_id=pad_token_id)[:, width:]
        for r, i in enumerate(idx):
            resp = gen[r].tolist()
            if eos_token_id in resp:
                resp = resp[:resp.index(eos_token_id) + 1]
            out[i] = Example(prompts[r], resp)
        log(f"self-distill: {min(start + batch_size, len(todo))}/{len(todo)} prompts")
    return out


def save_examples(examples: list, path) -> None:
    """Write token ids as jsonl (atomically: another run may be waiting for the file)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text("".join(json.dumps({"prompt": e.prompt, "response": e.response}) + "\n"
                           for e in examples))
    tmp.replace(path)


def read_examples(path) -> list:
    return [Example(r["prompt"], r["response"]) for r in
            (json.loads(x) for x in Path(path).read_text().splitlines() if x.strip())]
