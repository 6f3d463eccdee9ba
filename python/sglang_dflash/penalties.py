"""Sampling penalties at every verified position, as plain decoding applies them.

Plain decoding penalizes the logits of step t with counts of the tokens
generated before t: frequency (minus f per occurrence), presence (minus p once
a token occurred), repetition (logit / r if positive, * r if negative, once a
token occurred) and min_new_tokens (stop tokens at -inf while fewer than
min_new_tokens tokens were generated). In a verify block, row k predicts the
token after drafts d_1..d_k, so its counts are the committed ones plus
d_1..d_k: the rows differ, and applying the block-start counts to every row
(what a per-step penalty would do) changes the output.

`OutputCounts` keeps, per request slot, the committed output tokens' counts
and their number (the anchor included); `apply_block_penalties` penalizes the
rows of a block in place, additive penalties first, then the repetition
scaling (the order SGLang's source lists them in, which the plugin makes the
order SGLang applies them in: adapter/penalty_order.py). Only scatter /
gather / where: no host sync, and no [bs, rows, V] temporaries beyond the
logits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PenaltyParams:
    """Per-request penalty settings of one step (rows in batch order)."""

    frequency: torch.Tensor  # [bs] float32, 0 = off
    presence: torch.Tensor  # [bs] float32, 0 = off
    repetition: torch.Tensor  # [bs] float32, 1 = off
    min_new_tokens: torch.Tensor  # [bs] int64, 0 = off
    stop_mask: torch.Tensor | None  # [bs, V] bool: stop tokens (EOS, stop ids); None if no min_new_tokens


class OutputCounts:
    """Committed output tokens per request slot: counts [rows, V] and lengths [rows].

    Requests are named by SGLang's request pool slot (`req_pool_indices`), which
    a request keeps while it runs; a new request's prefill resets its slot. A
    slot gets a row of its own the first time it is reset, and keeps it: the
    pool hands out slots last-freed-first, so the rows in use follow the peak
    number of running requests, not the pool's size (thousands of slots when
    `--max-running-requests` is left to SGLang; a row is 4 bytes a vocabulary
    entry). Slots never reset share row 0, a scratch row that is written but
    never read: only reset requests are penalized."""

    def __init__(self, num_slots: int, vocab_size: int, device, capacity: int = 16) -> None:
        self.vocab_size = vocab_size
        self.row_of = torch.zeros(num_slots, dtype=torch.int64, device=device)  # slot -> row
        self._rows: dict[int, int] = {}  # host copy of row_of's assigned entries
        self.counts = torch.zeros((max(capacity, 2), vocab_size), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(max(capacity, 2), dtype=torch.int64, device=device)

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(counts [n, V], lengths [n]) of slots [n] (copies)."""
        rows = self.row_of[slots]
        return self.counts[rows], self.lengths[rows]

    def reset(self, slots: torch.Tensor, tokens: list[list[int]]) -> None:
        """Rows of `slots` [n] start over with the output tokens `tokens[i]` (host lists)."""
        host_slots = slots.tolist()
        self._assign(host_slots)
        rows = self.row_of[slots]
        self.counts[rows] = 0.0
        self.lengths[rows] = torch.tensor([len(t) for t in tokens], dtype=torch.int64, device=self.lengths.device)
        for slot, toks in zip(host_slots, tokens):
            if toks:
                index = torch.tensor(toks, dtype=torch.int64, device=self.counts.device)
                self.counts[self._rows[slot]].scatter_add_(0, index, torch.ones_like(index, dtype=torch.float32))

    def add(self, slots: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor) -> None:
        """Count tokens [n, m] where keep [n, m] (committed ones) into the rows of slots [n]."""
        rows = self.row_of[slots]
        counts = self.counts[rows]  # [n, V] copy
        index = torch.where(keep, tokens.long(), 0)  # padding may lie outside the vocabulary
        counts.scatter_add_(1, index, keep.to(counts.dtype))
        self.counts[rows] = counts
        self.lengths[rows] += keep.sum(dim=1)

    def _assign(self, slots: list[int]) -> None:
        new = [s for s in dict.fromkeys(slots) if s not in self._rows]
        if not new:
            return
        first = len(self._rows) + 1  # row 0 is the scratch row
        needed = first + len(new)
        if needed > self.counts.shape[0]:
            grown = max(needed, 2 * self.counts.shape[0])
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grown - self.counts.shape[0], self.vocab_size)])
            self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(grown - self.lengths.shape[0])])
        for i, slot in enumerate(new):
            self._rows[slot] = first + i
        self.row_of[torch.tensor(new, device=self.row_of.device)] = torch.arange(
            first, needed, device=self.row_of.device)


def _first_occurrence(drafts: torch.Tensor) -> torch.Tensor:
    """[bs, S] int64: index of the first draft equal to each draft (itself if first)."""
    num = drafts.shape[1]
    if num == 0:  # a one-row verify (speculation off): no drafts to look back on
        return drafts
    same = drafts.unsqueeze(2) == drafts.unsqueeze(1)  # [bs, S, S]: d_j == d_i
    earlier = torch.ones(num, num, dtype=torch.bool, device=drafts.device).tril()  # i <= j
    idx = torch.arange(num, device=drafts.device).expand(num, num)
    candidates = torch.where(same & earlier, idx, num)
    return candidates.min(dim=2).values


def apply_block_penalties(logits: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor,
                          lengths: torch.Tensor, params: PenaltyParams) -> None:
    """Penalize verify logits in place.

    Args:
        logits: [bs, R, V] rows 0..R-1 of the block (row k follows drafts 1..k).
        drafts: [bs, R-1] int64 drafts d_1..d_{R-1}.
        counts: [bs, V] committed output token counts (anchor included).
        lengths: [bs] committed output lengths (anchor included).
    """
    bs, num_rows, vocab = logits.shape
    num = num_rows - 1
    dev = logits.device
    k = torch.arange(num_rows, device=dev).view(1, num_rows, 1)  # row
    j = torch.arange(1, num + 1, device=dev).view(1, 1, num)  # draft index (1-based)
    reached = (k >= j).expand(bs, num_rows, num)  # [bs, R, S]: d_j precedes row k
    index = drafts.long().view(bs, 1, num).expand(bs, num_rows, num)
    base_seen = counts > 0  # [bs, V]
    seen_draft = base_seen.gather(1, drafts.long()).view(bs, 1, num)  # d_j already counted
    first = (_first_occurrence(drafts.long()) + 1).view(bs, 1, num)  # 1-based first position
    new = reached & (first == j) & ~seen_draft  # d_j occurs for the first time at or before k

    additive = -params.frequency.view(bs, 1, 1) * counts.view(bs, 1, vocab)
    additive = additive - params.presence.view(bs, 1, 1) * base_seen.view(bs, 1, vocab)
    logits.add_(additive)
    src = -params.frequency.view(bs, 1, 1) * reached - params.presence.view(bs, 1, 1) * new
    logits.scatter_add_(2, index, src.to(logits.dtype))
    if params.stop_mask is not None:
        short = (lengths.view(bs, 1) + k.view(1, num_rows)) < params.min_new_tokens.view(bs, 1)
        block = short.unsqueeze(2) & params.stop_mask.view(bs, 1, vocab)
        logits.add_(torch.where(block, float("-inf"), 0.0).to(logits.dtype))
    _apply_repetition(logits, index, first, seen_draft, base_seen, params.repetition)


def _apply_repetition(logits, index, first, seen_draft, base_seen, penalty) -> None:
    """The multiplicative repetition penalty: committed tokens on every row, and a
    draft's token from the first row after its first occurrence (every entry of
    a token in a row writes the same value, so the scatter has no conflicts)."""
    bs = logits.shape[0]
    r = penalty.view(bs, 1, 1).to(logits.dtype)
    scaled = torch.where(logits < 0, logits * r, logits / r)
    logits.copy_(torch.where(base_seen.unsqueeze(1), scaled, logits))
    k = torch.arange(logits.shape[1], device=logits.device).view(1, -1, 1)
    apply = (k >= first) & ~seen_draft  # [bs, R, S]: the token has occurred by row k
    values = logits.gather(2, index)
    values = torch.where(apply, torch.where(values < 0, values * r, values / r), values)
    logits.scatter_(2, index, values)


def commit_keep(accept_len: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[bs, R] bool: the tokens of an output row [d_1..d_n, bonus, PAD...] that were committed."""
    cols = torch.arange(num_rows, device=accept_len.device).unsqueeze(0)
    return cols <= accept_len.unsqueeze(1)
