"""The DFLASH worker under SGLang's tensor parallelism (`--tp N`).

What is shared and why every rank stays in step:

* The drafter and its context pool are replicated: a drafter is a few layers
  of the target's width, and sharding it would add collectives to every
  drafter layer for little memory. Its inputs are identical on every rank: the
  target's hidden states (the residual stream after each layer's all-reduce)
  and the embedding (SGLang's vocab-parallel embedding all-reduces its lookup).
* The LM head stays vocab-parallel: `VocabHead` merges per-shard argmax /
  top-K results over an all-gather (O(tp * K) values per position), and every
  rank merges the same gathered tensors, so every rank drafts the same tokens.
* Random draws come from the worker's own generator, seeded identically on
  every rank, and every draw's shape depends only on the batch size and the
  width; the target's verify logits are all-gathered (identical on every
  rank). Same inputs, same draws: the same accepted tokens on every rank.
* The width is the one input that is not identical: each rank times its own
  steps. Rank 0's policy decides and broadcasts the width over the group's CPU
  (gloo) communicator, one int per decode step; the other ranks follow it.

`SGLANG_DFLASH_TP_CHECK=1` all-gathers each step's committed tokens and fails
loudly if the ranks disagree (a test aid: one more collective per step).
"""

from __future__ import annotations

import os

import torch

from sglang_dflash.vocab_head import VocabHead

TP_CHECK_ENV = "SGLANG_DFLASH_TP_CHECK"


class TensorParallel:
    """This rank's view of the tensor-parallel group (SGLang's `GroupCoordinator`)."""

    def __init__(self, group) -> None:
        self.group = group
        self.check = os.environ.get(TP_CHECK_ENV, "0") == "1"
        self._width = torch.zeros(1, dtype=torch.int64)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [...] -> [tp, ...], every rank's x in rank order."""
        return self.group.all_gather(x.unsqueeze(0).contiguous(), dim=0)

    def share_width(self, width: int) -> int:
        """Rank 0's width, on every rank (rank 0 passes its own)."""
        self._width[0] = width
        torch.distributed.broadcast(self._width, src=self.group.ranks[0], group=self.group.cpu_group)
        return int(self._width[0])

    def check_same(self, tokens: torch.Tensor, what: str) -> None:
        """With SGLANG_DFLASH_TP_CHECK=1: raise unless every rank holds `tokens`."""
        if not self.check:
            return
        every = self.gather(tokens)
        if not bool((every == every[0:1]).all()):
            raise RuntimeError(f"sglang-dflash: tensor-parallel ranks disagree on {what}: "
                               f"{every.tolist()}")


def tensor_parallel() -> TensorParallel | None:
    """The tensor-parallel group when SGLang runs with --tp > 1, else None."""
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size, get_tp_group

    if get_tensor_model_parallel_world_size() == 1:
        return None
    return TensorParallel(get_tp_group())


def vocab_head(lm_head: torch.nn.Module, vocab_size: int, tp: TensorParallel | None) -> VocabHead:
    """The target's LM head module (a `ParallelLMHead`, or the tied embedding)
    as a `VocabHead`: this rank's shard of real tokens and the gather to merge
    shards with.

    The drafter's candidates multiply by the head's weight directly, so a head
    stored quantized (FP8, NVFP4: SGLang keeps such a head's weight in its
    storage format and multiplies through its quant method) is refused at
    start-up; FP8 targets usually leave the head unquantized."""
    dtype = getattr(getattr(lm_head, "weight", None), "dtype", None)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"sglang-dflash: the target's LM head is stored as {dtype} (quantized); DFLASH needs a "
                         "float16 / bfloat16 / float32 head for the drafter's candidates")
    if tp is None:
        return VocabHead.whole(lm_head.weight, vocab_size)
    shard = lm_head.shard_indices  # SGLang's VocabParallelEmbeddingShardIndices
    return VocabHead(lm_head.weight, start=int(shard.org_vocab_start_index),
                     size=int(shard.num_org_elements), vocab=vocab_size, gather=tp.gather)


def local_row(embedding: torch.nn.Module, token_id: int, tp: TensorParallel | None) -> int | None:
    """The row of `token_id` in this rank's shard of a vocab-parallel embedding,
    or None when another rank holds it."""
    if tp is None:
        return token_id
    shard = embedding.shard_indices
    start, end = int(shard.org_vocab_start_index), int(shard.org_vocab_end_index)
    return token_id - start if start <= token_id < end else None
