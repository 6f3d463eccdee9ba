"""Prefill-decode disaggregation (`--disaggregation-mode prefill|decode`) under DFLASH.

A prefill server runs the target's prefill and our worker's prefill step, which
projects the prompt's hidden states into the drafter's context K/V (context.py),
one row per target KV slot. SGLang's KV transfer then sends a request's target
KV pages to the decode server, and with them the pages of the spec worker's
`primary_draft_kv_pool` (appended after the target's entries, at the same slot
ids, as for upstream's draft KV). `ContextPoolView` presents our context pool in
that form, so the decode server's first draft reads the prompt's context as a
single server's would; without it the prompt's rows would be whatever the
decode server's pool held there.

Two things do not travel with the KV:

* the output counts penalties read (verify_logits.py), which a single server
  starts in its prefill step: `start_transferred` starts them when SGLang's
  decode loop turns transferred requests into a batch;
* deferred context rows (written when the drafter next reads): the worker
  writes every row at once on either side (`DraftContext(deferrable=False)`),
  as the transfer reads and writes pool rows outside the worker.

On a host without CUDA, SGLang's prefill side hands the transfer its page
indices through pinned host memory and a CUDA event; `host_indices_on_cpu`
gives them as a plain tensor there (the transfer's other path). See the
README for the flags a CPU pair needs.
"""

from __future__ import annotations

import torch

from sglang_dflash.context import DraftKVCache

PREBUILT_TARGET = ("sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin."
                   "get_new_prebuilt_batch")
SEND_TARGET = "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin._send_kv_chunk"


class ContextPoolView:
    """The drafter's context K/V as SGLang's KV transfer registers a draft pool:
    one contiguous buffer per layer, every K then every V (as a KV pool lists
    k0..k(L-1), v0..v(L-1)), rows indexed by the target's slot ids, and a page
    of rows per transfer item."""

    def __init__(self, kv: DraftKVCache, page_size: int):
        self.kv = kv
        self.page_size = int(page_size)

    @property
    def layer_num(self) -> int:
        return int(self.kv.k.shape[0])

    def buffers(self) -> list[torch.Tensor]:
        """[num_slots + 1, kv_heads, head_dim] views, K of every layer then V."""
        return [*self.kv.k.unbind(0), *self.kv.v.unbind(0)]

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """(data pointers, byte lengths, bytes per page) of each buffer."""
        buffers = self.buffers()
        return ([b.data_ptr() for b in buffers], [b.nbytes for b in buffers],
                [b[0].nbytes * self.page_size for b in buffers])


def start_transferred(batch, scheduler, *args, **kwargs):
    """AFTER SGLang's PD decode loop builds the batch of requests whose KV has
    arrived (`get_new_prebuilt_batch`): the DFLASH worker starts their state
    (output counts for penalties) as its prefill step does on a single server."""
    worker = getattr(scheduler, "draft_worker", None)
    on_transferred = getattr(worker, "on_transferred", None)
    if batch is not None and callable(on_transferred) and not batch.is_empty():
        on_transferred(batch)
    return batch


def host_indices_on_cpu(scheduler, req, *args, **kwargs):
    """BEFORE SGLang's PD prefill send (`_send_kv_chunk`); on a host without
    CUDA the sender takes its page indices as a plain host tensor. Its
    default path copies them into pinned memory and records a CUDA event,
    which needs a CUDA driver; the plain path is the one senders without that
    option use, and on a CPU the indices are already on the host."""
    sender = getattr(req, "disagg_kv_sender", None)
    if (sender is not None and getattr(sender, "supports_host_tensor_indices", False)
            and not torch.cuda.is_available()):
        sender.supports_host_tensor_indices = False  # on the instance: this process only
    return None


def register(registry, hook_type) -> None:
    registry.register(PREBUILT_TARGET, start_transferred, hook_type.AFTER)
    registry.register(SEND_TARGET, host_indices_on_cpu, hook_type.BEFORE)
