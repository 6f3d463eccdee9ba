"""`return_hidden_states` under DFLASH: the target's final hidden states, laid
out as plain decoding returns them.

The target's forward captures the drafter's layers, and SGLang's logits
processor then returns those (packed) as the output's `hidden_states`, dropping
the final ones unless it keeps them beside (`keep_last_hidden_states`, which
SGLang sets only for its capture-only mode). On a server that may return hidden
states (`--enable-return-hidden-states`, `--return-hidden-states-mode`) a hook
keeps them, set when the processor is built so that a CUDA graph captured later
outputs them too; elsewhere nothing changes. The worker hands the scheduler
what it reads after a plain forward: a prefill's every row or each request's
last, and per decode step one row per emitted token: the row whose logits chose
it (a verify row j chose the request's j-th token of the step).
"""

from __future__ import annotations

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, get_server_return_hidden_states_mode
from sglang.srt.runtime_context import get_spec

from sglang_dflash.adapter.server_args import is_dflash

LOGITS_PROCESSOR_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor.__init__"


def keep_final_states(result, processor, *args, **kwargs):
    """AFTER SGLang's LogitsProcessor.__init__: on a DFLASH server that may
    return hidden states, keep the final ones beside the captured layers."""
    if (is_dflash(get_spec().speculative_algorithm)
            and get_server_return_hidden_states_mode().need_capture()):
        processor.keep_last_hidden_states = True
    return result


def check_keeps_final_states(model) -> None:
    """At start-up, on a server that may return hidden states: the target's
    logits processor keeps its final states (`keep_final_states`), else a
    request for them would find none mid-step."""
    if not get_server_return_hidden_states_mode().need_capture():
        return
    processor = getattr(model, "logits_processor", None)
    if not getattr(processor, "keep_last_hidden_states", False):
        raise ValueError(f"sglang-dflash: the target {type(model).__name__} does not keep its final hidden "
                         "states beside the drafter's captured layers, so DFLASH cannot return them; drop "
                         "--enable-return-hidden-states / --return-hidden-states-mode")


def returned_mode(batch) -> CaptureHiddenMode:
    """Which hidden states the scheduler reads back from this batch's result
    (NULL: none; LAST: a prefill's last row per request; FULL: every row), as
    it decides: from the batch's requests and the server-wide setting."""
    if not batch.return_hidden_states:
        return CaptureHiddenMode.NULL
    return max(batch.return_hidden_states_mode, get_server_return_hidden_states_mode())


def take_final_states(logits_output) -> torch.Tensor | None:
    """The forward's final hidden states [rows, H] (None if not kept), detached
    from the output so they live no longer than the caller needs them."""
    final, logits_output.last_hidden_states = logits_output.last_hidden_states, None
    return final


def _require(final):
    if final is None:
        raise RuntimeError("return_hidden_states: the target kept no final hidden states beside the "
                           "drafter's captured layers")
    return final


def prefill_states(batch, final) -> torch.Tensor | None:
    """A prefill's returned states: every extend row [sum(extend_lens), H], or
    each request's last [bs, H] (LAST), or None when no request asks. A copy: a
    graph-captured forward's outputs are overwritten by its next replay."""
    mode = returned_mode(batch)
    if not mode.need_capture():
        return None
    final = _require(final)
    if mode.is_last():
        ends = torch.tensor(batch.extend_lens, dtype=torch.int64, device=final.device).cumsum(0) - 1
        return final[ends]
    return final.clone()


def decode_states(batch, final, num_verify: int, block_size: int) -> torch.Tensor | None:
    """A decode step's returned states [bs * block_size, H] (None when no
    request asks): request i's verify row j at i * block_size + j, zeros past
    its num_verify rows (the scheduler reads a request's first emitted-count
    rows at its stride, the block, as it reads the step's tokens)."""
    if not returned_mode(batch).need_capture():
        return None
    final = _require(final)  # [bs * num_verify, H]
    bs = final.shape[0] // num_verify
    rows = final.new_zeros(bs, block_size, final.shape[-1])
    rows[:, :num_verify] = final.view(bs, num_verify, -1)
    return rows.view(bs * block_size, -1)
