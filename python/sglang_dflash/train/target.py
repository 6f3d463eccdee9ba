"""Train the demo target: a small Qwen3 causal LM with its own tokenizer.

    python -m sglang_dflash.train.target --out python/sglang_dflash/assets/demo/target \\
        --chatterbot-dir DIR --steps 600

Text (all permissively licensed):

* GSM8K train (`gsm8k_train.jsonl`, MIT): user = question, assistant = answer.
* Python source of the standard library (PSF license), read from
  `sysconfig.get_paths()["stdlib"]`: each top-level `def`/`class` chunk becomes
  a chat turn, user = its first lines (every other one prefixed with
  "Complete this Python code:\\n"), assistant = the whole chunk.
* chatterbot-corpus English conversations (BSD-3-Clause, PyPI
  `chatterbot-corpus`): alternating user / assistant turns.

Every document is formatted with the chat template, the documents are shuffled
(seeded), concatenated and cut into `--seq-len` windows. The tokenizer is a
byte-level BPE (vocab `--vocab-size`, specials as `tiny_models`) trained on the
same text. Deterministic with one thread.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import sysconfig
import time
from pathlib import Path

import torch

from sglang_dflash.tools.chat_tokenizer import build_bpe_tokenizer

CODE_PREFIX = "Complete this Python code:\n"
DEFAULT_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"


def chat(turns: list) -> str:
    """Alternating user / assistant turns -> chat-template text (no generation prompt)."""
    out = []
    for i, content in enumerate(turns):
        role = "user" if i % 2 == 0 else "assistant"
        out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(out)


def gsm8k_pairs(path: Path) -> list:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [(r["question"], r["answer"]) for r in rows]


def chatterbot_conversations(root: Path | None) -> list:
    """English conversations [[turn, turn, ...], ...] from chatterbot-corpus."""
    import yaml

    if root is None:
        try:
            import chatterbot_corpus  # type: ignore

            root = Path(chatterbot_corpus.__file__).parent / "data" / "english"
        except ImportError:
            return []
    convs = []
    for f in sorted(glob.glob(str(Path(root) / "*.yml"))):
        data = yaml.safe_load(Path(f).read_text(encoding="utf-8"))
        for conv in data.get("conversations", []) or []:
            turns = [str(t).strip() for t in conv if t is not None and str(t).strip()]
            if len(turns) >= 2:
                convs.append(turns)
    return convs


def code_chunks(max_chars: int, seed: int) -> list:
    """Top-level def / class chunks of stdlib .py files, (prompt, whole chunk) pairs."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(p for p in glob.glob(os.path.join(stdlib, "*.py")))
    files += sorted(glob.glob(os.path.join(stdlib, "json", "*.py")))
    files += sorted(glob.glob(os.path.join(stdlib, "email", "*.py")))
    rng = random.Random(seed)
    rng.shuffle(files)
    pairs, total = [], 0
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines, chunk = text.splitlines(), []
        chunks = []
        for line in lines:
            if (line.startswith("def ") or line.startswith("class ")) and chunk:
                chunks.append(chunk)
                chunk = []
            chunk.append(line)
        chunks.append(chunk)
        for c in chunks[1:]:  # skip module headers (license banners, imports)
            body = "\n".join(c).rstrip() + "\n"
            if not (80 <= len(body) <= 2500):
                continue
            head = "\n".join(c[:max(1, min(len(c) // 3, 6))]) + "\n"
            # Half the prompts carry an instruction, half are bare code (as HumanEval's).
            pairs.append(((CODE_PREFIX if len(pairs) % 2 == 0 else "") + head, body))
            total += len(body)
        if total >= max_chars:
            break
    return pairs


def build_documents(args) -> dict:
    gsm = gsm8k_pairs(Path(args.data_dir) / "gsm8k_train.jsonl")
    convs = chatterbot_conversations(Path(args.chatterbot_dir) if args.chatterbot_dir else None)
    code = code_chunks(args.code_chars, args.seed)
    docs = ([chat([q, a]) for q, a in gsm] + [chat(t) for t in convs]
            + [chat([p, b]) for p, b in code])
    random.Random(args.seed).shuffle(docs)
    return {"docs": docs, "counts": {"gsm8k": len(gsm), "chatterbot": len(convs),
                                     "stdlib_code": len(code)},
            "chars": sum(len(d) for d in docs)}


def build_tokenizer(texts: list, vocab_size: int, max_len: int):
    return build_bpe_tokenizer(texts, vocab_size, max_len)


def build_model(tokenizer, args):
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=args.seq_len, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
        dtype="float32")
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    return model


def write_drafter_prompts(args) -> dict:
    """Prompt-only jsonl for drafter self-distillation: GSM8K-train questions,
    chatterbot first turns and stdlib code heads (the evaluation sets, GSM8K
    test / HumanEval / MT-Bench, stay unseen)."""
    rng = random.Random(args.seed + 7)
    gsm = [q for q, _ in gsm8k_pairs(Path(args.data_dir) / "gsm8k_train.jsonl")]
    rng.shuffle(gsm)
    convs = chatterbot_conversations(Path(args.chatterbot_dir) if args.chatterbot_dir else None)
    firsts = sorted({c[0] for c in convs})
    rng.shuffle(firsts)
    code = [p for p, _ in code_chunks(args.code_chars, args.seed)]
    rng.shuffle(code)
    n_gsm, n_chat, n_code = (int(x) for x in args.drafter_prompt_counts.split(","))
    rows = ([{"prompt": q, "source": "gsm8k_train"} for q in gsm[:n_gsm]]
            + [{"prompt": q, "source": "chatterbot"} for q in firsts[:n_chat]]
            + [{"prompt": q, "source": "stdlib"} for q in code[:n_code]])
    Path(args.drafter_prompts).parent.mkdir(parents=True, exist_ok=True)
    Path(args.drafter_prompts).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"gsm8k_train": min(n_gsm, len(gsm)), "chatterbot": min(n_chat, len(firsts)),
            "stdlib": min(n_code, len(code))}


def _parse(argv=None):
    p = argparse.ArgumentParser(description="Train the demo Qwen3 target (CPU, 1 thread).")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--drafter-prompts", type=Path, default=None,
                   help="only write the drafter's self-distillation prompts (jsonl) and exit")
    p.add_argument("--drafter-prompt-counts", default="700,250,250",
                   help="gsm8k-train,chatterbot,stdlib prompt counts")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--chatterbot-dir", default=None,
                   help="chatterbot_corpus/data/english (default: the installed package)")
    p.add_argument("--code-chars", type=int, default=1_500_000)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=20)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = _parse(argv)
    if args.drafter_prompts is not None:
        print(f"[target] drafter prompts {write_drafter_prompts(args)} -> {args.drafter_prompts}")
        return
    if args.out is None:
        raise SystemExit("--out is required")
    torch.set_num_threads(args.threads)
    log = lambda m: print(f"[target] {m}", flush=True)  # noqa: E731
    t0 = time.time()
    corpus = build_documents(args)
    log(f"documents {corpus['counts']}, {corpus['chars']} chars")
    tokenizer = build_tokenizer(corpus["docs"], args.vocab_size, args.seq_len)
    ids = []
    for doc in corpus["docs"]:
        ids += tokenizer(doc)["input_ids"]
    stream = torch.tensor(ids, dtype=torch.long)
    log(f"tokenizer vocab {len(tokenizer)}; {len(stream)} tokens ({time.time() - t0:.0f}s)")
    model = build_model(tokenizer, args)
    log(f"params {sum(p.numel() for p in model.parameters())}")
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                            betas=(0.9, 0.95))

    def factor(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        prog = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    window, history, start = [], [], time.time()
    n_windows = (len(stream) - 1) // args.seq_len
    order = torch.randperm(n_windows, generator=gen)
    for step in range(args.steps):
        idx = [order[(step * args.batch_size + i) % n_windows] for i in range(args.batch_size)]
        batch = torch.stack([stream[int(j) * args.seq_len:(int(j) + 1) * args.seq_len + 1]
                             for j in idx])
        out = model(input_ids=batch[:, :-1], use_cache=False)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        window.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            row = {"step": step + 1, "loss": sum(window) / len(window),
                   "seconds": round(time.time() - start)}
            history.append(row)
            log(f"step {row['step']}/{args.steps} loss {row['loss']:.4f} ({row['seconds']}s)")
            window = []
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)
    info = {"counts": corpus["counts"], "chars": corpus["chars"], "tokens": len(stream),
            "epochs": args.steps * args.batch_size * args.seq_len / len(stream),
            "history": history, "seconds": round(time.time() - t0),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    (args.out.parent / "target_training.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"saved to {args.out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
