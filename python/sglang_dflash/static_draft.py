"""The draft step on static buffers, one set per batch-size bucket: the form a
CUDA graph captures.

A captured graph replays fixed kernels on fixed addresses with fixed shapes.
So a step's inputs are copied into the buffers of the smallest bucket that
holds the batch, the rows past the batch are set to a harmless request
(context length 0, token 0, greedy: it attends only to its own block and its
drafts are never read), and the body (block, drafter pass with its context
read in place, head, selector walk) runs on those buffers alone: no host
reads, no shape or branch that depends on the data, the walk's random draws
pre-drawn by the caller. The outputs are the first bs rows of the bucket's.

On CUDA `capture()` records each bucket's body once and `run` replays it;
elsewhere `run` calls the body eagerly on the same buffers, which is what the
CPU tests exercise. A batch larger than the largest bucket is not served here
(`run` returns None and the caller drafts dynamically), as SGLang's own graph
runners fall back to eager above their largest captured batch.

Imports torch and this package's algorithm modules only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields
from typing import Callable, Optional

import torch

from sglang_dflash.draft import make_blocks
from sglang_dflash.model import PagedContext
from sglang_dflash.propose import Proposal, propose
from sglang_dflash.vocab_head import VocabHead


@dataclass
class DraftInputs:
    """What one draft step reads, per request."""

    anchor: torch.Tensor  # [bs] int64 the verified token before the block
    prefix: torch.Tensor  # [bs] int64 committed tokens (the anchor's position)
    pool_index: torch.Tensor  # [bs] int64 the request's row of the slot table
    temperature: torch.Tensor  # [bs] float32 (1.0 for greedy rows)
    greedy: torch.Tensor  # [bs] bool
    uniforms: torch.Tensor  # [bs, S] float32 the selector walk's draws

    @property
    def bs(self) -> int:
        return self.anchor.shape[0]


# The padding request: token 0 at position 0 with no context, greedy.
_PAD = {"anchor": 0, "prefix": 0, "pool_index": 0, "temperature": 1.0, "greedy": True, "uniforms": 0.5}

Body = Callable[[DraftInputs], Proposal]


def paged_draft_body(drafter, head: VocabHead, embed: Callable[[torch.Tensor], torch.Tensor],
                     k: torch.Tensor, v: torch.Tensor, req_to_token: torch.Tensor,
                     mask_token_id: int, block_size: int) -> Body:
    """The draft step as a function of its inputs alone: the drafter reads its
    context in place from the cache k / v [num_layers, slots, kv_heads, head_dim]
    through the slot table req_to_token [R, T] (all fixed tensors). The walk is
    the general one (greedy rows handled per row: a graph cannot branch on the
    host's knowledge that a batch is all greedy) unless the caller, drafting
    eagerly, passes all_greedy=True for the fast all-greedy walk."""

    def body(x: DraftInputs, all_greedy: bool = False) -> Proposal:
        block = make_blocks(x.anchor, x.prefix, mask_token_id, block_size)
        context = PagedContext(k, v, req_to_token, x.pool_index, x.prefix)
        hidden = drafter.forward_block_paged(embed(block.token_ids), block.positions, context)[:, 1:]
        return propose(drafter, hidden, x.anchor, head, x.temperature, x.greedy, x.uniforms,
                       all_greedy=all_greedy)

    return body


class _Bucket:
    """The static inputs of one batch size, and its graph once captured."""

    def __init__(self, size: int, num_slots: int, device) -> None:
        def buf(dtype, *shape):
            return torch.empty((size, *shape), dtype=dtype, device=device)

        self.inputs = DraftInputs(anchor=buf(torch.int64), prefix=buf(torch.int64),
                                  pool_index=buf(torch.int64), temperature=buf(torch.float32),
                                  greedy=buf(torch.bool), uniforms=buf(torch.float32, num_slots))
        self.pad_from(0)
        self.graph = None  # torch.cuda.CUDAGraph once captured
        self.outputs: Optional[Proposal] = None  # the graph's output tensors

    def pad_from(self, row: int) -> None:
        for f in fields(DraftInputs):
            getattr(self.inputs, f.name)[row:].fill_(_PAD[f.name])

    def load(self, x: DraftInputs) -> None:
        """x's rows first, the padding request after them (re-set every step:
        a larger batch before this one left real requests there, whose long
        contexts the kernel would read for nothing)."""
        for f in fields(DraftInputs):
            getattr(self.inputs, f.name)[: x.bs].copy_(getattr(x, f.name))
        self.pad_from(x.bs)


class StaticDraftStep:
    """`body` over static buffers of each bucket size; see the module docstring."""

    def __init__(self, body: Body, buckets, num_slots: int, device) -> None:
        sizes = sorted(set(int(b) for b in buckets))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"buckets must be positive batch sizes, got {list(buckets)}")
        self.body = body
        self.sizes = sizes
        self._buckets = {n: _Bucket(n, num_slots, device) for n in sizes}
        self.steps = 0  # draft steps served here (host counter, for the server's state)

    @property
    def captured(self) -> bool:
        return all(b.graph is not None for b in self._buckets.values())

    def snapshot(self) -> dict:
        return {"buckets": list(self.sizes), "captured": self.captured, "steps": self.steps}

    def bucket_size(self, bs: int) -> Optional[int]:
        """The smallest bucket >= bs, None above the largest."""
        i = bisect.bisect_left(self.sizes, bs)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, x: DraftInputs) -> Optional[Proposal]:
        """The body's proposal for x's bs requests, or None when bs exceeds the
        largest bucket. The returned tensors are views of the bucket's outputs
        (a captured graph overwrites them at its next replay)."""
        size = self.bucket_size(x.bs)
        if size is None:
            return None
        bucket = self._buckets[size]
        self.steps += 1
        bucket.load(x)
        if bucket.graph is None:
            out = self.body(bucket.inputs)
        else:
            bucket.graph.replay()
            out = bucket.outputs
        return out.rows(x.bs)

    def capture(self, warmup: int = 2) -> None:
        """Record every bucket's body in a CUDA graph (largest first, sharing
        one memory pool). Each bucket runs `warmup` times on a side stream
        first, as torch's graph capture requires (Triton compiles there)."""
        pool = None
        for size in reversed(self.sizes):
            bucket = self._buckets[size]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    self.body(bucket.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                bucket.outputs = self.body(bucket.inputs)
            bucket.graph = graph
            pool = graph.pool()
        torch.cuda.synchronize()


def default_buckets(max_bs: int, configured=None) -> list[int]:
    """Batch-size buckets for at most max_bs requests. With SGLang's decode
    graph sizes (`configured`, already cut at --cuda-graph-max-bs): those up to
    max_bs, plus max_bs itself when some configured size exceeds it (as SGLang's
    graph runner does). Without: 1, 2, 4, 8, multiples of 8 up to 32 and of 16
    beyond, and max_bs."""
    if configured:
        sizes = {int(b) for b in configured if 0 < int(b) <= max_bs}
        if any(int(b) > max_bs for b in configured):
            sizes.add(max_bs)
        return sorted(sizes)
    sizes = {1, 2, 4} | set(range(8, 33, 8)) | set(range(48, max_bs + 1, 16))
    return sorted({b for b in sizes if b <= max_bs} | {max_bs})
