#!/usr/bin/env python
"""The one prepared script for a lent GPU: kernel parity, graph replay, timings.

    python benchmark/gpu_check.py            # CUDA: the full check (~2-5 minutes on an H200)
    python benchmark/gpu_check.py --dry-run  # CPU: tiny sizes, CUDA-only parts skipped

Needs only torch (+ triton for the kernels); no sglang. Adds python/ to
sys.path itself. Writes gpu_check.json to $OUT (else ./gpu_check_out) and
prints a short table last. Exit status 1 if any parity check fails.

1. parity: each Triton kernel against its torch twin on the same device, on
   fresh random inputs (greedy/sampled rows, NaN/-inf rows, vocab 32 to 151,936),
   outputs poisoned first and checked fully written.
2. graph: drafter forward + candidates top-K + lattice + selector walk, captured
   in a CUDA graph, replayed on new inputs, equals eager (DFlash 1 and DFlash 2
   drafters with random weights at Qwen3-8B size).
3. timings (KERNEL-LEVEL, not end-to-end): CUDA-graph replays, CUDA events,
   median after warm-up, of the draft step (drafter + candidates + selector)
   against one target verify forward of B tokens and one decode token, for a
   Qwen3-8B-sized stack of random-weight dense layers with SDPA over a KV cache.
   The target here is a minimal torch stand-in (no paged KV, no FlashInfer, no
   sampling), and the drafter is the reference torch module (float32 attention
   math, float32 candidate logits): ratios are indicative, not SGLang numbers.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from sglang_dflash import ops, select  # noqa: E402
from sglang_dflash.config import DrafterConfig  # noqa: E402
from sglang_dflash.model import DFlashDrafter, RMSNorm, apply_rope, rope_cos_sin  # noqa: E402
from sglang_dflash.ops.rejection_ref import chain_rejection_sample_uniforms  # noqa: E402
from sglang_dflash.rejection import target_probs  # noqa: E402
from sglang_dflash.static_draft import DraftInputs, StaticDraftStep, paged_draft_body  # noqa: E402
from sglang_dflash.vocab_head import VocabHead  # noqa: E402

FULL = dict(hidden=4096, inter=12288, heads=32, kv_heads=8, head_dim=128, draft_layers=5,
            block=8, vocab=151_936, top_k=16, rank=256, conv_taps=2, conv_group=16,
            ctx_len=1024, target_layers=36, kv_len=1024, batches=(1, 8, 32), iters=30,
            warmup=3, parity_vocabs=(32, 1000, 151_936), parity_batches=(1, 8, 32, 256),
            rejection_batches=(1, 8, 32))
DRY = dict(hidden=64, inter=128, heads=4, kv_heads=2, head_dim=16, draft_layers=2,
           block=8, vocab=1000, top_k=16, rank=8, conv_taps=2, conv_group=16,
           ctx_len=32, target_layers=2, kv_len=32, batches=(1, 2), iters=2,
           warmup=1, parity_vocabs=(32, 1000), parity_batches=(1, 8), rejection_batches=(1, 8))
POISON = -9


# --------------------------------------------------------------------------
# Graph runner and timer (eager stand-ins on CPU for the dry run)
# --------------------------------------------------------------------------


class Captured:
    """fn() captured in a CUDA graph (CPU: re-run eagerly); `out` is updated by replay()."""

    def __init__(self, fn, device):
        self.fn, self.cuda = fn, device.type == "cuda"
        if not self.cuda:
            self.out = fn()
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()

    def replay(self):
        if self.cuda:
            self.graph.replay()
        else:
            for dst, src in zip(_flat(self.out), _flat(self.fn())):
                dst.copy_(src)


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "__dataclass_fields__"):
        out = [getattr(out, f) for f in out.__dataclass_fields__]
    return [t for item in out for t in _flat(item)]


def median_ms(step, device, iters, warmup):
    """Median wall time of step() in ms: CUDA events per call, or perf_counter on CPU."""
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


# --------------------------------------------------------------------------
# 1. Kernel parity
# --------------------------------------------------------------------------


def walk_inputs(gen, device, bs, slots, k, nonfinite):
    scores = torch.randn(bs, slots, k, k, generator=gen, device=device) * 3.0
    if nonfinite:
        scores[0, 0] = float("nan")  # a dead slot
        for value, share in ((float("inf"), 0.02), (float("nan"), 0.05), (float("-inf"), 0.3)):
            hit = torch.rand(scores.shape, generator=gen, device=device) < share
            scores = scores.masked_fill(hit, value)
    ids = torch.randint(151_936, (bs, slots, k), generator=gen, device=device)
    temps = torch.tensor([1e-7, 0.3, 1.0, 2.5, 0.7], device=device)[torch.arange(bs) % 5]
    greedy = torch.rand(bs, generator=gen, device=device) < 0.4
    return scores, ids, temps, greedy, torch.rand(bs, slots, generator=gen, device=device)


def chain_inputs(gen, device, bs, slots, vocab, k=16):
    logits = torch.randn(bs, slots + 1, vocab, generator=gen, device=device) * 2.0
    n = bs * (slots + 1)
    top_k = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, 8, 1 << 30)
    top_k.view(bs, slots + 1)[0] = 8  # the q = p row: p within the k candidates
    p = target_probs(logits.view(n, vocab), torch.full((n,), 0.8, device=device),
                     torch.full((n,), 0.95, device=device), top_k.long(),
                     torch.zeros(n, device=device)).view(bs, slots + 1, vocab)
    draft = logits[:, :slots] + torch.randn(bs, slots, vocab, generator=gen, device=device) * 0.5
    cand = torch.topk(draft, min(k, vocab), dim=-1).indices
    outside = torch.ones_like(draft, dtype=torch.bool).scatter_(-1, cand, False)
    q = torch.softmax(draft.masked_fill(outside, float("-inf")), dim=-1)
    q[0] = p[0, :slots]  # all accepted when u = 0: the bonus path
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(bs, slots)
    q_probs, q_ids = torch.topk(q, min(k, vocab), dim=-1)  # sparse, as the walk gives it
    accept_u = torch.rand(bs, slots, generator=gen, device=device)
    accept_u[0] = 0.0
    return drafts, q_ids, q_probs, p, accept_u, torch.rand(bs, slots + 1, generator=gen, device=device)


def parity_walk(gen, device, bs, nonfinite):
    from sglang_dflash.ops import walk_triton

    args = walk_inputs(gen, device, bs, 7, 16, nonfinite)
    tokens = torch.full((bs, 7), POISON, dtype=torch.int64, device=device)
    choice = torch.full_like(tokens, POISON)
    q = torch.full((bs, 7, 16), float("nan"), device=device)
    walk_triton.walk_into(*args, tokens, choice, q)
    want = select.walk(*args)
    written = bool((tokens != POISON).all() & (choice >= 0).all() & ~q.isnan().any())
    mismatches = int((choice != want.choice).sum() + (tokens != want.tokens).sum())
    q_err = float((q - want.q).abs().nan_to_num(float("inf")).max())
    ok = written and mismatches == 0 and q_err <= 1e-6
    return dict(check=f"walk bs={bs} K=16 S=7{' nonfinite' if nonfinite else ''}", ok=ok,
                written=written, mismatches=mismatches, q_max_err=q_err)


def parity_rejection(gen, device, bs, vocab):
    from sglang_dflash.ops import rejection_triton

    args = chain_inputs(gen, device, bs, 7, vocab)
    accept_len = torch.full((bs,), POISON, dtype=torch.int64, device=device)
    tokens = torch.full((bs, 8), POISON, dtype=torch.int64, device=device)
    rejection_triton.chain_rejection_into(*args, accept_len, tokens)
    want = chain_rejection_sample_uniforms(*args)
    written = bool((accept_len != POISON).all() & (tokens != POISON).all())
    len_mismatch = int((accept_len != want.accept_len).sum())
    tok_mismatch = int((tokens != want.tokens).any(dim=1).sum())
    ok = written and len_mismatch == 0 and tok_mismatch == 0
    return dict(check=f"rejection bs={bs} V={vocab} S=7", ok=ok, written=written,
                accept_len_mismatches=len_mismatch, token_row_mismatches=tok_mismatch,
                mean_accept_len=float(want.accept_len.float().mean()))


def run_parity(sizes, device, seed):
    if device.type != "cuda" and not _interpreting():
        return [dict(check="kernel parity", ok=True,
                     skipped="needs CUDA, or TRITON_INTERPRET=1 with --dry-run")]
    gen = torch.Generator(device=device).manual_seed(seed)
    results = [parity_walk(gen, device, bs, nf) for bs in sizes["parity_batches"]
               for nf in (False, True)]
    results += [parity_rejection(gen, device, bs, vocab) for vocab in sizes["parity_vocabs"]
                for bs in sizes["rejection_batches"]]
    return results


# --------------------------------------------------------------------------
# 2. Drafter + candidates + selector: graph replay equals eager
# --------------------------------------------------------------------------


def drafter_config(sizes, version):
    v2 = version == 2
    return DrafterConfig(
        version=version, hidden_size=sizes["hidden"], intermediate_size=sizes["inter"],
        num_hidden_layers=sizes["draft_layers"], num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"], head_dim=sizes["head_dim"], rms_norm_eps=1e-6,
        rope_theta=1e6, max_position_embeddings=40960, vocab_size=sizes["vocab"],
        block_size=sizes["block"], target_layer_ids=(1,), mask_token_id=0,
        conv_kernel_size=sizes["conv_taps"] if v2 else 0,
        conv_group_size=sizes["conv_group"] if v2 else 0,
        selector_rank=sizes["rank"] if v2 else 0, selector_top_k=sizes["top_k"] if v2 else 0)


def build_drafter(cfg, device, dtype):
    with torch.device(device), _default_dtype(dtype):
        model = DFlashDrafter(cfg).eval().requires_grad_(False)
    for name, param in model.named_parameters():
        if "kernel_projection" in name:  # zero at init (identity conv): make it do work
            nn.init.normal_(param, std=0.02)
    return model


class _default_dtype:
    """Build weights directly in `dtype` (no float32 copy of 15 GB of layers first)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved)


class DraftStep:
    """Static inputs of one draft step and the step itself (drafter -> candidates -> walk)."""

    def __init__(self, model, lm_head, bs, sizes, device, gen):
        self.model, self.lm_head, cfg = model, lm_head, model.cfg
        block, ctx, dtype = sizes["block"], sizes["ctx_len"], lm_head.dtype
        self.top_k = cfg.selector_top_k or 1  # DFlash 1: the argmax draft
        self.embeds = torch.randn(bs, block, cfg.hidden_size, generator=gen, device=device,
                                  dtype=torch.float32).to(dtype)
        self.positions = ctx + torch.arange(block, device=device).expand(bs, block)
        kv_shape = (cfg.num_hidden_layers, bs, ctx, cfg.num_key_value_heads, cfg.head_dim)
        self.ctx_k = torch.randn(kv_shape, generator=gen, device=device).to(dtype)
        self.ctx_v = torch.randn(kv_shape, generator=gen, device=device).to(dtype)
        lengths = torch.randint(ctx // 2, ctx + 1, (bs,), generator=gen, device=device)
        self.ctx_valid = torch.arange(ctx, device=device) < lengths.unsqueeze(1)
        self.anchor = torch.randint(cfg.vocab_size, (bs,), generator=gen, device=device)
        self.temperature = torch.full((bs,), 0.7, device=device)
        self.greedy = torch.arange(bs, device=device) % 2 == 0  # mixed rows
        self.uniforms = torch.rand(bs, block - 1, generator=gen, device=device)

    def refill(self, gen):
        """New values in the static inputs (same buffers)."""
        for t in (self.embeds, self.ctx_k, self.ctx_v):
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device))
        self.uniforms.copy_(torch.rand(self.uniforms.shape, generator=gen,
                                       device=self.uniforms.device))

    def hidden(self):
        return self.model.forward_block(self.embeds, self.positions, self.ctx_k, self.ctx_v,
                                        self.ctx_valid)[:, 1:]  # the drafted slots

    def candidates(self, h):
        return VocabHead.whole(self.lm_head, self.lm_head.shape[0]).topk(h, self.top_k)

    def select(self, h, cands):
        sel = self.model.candidate_selector
        if sel is None:
            return cands.ids[..., 0], None
        scores = select.lattice_scores(cands, h, self.anchor, sel.predecessor_codebook,
                                       sel.successor_codebook, sel.hidden_projection.weight)
        path = ops.selector_walk(scores, cands.ids, self.temperature, self.greedy, self.uniforms)
        return path.tokens, path.q

    def __call__(self):
        h = self.hidden()
        cands = self.candidates(h)
        tokens, q = self.select(h, cands)
        return (h, cands.ids, tokens) + ((q,) if q is not None else ())


def check_graph(step, device, gen, label):
    """Capture the whole step, refill the inputs, replay; compare with eager."""
    with torch.inference_mode():
        runner = Captured(step, device)
        diffs = []
        for _ in range(2):
            step.refill(gen)
            runner.replay()
            eager = step()
            got = [t.clone() for t in runner.out]
            diffs.append([_diff(a, b) for a, b in zip(got, eager)])
    h_err = max(d[0] for d in diffs)
    ids_equal = all(d[1] == 0 for d in diffs)
    tokens_equal = all(d[2] == 0 for d in diffs)
    q_err = max((d[3] for d in diffs if len(d) > 3), default=0.0)
    ok = ids_equal and tokens_equal and q_err <= 1e-6 and h_err <= 1e-2
    del runner
    return dict(check=f"graph replay == eager: {label}", ok=ok, hidden_max_abs_diff=h_err,
                cand_ids_equal=ids_equal, tokens_equal=tokens_equal, q_max_err=q_err)


def check_static_step(model, lm_head, sizes, device, gen, label):
    """The serving worker's static draft step (static_draft.py: paged context,
    per-bucket buffers) captured for buckets 1 / 4 / 8 (CPU: eager), then
    batches of 3, 8, 1 and 5 requests (ragged contexts, mixed greedy rows)
    replayed and compared with the same body run eagerly on the unpadded batch."""
    cfg, block, ctx = model.cfg, sizes["block"], sizes["ctx_len"]
    rows, slots = 8, 8 * (ctx + block)
    shape = (cfg.num_hidden_layers, slots + 1, cfg.num_key_value_heads, cfg.head_dim)
    k = torch.randn(shape, generator=gen, device=device).to(lm_head.dtype)
    v = torch.randn(shape, generator=gen, device=device).to(lm_head.dtype)
    req_to_token = torch.randperm(slots, generator=gen, device=device).view(rows, -1).to(torch.int32)
    table = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen, device=device).to(lm_head.dtype)
    head = VocabHead.whole(lm_head, cfg.vocab_size)
    body = paged_draft_body(model, head, lambda ids: table[ids], k, v, req_to_token,
                            cfg.mask_token_id or 0, block)
    step = StaticDraftStep(body, [1, 4, 8], block - 1, device)
    token_errs, q_errs = [], []
    with torch.inference_mode():
        if device.type == "cuda":
            step.capture()
        for bs in (3, 8, 1, 5):
            greedy = torch.rand(bs, generator=gen, device=device) < 0.5
            x = DraftInputs(
                anchor=torch.randint(cfg.vocab_size, (bs,), generator=gen, device=device),
                prefix=torch.randint(0, ctx + 1, (bs,), generator=gen, device=device),
                pool_index=torch.randperm(rows, generator=gen, device=device)[:bs],
                temperature=torch.where(greedy, 1.0, 0.7).float(), greedy=greedy,
                uniforms=torch.rand(bs, block - 1, generator=gen, device=device))
            got, want = step.run(x), body(x)
            token_errs.append(_diff(got.drafts, want.drafts))
            if want.q_probs is not None:
                q_errs.append(_diff(got.q_probs, want.q_probs))
    ok = max(token_errs) == 0 and max(q_errs, default=0.0) <= 1e-5
    return dict(check=f"static draft step (buckets 1/4/8{', captured' if device.type == 'cuda' else ''}) "
                      f"== eager: {label}", ok=ok, tokens_differing=max(token_errs),
                q_max_err=max(q_errs, default=0.0))


def _diff(a, b):
    if a.dtype in (torch.int64, torch.int32):
        return int((a != b).sum())
    return float((a.float() - b.float()).abs().max())


# --------------------------------------------------------------------------
# 3. Target stand-in: a Qwen3-style dense stack with SDPA over a KV cache
# --------------------------------------------------------------------------


class TargetLayer(nn.Module):
    """Minimal Qwen3 decoder layer (pre-norm, GQA, q/k norm, RoPE, SwiGLU)."""

    def __init__(self, s):
        super().__init__()
        self.nh, self.nkv, self.d = s["heads"], s["kv_heads"], s["head_dim"]
        self.norm1, self.norm2 = RMSNorm(s["hidden"], 1e-6), RMSNorm(s["hidden"], 1e-6)
        self.qkv = nn.Linear(s["hidden"], (self.nh + 2 * self.nkv) * self.d, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.d, 1e-6), RMSNorm(self.d, 1e-6)
        self.o = nn.Linear(self.nh * self.d, s["hidden"], bias=False)
        self.gate_up = nn.Linear(s["hidden"], 2 * s["inter"], bias=False)
        self.down = nn.Linear(s["inter"], s["hidden"], bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, start, mask):
        """x [bs, T, H]; k/v_cache [bs, nkv, start + T, d] (rows start.. rewritten)."""
        bs, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.nh * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q = apply_rope(self.q_norm(q.unflatten(-1, (self.nh, self.d))), cos, sin)
        k = apply_rope(self.k_norm(k.unflatten(-1, (self.nkv, self.d))), cos, sin)
        k_cache[:, :, start:start + t] = k.transpose(1, 2)
        v_cache[:, :, start:start + t] = v.unflatten(-1, (self.nkv, self.d)).transpose(1, 2)
        group = self.nh // self.nkv
        # GQA without copies: the `group` query heads of a kv head become query rows.
        qg = q.view(bs, t, self.nkv, group, self.d).permute(0, 2, 3, 1, 4).reshape(
            bs, self.nkv, group * t, self.d)
        out = F.scaled_dot_product_attention(qg, k_cache, v_cache, attn_mask=mask)
        out = out.view(bs, self.nkv, group, t, self.d).permute(0, 3, 1, 2, 4).reshape(bs, t, -1)
        x = x + self.o(out)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TargetForward:
    """One target forward of T new tokens per request over a kv_len-token cache."""

    def __init__(self, layers, norm, lm_head, bs, t, sizes, device, gen):
        self.layers, self.norm, self.lm_head, self.t = layers, norm, lm_head, t
        self.start = sizes["kv_len"]
        dtype = lm_head.dtype
        shape = (bs, sizes["kv_heads"], self.start + t, sizes["head_dim"])
        self.caches = [(torch.randn(shape, generator=gen, device=device).to(dtype),
                        torch.randn(shape, generator=gen, device=device).to(dtype))
                       for _ in layers]
        self.x = torch.randn(bs, t, sizes["hidden"], generator=gen, device=device).to(dtype)
        positions = self.start + torch.arange(t, device=device).expand(bs, t)
        self.cos, self.sin = rope_cos_sin(positions, sizes["head_dim"], 1e6)
        group = sizes["heads"] // sizes["kv_heads"]
        cols = torch.arange(self.start + t, device=device)
        rows = torch.arange(t, device=device).repeat(group)  # query row -> block offset
        self.mask = None if t == 1 else (cols.unsqueeze(0) <= self.start + rows.unsqueeze(1))

    def __call__(self):
        x = self.x
        for layer, (k, v) in zip(self.layers, self.caches):
            x = layer(x, self.cos, self.sin, k, v, self.start, self.mask)
        return self.norm(x) @ self.lm_head.t()  # [bs, T, V] logits


def build_target(sizes, device, dtype):
    with torch.device(device), _default_dtype(dtype):
        layers = nn.ModuleList(TargetLayer(sizes) for _ in range(sizes["target_layers"]))
        norm = RMSNorm(sizes["hidden"], 1e-6)
        lm_head = torch.randn(sizes["vocab"], sizes["hidden"]) * sizes["hidden"] ** -0.5
    return layers.eval().requires_grad_(False), norm.requires_grad_(False), lm_head


def time_captured(fn, device, sizes):
    with torch.inference_mode():
        runner = Captured(fn, device)
        ms = median_ms(runner.replay, device, sizes["iters"], sizes["warmup"])
    del runner
    return ms


def run_timings(sizes, device, drafters, target, gen):
    layers, norm, lm_head = target
    rows = []
    for bs in sizes["batches"]:
        verify = time_captured(TargetForward(layers, norm, lm_head, bs, sizes["block"], sizes,
                                             device, gen), device, sizes)
        decode = time_captured(TargetForward(layers, norm, lm_head, bs, 1, sizes, device, gen),
                               device, sizes)
        for name, model in drafters.items():
            step = DraftStep(model, lm_head, bs, sizes, device, gen)
            h = step.hidden()
            stages = dict(draft_step=step, drafter=step.hidden,
                          candidates=lambda s=step, h=h: s.candidates(h),
                          # what-if, not used by the step: bf16 logits instead of the
                          # float32 upcast of the head that candidates.py does
                          candidates_bf16=lambda h=h, k=step.top_k: torch.topk(
                              (h @ lm_head.t()).float(), k, dim=-1))
            if model.candidate_selector is not None:
                cands = step.candidates(h)
                stages["lattice_walk"] = lambda s=step, h=h, c=cands: s.select(h, c)
            ms = {k: time_captured(fn, device, sizes) for k, fn in stages.items()}
            rows.append(dict(drafter=name, bs=bs, **{f"{k}_ms": v for k, v in ms.items()},
                             verify_ms=verify, decode_ms=decode,
                             draft_over_verify=ms["draft_step"] / verify,
                             draft_over_decode=ms["draft_step"] / decode,
                             break_even_commit_len=(ms["draft_step"] + verify) / decode))
    return rows


def run_kernel_timings(sizes, device, gen):
    """The two kernels against their twins, each captured alone."""
    if device.type != "cuda" and not _interpreting():
        return []
    from sglang_dflash.ops import rejection_triton, walk_triton

    rows = []
    for bs in sizes["batches"]:
        walk_args = walk_inputs(gen, device, bs, 7, 16, False)
        chain_args = chain_inputs(gen, device, bs, 7, sizes["vocab"])
        pairs = dict(walk=(walk_triton.walk, select.walk, walk_args),
                     rejection=(rejection_triton.chain_rejection_sample_uniforms,
                                chain_rejection_sample_uniforms, chain_args))
        for name, (kernel, twin, args) in pairs.items():
            rows.append(dict(op=name, bs=bs,
                             triton_ms=time_captured(lambda f=kernel, a=args: f(*a), device, sizes),
                             torch_ms=time_captured(lambda f=twin, a=args: f(*a), device, sizes)))
    return rows


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: use --dry-run")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    started = time.time()
    gen = torch.Generator(device=device).manual_seed(1234)
    seed = int(time.time())  # fresh parity inputs every run; recorded to reproduce
    report = dict(env=_env(device), parity_seed=seed, errors=[], parity=[], graph=[],
                  kernel_timings=[], timings=[],
                  sizes={k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()})
    os.makedirs(args.out, exist_ok=True)

    def section(key, fn):
        """Run one part; a crash is recorded and the next part still runs (one lease, one try)."""
        try:
            report[key] = fn()
        except Exception:  # the harness reports every failure; it never hides one
            report["errors"].append(f"{key}: {traceback.format_exc()}")
            print(report["errors"][-1], file=sys.stderr, flush=True)
        _log(f"{key} done ({time.time() - started:.0f}s)")
        report["elapsed_s"] = time.time() - started
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(report, f, indent=1)

    section("parity", lambda: run_parity(sizes, device, seed))
    target = build_target(sizes, device, dtype)
    drafters = {f"dflash{v}-{sizes['draft_layers']}L": build_drafter(drafter_config(sizes, v),
                                                                     device, dtype)
                for v in (1, 2)}
    section("graph", lambda: [check_graph(DraftStep(m, target[2], 8, sizes, device, gen), device,
                                          gen, f"{name} bs=8") for name, m in drafters.items()]
            + [check_static_step(m, target[2], sizes, device, gen, name) for name, m in drafters.items()])
    section("kernel_timings", lambda: run_kernel_timings(sizes, device, gen))
    section("timings", lambda: run_timings(sizes, device, drafters, target, gen))
    ok = not report["errors"] and all(r["ok"] for r in report["parity"] + report["graph"])
    _print_tables(report, ok)
    return 0 if ok else 1


def _env(device):
    env = dict(torch=torch.__version__, python=platform.python_version(), device=str(device),
               backend=ops.backend(device))
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def _interpreting():
    """The Triton interpreter runs the kernels on CPU tensors (dry run only)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _ms(value):
    return "-" if value is None else f"{value:.3f}"


def _log(message):
    print(f"[gpu_check] {message}", flush=True)


def _print_tables(report, ok):
    print("\n== parity / graph")
    for r in report["parity"] + report["graph"]:
        extra = {k: v for k, v in r.items() if k not in ("check", "ok")}
        print(f"  {'PASS' if r['ok'] else 'FAIL'}  {r['check']}  {extra}")
    if report["kernel_timings"]:
        print("\n== kernels, ms (graph replay median)\n  op         bs   triton    torch")
        for r in report["kernel_timings"]:
            print(f"  {r['op']:<9} {r['bs']:>3} {r['triton_ms']:>8.3f} {r['torch_ms']:>8.3f}")
    print("\n== KERNEL-LEVEL timings, ms (graph replay median; random weights; not end-to-end)")
    print("  drafter       bs   draft  (drafter  cands  walk) cands-bf16  verify  decode  "
          "d/verify  d/decode  break-even")
    for r in report["timings"]:
        print(f"  {r['drafter']:<12} {r['bs']:>3} {r['draft_step_ms']:>7.3f} "
              f"({r['drafter_ms']:>7.3f} {r['candidates_ms']:>6.3f} "
              f"{_ms(r.get('lattice_walk_ms')):>5}) {r['candidates_bf16_ms']:>10.3f} "
              f"{r['verify_ms']:>7.3f} "
              f"{r['decode_ms']:>7.3f} {r['draft_over_verify']:>9.3f} "
              f"{r['draft_over_decode']:>9.3f} {r['break_even_commit_len']:>10.2f}")
    for error in report["errors"]:
        print(f"\nERROR in {error.splitlines()[0]} ... {error.strip().splitlines()[-1]}")
    env = report["env"]
    print(f"\n{'ALL CHECKS PASS' if ok else 'SOME CHECKS FAIL'}; {env.get('gpu', env['device'])}, "
          f"torch {env['torch']}, triton {env['triton']}, backend {env['backend']}, "
          f"{report['elapsed_s']:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
