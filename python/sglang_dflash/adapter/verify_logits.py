"""Verify logits as plain decoding would see them, at every verified position.

Plain decoding adjusts each step's logits before it samples (SGLang's
`SamplingBatchInfo.apply_logits_bias`, then the sampler): penalties (additive,
then the repetition scaling), the grammar's vocabulary mask, logit bias, then
custom logit processors. A verify block holds W+1 such steps at once; row k
follows the anchor and drafts d_1..d_k, so:

* penalties count d_1..d_k on row k (`penalties.apply_block_penalties`, from
  per-request counts of the committed output this module keeps: SGLang's own
  penalizer is not advanced under speculation);
* the grammar mask of row k is the grammar's state after d_1..d_k (SGLang's
  chain traversal, `GrammarTree.from_linear_chain`); the grammar itself is
  advanced by the scheduler over committed tokens only;
* logit bias and custom processors apply per row as they do per step (a custom
  processor sees the request's committed output, not the drafts before a row).

The acceptance test then reads these logits, so greedy output equals plain
decoding's and sampled rows accept against the same processed p.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

from sglang_dflash.penalties import OutputCounts, PenaltyParams, apply_block_penalties, commit_keep


def penalized(req) -> bool:
    sp = req.sampling_params
    return (sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0
            or sp.repetition_penalty != 1.0 or sp.min_new_tokens > 0)


def _stop_ids(req) -> set[int]:
    """Stop tokens min_new_tokens holds back: SGLang's min-new-tokens penalizer's set."""
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    tok = getattr(req, "tokenizer", None)
    if tok is not None:
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
        if tok.eos_token_id is not None:
            ids.add(tok.eos_token_id)
    return {i for i in ids if i is not None}


class VerifyLogits:
    """Per-server state and the logit adjustments of a verify step."""

    def __init__(self, num_slots: int, vocab_size: int, device) -> None:
        self.num_slots, self.vocab_size, self.device = num_slots, vocab_size, device
        self.outputs: OutputCounts | None = None  # allocated at the first penalized request

    # -- state ------------------------------------------------------------

    def on_prefill(self, batch, next_token_ids: torch.Tensor) -> None:
        """Start the output counts of the requests this extend (re)started: their
        earlier output (a retracted request) plus the token the extend sampled,
        unless the extend was an unfinished chunk (its token is discarded)."""
        slots = self._start(batch)
        if slots is None:
            return
        # An unfinished chunk's extend ends before the request's fill ids. Not
        # `inflight_middle_chunks == 0`: under the overlap scheduler that count
        # drops when the previous chunk's result is processed, which is after the
        # final chunk has run, so the final chunk's token went uncounted.
        done = torch.tensor([start + n >= len(req.full_untruncated_fill_ids) for req, start, n
                             in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)],
                            device=self.device)
        self.outputs.add(slots, next_token_ids.view(-1, 1).to(torch.int64), done.view(-1, 1))

    def on_transferred(self, batch) -> None:
        """Start the output counts of requests a PD decode server received: their
        output so far (the prefill server's token) is in `req.output_ids`."""
        self._start(batch)

    def _start(self, batch) -> torch.Tensor | None:
        """Reset the counts of the batch's requests to their output so far; their
        slots, or None while no penalized request has needed counts."""
        if self.outputs is None:
            if not any(penalized(req) for req in batch.reqs):
                return None
            self.outputs = OutputCounts(self.num_slots, self.vocab_size, self.device)
        slots = batch.req_pool_indices.to(torch.int64)
        self.outputs.reset(slots, [list(req.output_ids) for req in batch.reqs])
        return slots

    def on_commit(self, batch, tokens: torch.Tensor, accept_len: torch.Tensor | None) -> None:
        """Count a decode step's committed tokens [bs, R] (drafts, then the bonus)."""
        if self.outputs is None:
            return
        slots = batch.req_pool_indices.to(torch.int64)
        if accept_len is None:  # W = 0: the bonus alone
            keep = torch.ones_like(tokens, dtype=torch.bool)
        else:
            keep = commit_keep(accept_len, tokens.shape[1])
        self.outputs.add(slots, tokens, keep)

    # -- the step ---------------------------------------------------------

    def adjust(self, batch, logits: torch.Tensor, verify_ids: torch.Tensor,
               grammar_barrier=None) -> None:
        """Adjust verify logits [bs * R, V] in place for the block verify_ids [bs, R]
        (anchor, drafts), in plain decoding's order."""
        bs, rows = verify_ids.shape
        info = batch.sampling_info
        view = logits.view(bs, rows, -1)
        if self.outputs is not None and any(penalized(req) for req in batch.reqs):
            slots = batch.req_pool_indices.to(torch.int64)
            counts, lengths = self.outputs.rows(slots)
            apply_block_penalties(view, verify_ids[:, 1:], counts, lengths, self._params(batch.reqs))
        if batch.has_grammar:
            mask = build_grammar_vocab_mask(
                reqs=batch.reqs, tree=GrammarTree.from_linear_chain(verify_ids),
                sampling_info=info, device=logits.device, barrier=grammar_barrier)
            if mask is not None:
                mask.apply(logits)
        if info is None:
            return
        if info.logit_bias is not None:
            view.add_(info.logit_bias.view(bs, 1, -1).to(logits.dtype))
        if info.has_custom_logit_processor:
            apply_custom_logit_processor(logits, info, num_tokens_in_batch=rows)

    def _params(self, reqs) -> PenaltyParams:
        sp = [req.sampling_params for req in reqs]
        dev = self.device
        min_new = [s.min_new_tokens for s in sp]
        stop_mask = None
        if any(min_new):
            stop_mask = torch.zeros((len(reqs), self.vocab_size), dtype=torch.bool, device=dev)
            for i, req in enumerate(reqs):
                ids = [t for t in _stop_ids(req) if 0 <= t < self.vocab_size] if min_new[i] else []
                if ids:
                    stop_mask[i, torch.tensor(ids, device=dev)] = True
        return PenaltyParams(
            frequency=torch.tensor([s.frequency_penalty for s in sp], dtype=torch.float32, device=dev),
            presence=torch.tensor([s.presence_penalty for s in sp], dtype=torch.float32, device=dev),
            repetition=torch.tensor([s.repetition_penalty for s in sp], dtype=torch.float32, device=dev),
            min_new_tokens=torch.tensor(min_new, dtype=torch.int64, device=dev),
            stop_mask=stop_mask,
        )
