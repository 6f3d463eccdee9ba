#!/usr/bin/env python
"""Offline step analysis of a DFlash / DFlash 2 drafter against its target (no server).

    python benchmark/step_analysis.py                              # bundled pair, 8 prompts per workload
    python benchmark/step_analysis.py --target T --drafter D --prompts 32 --max-new-tokens 256
    python benchmark/step_analysis.py --tiny --out /tmp/steps.json # a few prompts (the unit test)

The reference greedy speculative loop in plain torch (`sglang_dflash.reference`):
the HF transformers target, our drafter (loaded by
`sglang_dflash.checkpoint.load_drafter`), the drafts of the served worker (v1:
argmax of the target head; DFlash 2: the selector's greedy walk) and greedy
verification by one target forward over [context, anchor, drafts]. Because
greedy verification is lossless, the
committed sequence is the target's own greedy continuation; every block is
therefore also scored counterfactually against it:

* per-position acceptance (conditional a_j = accepted / reached, and
  P(accept_len >= j)), mean acceptance length (accepted drafts + bonus) and its
  histogram;
* recall@1 and recall@K per position: how often the target's token is the
  drafter's top candidate / among its top-K candidates (K = the drafter's
  `selector_top_k`, or --k);
* the acceptance length of other paths through the same candidates: the
  argmax path (top-1 at every slot), for DFlash 2 the selector's greedy walk
  (what is served), the highest-scoring path through the selector lattice
  (Viterbi), and the oracle (the best path: the target's tokens, as long as
  each is among the candidates);
* timing: the draft step (drafter forward + proposal, + selector for DFlash 2)
  and the context update against one target verify forward of B tokens over a
  KV cache (HF target), i.e. the draft overhead as a fraction of a verify.

Writes JSON (--out, default benchmark/results/step_analysis.json, not
tracked), the same report as Markdown beside it (.md), and prints a short table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

DEFAULT_OUT = os.path.join(common.RESULTS_DIR, "step_analysis.json")
WORKLOADS = ("math", "code", "chat")


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def load_pair(target_dir: str, drafter_dir: str, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_dflash.checkpoint import load_drafter

    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    tcfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    drafter = load_drafter(drafter_dir, target_hidden_size=int(tcfg.hidden_size),
                           target_vocab_size=int(tcfg.vocab_size),
                           target_num_layers=int(tcfg.num_hidden_layers), dtype=dtype).to(device).eval()
    mask_id = drafter.cfg.mask_token_id
    if mask_id is None:
        mask_id = tok.convert_tokens_to_ids(drafter.cfg.mask_token)
        if mask_id is None or mask_id == tok.unk_token_id:
            raise ValueError(f"drafter has no mask_token_id and the tokenizer has no {drafter.cfg.mask_token!r}")
    return tok, target, drafter, int(mask_id)


def chat_prompts(tok, workloads, per_workload: int) -> list[tuple[str, list[int]]]:
    from sglang_dflash.tools.prompts import chat_text, load_prompts

    out = []
    for w in workloads:
        for p in load_prompts(w, limit=per_workload):
            out.append((w, tok.encode(chat_text(tok, p), add_special_tokens=False)))
    return out


def features(out, layer_ids):
    """[T, n*H]: the target layers' outputs (HF hidden_states[k + 1]) of the first sequence."""
    import torch

    return torch.cat([out.hidden_states[k + 1] for k in layer_ids], dim=-1)[0]  # [T, n*H]


def viterbi(scores):
    """Highest total score path through a [S, K, K] lattice (slot 0: row 0).
    Returns the list of chosen candidate indices per slot."""
    S = scores.shape[0]
    best = scores[0, 0].clone()  # [K]
    back = []
    for e in range(1, S):
        total = best[:, None] + scores[e]  # [K(p), K(c)]
        best, arg = total.max(dim=0)
        back.append(arg)
    path = [int(best.argmax())]
    for arg in reversed(back):
        path.append(int(arg[path[-1]]))
    return list(reversed(path)) if S else []


# ---------------------------------------------------------------------------
# The reference loop, every block scored against the greedy truth
# ---------------------------------------------------------------------------


def _viterbi_tokens(drafter, step) -> list[int]:
    """The highest-scoring path through the step's selector lattice, as tokens."""
    import torch

    from sglang_dflash.select import lattice_scores

    sel, hidden = drafter.candidate_selector, step.hidden
    anchor = torch.tensor([step.anchor], device=hidden.device)
    scores = lattice_scores(step.candidates, hidden.float(), anchor, sel.predecessor_codebook,
                            sel.successor_codebook, sel.hidden_projection.weight)[0]
    cand_ids = step.candidate_ids
    return [cand_ids[e][c] for e, c in enumerate(viterbi(scores))]


def generate(prompt_ids, target, drafter, mask_id, max_new: int, k: int) -> dict:
    """Greedy speculative decoding of one prompt (`sglang_dflash.reference.decode`);
    one record per block started within the first `max_new` tokens. The loop runs
    S tokens further so that every recorded block has its full greedy truth."""
    from sglang_dflash.reference import decode

    cfg = drafter.cfg
    S = cfg.block_size - 1
    out = decode(target, drafter, prompt_ids, max_new + S, mask_id, k=k,
                 keep_hidden=cfg.has_selector)
    full = list(prompt_ids) + out.tokens
    last = len(prompt_ids) + max_new - 1  # blocks anchored before this were started in budget
    steps = []
    for st in out.steps:
        if st.position >= last:
            break
        step = {"pos": st.position, "cand_ids": st.candidate_ids, "drafts": st.drafts,
                "accept": st.accepted, "truth": full[st.position + 1:st.position + 1 + S]}
        if cfg.has_selector:
            step["viterbi"] = _viterbi_tokens(drafter, st)
        steps.append(step)
    return {"steps": steps, "generated": out.tokens[:max_new]}


def analyse(steps: list[dict], S: int, has_selector: bool) -> dict:
    """Statistics over recorded steps (see the module docstring)."""
    from sglang_dflash.reference import leading_matches

    n = len(steps)
    if n == 0:
        return {"steps": 0}
    reached, accepted, top1, topk = [0] * S, [0] * S, [0] * S, [0] * S
    hist = [0] * (S + 1)  # index a: steps accepting a drafts (AL = a + 1)
    paths = {"served": [], "argmax": [], "oracle": []}
    if has_selector:
        paths["viterbi"] = []
    consistent = True
    for st in steps:
        a, truth = st["accept"], st["truth"]
        hist[a] += 1
        consistent &= leading_matches(st["drafts"], truth) == a
        for j in range(S):
            if j <= a:
                reached[j] += 1
            if j < a:
                accepted[j] += 1
            top1[j] += st["cand_ids"][j][0] == truth[j]
            topk[j] += truth[j] in st["cand_ids"][j]
        paths["served"].append(a)
        paths["argmax"].append(leading_matches([c[0] for c in st["cand_ids"]], truth))
        oracle = 0
        for j in range(S):
            if truth[j] not in st["cand_ids"][j]:
                break
            oracle += 1
        paths["oracle"].append(oracle)
        if has_selector:
            paths["viterbi"].append(leading_matches(st["viterbi"], truth))
    al = {name: sum(v) / n + 1 for name, v in paths.items()}
    out = {
        "steps": n,
        "mean_acceptance_length": al["served"],
        "acceptance_hist": hist,
        "acceptance_by_position": [accepted[j] / reached[j] if reached[j] else None for j in range(S)],
        "accept_at_least": [accepted[j] / n for j in range(S)],
        "recall_at_1": [top1[j] / n for j in range(S)],
        "recall_at_k": [topk[j] / n for j in range(S)],
        "path_acceptance_length": al,
        "verify_consistent_with_greedy_truth": consistent,
    }
    if has_selector:
        out["selector_equals_oracle_rate"] = sum(
            s == o for s, o in zip(paths["served"], paths["oracle"])) / n
        out["selector_differs_from_argmax_rate"] = sum(
            st["drafts"] != [c[0] for c in st["cand_ids"]] for st in steps) / n
    return out


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def _median_ms(fn, iters: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def time_step(target, drafter, mask_id, ctx_len: int, iters: int, warmup: int) -> dict:
    """Median ms of: target verify forward of B tokens over a KV cache of ctx_len
    tokens, target decode of 1 token, drafter block forward, the proposal
    (argmax head / candidates + selector walk) and the context update of B rows."""
    import copy

    import torch
    from transformers import DynamicCache

    from sglang_dflash.propose import propose_argmax, propose_selector
    from sglang_dflash.vocab_head import VocabHead

    cfg = drafter.cfg
    B, S = cfg.block_size, cfg.block_size - 1
    dev = next(target.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    vocab = cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    ctx_ids = torch.randint(4, vocab, (1, ctx_len), generator=gen).to(dev)
    block_ids = torch.randint(4, vocab, (1, B), generator=gen).to(dev)
    cache = DynamicCache()
    out = target(input_ids=ctx_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
    ctx_feats = features(out, cfg.target_layer_ids)
    base_len = cache.get_seq_length()

    def target_forward(n_tokens: int):
        def run():
            target(input_ids=block_ids[:, :n_tokens], past_key_values=cache, use_cache=True,
                   position_ids=torch.arange(base_len, base_len + n_tokens, device=dev)[None])
            cache.crop(-n_tokens)  # negative: drop the last n tokens (transformers 4 and 5)
        return run

    # Check that crop restores the cache, else fall back to copying it.
    target_forward(B)()
    if cache.get_seq_length() != base_len:
        pristine = copy.deepcopy(cache)

        def target_forward(n_tokens: int):
            def run():
                c = copy.deepcopy(pristine)
                target(input_ids=block_ids[:, :n_tokens], past_key_values=c, use_cache=True)
            return run

    positions = torch.arange(ctx_len + B, device=dev)
    ctx_k, ctx_v = drafter.context_kv(drafter.context_features(ctx_feats), positions[:ctx_len])
    ctx_k, ctx_v = ctx_k[:, None], ctx_v[:, None]
    valid = torch.ones(1, ctx_len, dtype=torch.bool, device=dev)
    block = block_ids.clone()
    block[0, 1:] = mask_id
    embed = target.get_input_embeddings()
    lm_head = VocabHead.whole(target.get_output_embeddings().weight, vocab)
    hidden = {}

    def draft_forward():
        hidden["h"] = drafter.forward_block(embed(block), positions[None, ctx_len:], ctx_k, ctx_v, valid)

    draft_forward()
    h = hidden["h"][:, 1:]
    anchor = block_ids[:, 0]
    ones = torch.ones(1, dtype=torch.bool, device=dev)
    zeros, uniforms = torch.zeros(1, device=dev), torch.zeros(1, S, device=dev)
    if cfg.has_selector:
        def propose():
            propose_selector(drafter, h, anchor, lm_head, temperature=zeros, greedy=ones, uniforms=uniforms)
    else:
        def propose():
            propose_argmax(h, lm_head)
    new_feats = ctx_feats[-B:]

    def ctx_update():
        drafter.context_kv(drafter.context_features(new_feats), positions[ctx_len:ctx_len + B])

    res = {
        "ctx_len": ctx_len,
        "block_size": B,
        "verify_ms": _median_ms(target_forward(B), iters, warmup, sync),
        "decode_ms": _median_ms(target_forward(1), iters, warmup, sync),
        "draft_forward_ms": _median_ms(draft_forward, iters, warmup, sync),
        "propose_ms": _median_ms(propose, iters, warmup, sync),
        "context_update_ms": _median_ms(ctx_update, iters, warmup, sync),
    }
    res["draft_step_ms"] = res["draft_forward_ms"] + res["propose_ms"] + res["context_update_ms"]
    res["draft_fraction_of_verify"] = res["draft_step_ms"] / res["verify_ms"]
    res["verify_over_decode"] = res["verify_ms"] / res["decode_ms"]
    return res


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------


def table(result: dict) -> str:
    S = result["drafter"]["block_size"] - 1
    rows = [("all", result["overall"])] + list(result["by_workload"].items())
    others = [p for p in result["paths"] if p != "served"]
    head = ["workload", "steps", "AL"] + [f"AL {p} path" for p in others] + [
        "a_1..a_S (conditional)", f"recall@1 / @{result['k']} (pos 1, S)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows:
        if not r.get("steps"):
            continue
        rates = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance_by_position"])
        rec = (f"{r['recall_at_1'][0]:.2f} / {r['recall_at_k'][0]:.2f}, "
               f"{r['recall_at_1'][S - 1]:.2f} / {r['recall_at_k'][S - 1]:.2f}")
        lines.append("| " + " | ".join([name, str(r["steps"]), f"{r['mean_acceptance_length']:.2f}"]
                                       + [f"{r['path_acceptance_length'][p]:.2f}" for p in others]
                                       + [rates, rec]) + " |")
    t = result.get("timing")
    if t:
        lines += ["", f"Timing (median of {result['settings']['iters']}, context {t['ctx_len']} tokens, "
                  f"B = {t['block_size']}): target verify {t['verify_ms']:.2f} ms, decode "
                  f"{t['decode_ms']:.2f} ms; draft forward {t['draft_forward_ms']:.2f} ms + proposal "
                  f"{t['propose_ms']:.2f} ms + context update {t['context_update_ms']:.2f} ms = "
                  f"**{t['draft_fraction_of_verify']:.1%} of a verify forward**."]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    m, v, s = result["meta"]["machine"], result["meta"]["versions"], result["settings"]
    d = result["drafter"]

    rel = common.repo_relative

    hist = result["overall"].get("acceptance_hist") or []
    return "\n".join([
        "## Step analysis (offline, reference torch loop)",
        "",
        "```bash",
        result["meta"]["command"],
        "```",
        "",
        f"* Date: {result['meta']['date']}. Machine: {m['nproc']} CPUs, {m['cpu_model']}, {m['ram_gib']} GiB"
        + (f", GPU {', '.join(m['gpu'])}" if m.get("gpu") else "") + f"; device `{s['device']}`, {s['dtype']}.",
        f"* Versions: torch {v['torch']}, transformers {v['transformers']}, sglang-dflash {v['sglang-dflash']} "
        f"(git {v['git_commit']}{', dirty' if v['git_dirty'] else ''}).",
        f"* Target `{rel(s['target'])}`, drafter `{rel(s['drafter'])}` (DFlash {'2' if d['version'] == 2 else 'v1'}, "
        f"block {d['block_size']}, K = {result['k']}); {s['prompts_per_workload']} prompts per workload "
        f"({', '.join(s['workloads'])}, chat template), {s['max_new_tokens']} greedy tokens each.",
        "* AL = accepted drafts + bonus per step (pooled) of the drafts the worker proposes (v1: argmax, "
        "DFlash 2: the selector's greedy walk). Other paths through the same candidates, scored against the "
        "target's greedy tokens: `argmax` = top-1 candidate at every slot, `viterbi` = "
        "highest-scoring lattice path, `oracle` = best path through the top-K candidates. a_j = accepted / "
        "reached at draft position j.",
        f"* Acceptance-length histogram (all prompts, AL = 1..{len(hist)}): {hist}.",
        "",
        table(result),
        "",
    ])


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target")
    p.add_argument("--drafter")
    p.add_argument("--workloads", default="math,code,chat")
    p.add_argument("--prompts", type=int, default=8, help="prompts per workload")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, help="top-K candidates (default: the drafter's selector_top_k, else 8)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--ctx-len", type=int, default=256, help="KV context length for the timing")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--tiny", action="store_true", help="2 prompts of one workload, 16 tokens, short timing")
    p.add_argument("--out", help=f"JSON path (default {os.path.relpath(DEFAULT_OUT, common.REPO)})")
    opts = p.parse_args(argv)
    if opts.tiny:
        opts.workloads, opts.prompts, opts.max_new_tokens = "math", 2, 16
        opts.ctx_len, opts.iters, opts.warmup = 32, 3, 1
    opts.workloads = opts.workloads.split(",")
    opts.out = os.path.abspath(opts.out or DEFAULT_OUT)
    if not opts.target or not opts.drafter:
        from sglang_dflash.demo import demo_pair

        target, drafter = demo_pair()
        opts.target, opts.drafter = opts.target or target, opts.drafter or drafter
    opts.target, opts.drafter = os.path.abspath(opts.target), os.path.abspath(opts.drafter)
    return opts


def run(opts, argv=None) -> dict:
    import torch

    dtype = getattr(torch, opts.dtype)
    tok, target, drafter, mask_id = load_pair(opts.target, opts.drafter, opts.device, dtype)
    cfg = drafter.cfg
    S = cfg.block_size - 1
    k = opts.k or (cfg.selector_top_k if cfg.selector_top_k > 0 else 8)
    prompts = chat_prompts(tok, opts.workloads, opts.prompts)
    t0 = time.monotonic()
    steps_by_w: dict[str, list] = {w: [] for w in opts.workloads}
    per_prompt = []
    for w, ids in prompts:
        g = generate(ids, target, drafter, mask_id, opts.max_new_tokens, k)
        steps_by_w[w] += g["steps"]
        a = analyse(g["steps"], S, cfg.has_selector)
        per_prompt.append({"workload": w, "prompt_tokens": len(ids), "steps": a["steps"],
                           "mean_acceptance_length": a.get("mean_acceptance_length")})
    all_steps = [s for w in opts.workloads for s in steps_by_w[w]]
    overall = analyse(all_steps, S, cfg.has_selector)
    paths = ["served", "argmax"] + (["viterbi"] if cfg.has_selector else []) + ["oracle"]
    result = {
        "meta": {"command": common.command_line("benchmark/step_analysis.py", argv),
                 "date": common.now_iso(), "machine": common.machine_info(),
                 "versions": common.versions()},
        "settings": {k_: getattr(opts, k_) for k_ in (
            "target", "drafter", "workloads", "max_new_tokens", "device", "dtype", "ctx_len", "iters")}
        | {"prompts_per_workload": opts.prompts},
        "drafter": {"version": cfg.version, "block_size": cfg.block_size, "layers": cfg.num_hidden_layers,
                    "target_layer_ids": list(cfg.target_layer_ids), "selector_top_k": cfg.selector_top_k,
                    "has_conv": cfg.has_conv, "has_selector": cfg.has_selector},
        "k": k,
        "paths": paths,
        "overall": overall,
        "by_workload": {w: analyse(steps_by_w[w], S, cfg.has_selector) for w in opts.workloads},
        "per_prompt": per_prompt,
        "generation_s": time.monotonic() - t0,
    }
    per_req = [p["mean_acceptance_length"] for p in per_prompt if p["mean_acceptance_length"]]
    result["overall"]["mean_acceptance_length_per_prompt"] = (
        sum(per_req) / len(per_req) if per_req else None)
    if not opts.no_timing:
        result["timing"] = time_step(target, drafter, mask_id, opts.ctx_len, opts.iters, opts.warmup)
    result["settings"]["iters"] = opts.iters
    return result


def main(argv=None) -> int:
    import torch

    opts = parse_args(argv)
    with torch.no_grad():  # scoped: tests run in the same process after this
        result = run(opts, argv)
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    common.write_json(opts.out, result)
    md_path = os.path.splitext(opts.out)[0] + ".md"
    with open(md_path, "w") as f:
        f.write(markdown(result))
    print(table(result))
    print(f"[steps] wrote {opts.out} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
