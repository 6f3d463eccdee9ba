"""The target's LM head as the drafter reads it, on one rank or over a vocabulary split.

Under tensor parallelism each rank holds one contiguous shard of the target's
LM head (SGLang's `ParallelLMHead` / tied `VocabParallelEmbedding`): rows for
global ids `start .. start + size - 1`, followed by padding rows that are no
token. The drafter is replicated, so every rank has the same hidden states;
the head's answers are global:

* argmax: each rank's best (value, global id), all-gathered; the first rank
  holding the maximum wins, which is the lowest global id among equal maxima,
  as `argmax` over the whole vocabulary returns.
* top-K: each rank's top-K over its shard, all-gathered as `[tp, bs, S, K]`,
  merged by `merge_shard_topk` (exact: every global top-K element is in its
  shard's top-K). O(tp * K) values per position move instead of O(V).

Every rank computes the merge from the same gathered tensors, so every rank
gets the same candidates (same ids in the same order), which is what keeps the
ranks' drafts, and with them their verify inputs, identical. One rank is the
special case `gather = None`. Imports torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_dflash.candidates import Candidates, head_logits, merge_shard_topk, transform_unary

# x [...] -> [tp, ...]: every rank's x, stacked in rank order (vocabulary order)
Gather = Callable[[torch.Tensor], torch.Tensor]

_CHUNK_BYTES = 32 << 20  # float32 draft logits alive at once (see VocabHead._reduce_rows)


@dataclass
class VocabHead:
    weight: torch.Tensor  # [rows >= size, H] this rank's head rows (padding rows past `size`)
    start: int  # global id of this rank's row 0
    size: int  # real token rows of this rank's shard
    vocab: int  # the target's vocabulary size: the last dim of its logits and of q
    gather: Optional[Gather] = None  # None on one rank

    def __post_init__(self) -> None:
        if self.weight.dim() != 2:
            raise ValueError(f"the LM head weight must be [V, H], got shape {tuple(self.weight.shape)}")
        if not 0 < self.size <= self.weight.shape[0]:
            raise ValueError(f"shard size {self.size} must be in [1, {self.weight.shape[0]}] "
                             "(the head's rows on this rank)")
        if not (0 <= self.start and self.start + self.size <= self.vocab):
            raise ValueError(f"shard [{self.start}, {self.start + self.size}) is outside the "
                             f"vocabulary [0, {self.vocab})")
        if self.gather is None and (self.start, self.size) != (0, self.vocab):
            raise ValueError("a head without a gather must hold the whole vocabulary")

    @classmethod
    def whole(cls, weight: torch.Tensor, vocab: int) -> VocabHead:
        """One rank: rows 0..vocab-1 of `weight` (rows past them are padding)."""
        return cls(weight, 0, vocab, vocab)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[bs, S, H] -> [bs, S, size] float32 logits over this rank's tokens."""
        if hidden.dim() != 3 or hidden.shape[2] != self.weight.shape[1]:
            raise ValueError(f"hidden must be [bs, S, H = {self.weight.shape[1]}] for an LM head "
                             f"of shape {tuple(self.weight.shape)}, got {tuple(hidden.shape)}")
        return head_logits(hidden, self.weight[: self.size])

    def _reduce_rows(self, hidden: torch.Tensor, reduce) -> tuple[torch.Tensor, torch.Tensor]:
        """reduce(logits [n, S, size]) -> (values, ids) over chunks of requests.

        Why chunks: the [bs, S, V] float32 logits are only reduced to K values,
        and for a 150k vocabulary at 48 requests x 7 drafted positions they
        are ~200 MB per step; a chunk holds at most `_CHUNK_BYTES` of them."""
        bs, slots = hidden.shape[:2]
        per_request = max(1, slots * self.size * 4)
        step = max(1, _CHUNK_BYTES // per_request)
        if step >= bs:
            return reduce(self.logits(hidden))
        parts = [reduce(self.logits(hidden[i:i + step])) for i in range(0, bs, step)]
        return torch.cat([v for v, _ in parts]), torch.cat([i for _, i in parts])

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[bs, S, H] -> [bs, S] int64 global argmax (lowest id among equal maxima)."""
        values, ids = self._reduce_rows(hidden, lambda logits: logits.max(dim=-1))
        if self.gather is None:
            return ids
        values, ids = self.gather(values), self.gather(ids + self.start)  # [tp, bs, S]
        first = values.argmax(dim=0, keepdim=True)  # the first rank holding the maximum
        return ids.gather(0, first).squeeze(0)

    def topk(self, hidden: torch.Tensor, k: int, *, output_multiplier: float = 1.0,
             softcap: Optional[float] = None) -> Candidates:
        """The K best tokens per position over the whole vocabulary, with their
        DFlash 2 unary scores (the transform is increasing: applied after the
        merge, it keeps the raw logits' order)."""
        if not 1 <= k <= self.vocab:
            raise ValueError(f"k={k} must be in [1, vocab = {self.vocab}]")
        if not output_multiplier > 0:  # zero or negative would flatten or reverse the order
            raise ValueError(f"output_multiplier={output_multiplier} must be positive")
        values, ids = self._reduce_rows(
            hidden, lambda logits: torch.topk(logits, min(k, self.size), dim=-1, largest=True, sorted=True))
        ids = ids.to(torch.int64)
        if self.gather is not None:
            if self.size < k:  # a short last shard: every rank must send [.., k]
                pad = k - self.size
                values = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
                ids = torch.nn.functional.pad(ids, (0, pad), value=-self.start)  # global id 0
            values, ids = merge_shard_topk(self.gather(values), self.gather(ids + self.start), k)
        return Candidates(ids=ids, unary=transform_unary(values, output_multiplier, softcap))
