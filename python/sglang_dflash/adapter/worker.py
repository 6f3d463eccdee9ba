"""The DFLASH speculative worker that replaces SGLang's `DFlashWorkerV2`.

One decode step, each line one call (`forward_batch_generation`):
  block    = make_blocks(anchor, prefix_lens)             draft.py
  hidden   = drafter.forward_block(...)                   model.py (our torch drafter)
  proposal = propose_argmax | propose_selector            propose.py (v1 | DFlash 2)
             (the three lines above on static buffers, CUDA-graph captured: static_draft.py)
  logits   = target TARGET_VERIFY forward over the block  SGLang target worker
  result   = verify_block(drafts, logits, sampling, ..q)  verify.py (greedy / exact sampling)
  plan     = plan_commit(accept_len, prefix_lens)         draft.py
  drafter context += target features of committed rows   context.py
Speculation off (W = 0): the target's DECODE forward of the anchors alone.

The drafter runs outside SGLang's ModelRunner: its KV cache (`DraftKVCache`)
holds the context K/V projected from the target's hidden states, indexed by the
target's own KV slot ids. Radix-cache prefix sharing, chunked prefill and slot
reuse therefore need no extra bookkeeping: every slot the target commits gets
its draft context row (prefill: all extend tokens; decode: the committed rows
only), written before the drafter next reads (`DraftContext`: at once, or
deferred while speculation is off), and a slot is read only for committed
positions of a request that owns it.

The scheduler treats the spec worker as its model worker, so anything not
defined here is delegated to the target worker (`__getattr__`), as upstream does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections import deque

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE, GPU_MEMORY_TYPE_WEIGHTS
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import attention_backends, get_disagg, get_exec, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.speculative.spec_sampling_mask import SpeculativeSamplingMaskCapture
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2
from sglang.srt.utils.weight_checker import WeightChecker

from sglang_dflash import ops
from sglang_dflash.checkpoint import load_drafter, mask_embedding_for
from sglang_dflash.config import resolve_mask_token_id
from sglang_dflash.host_syncs import HostSyncCounter
from sglang_dflash.hub import resolve_drafter_path
from sglang_dflash.context import DraftContext, DraftKVCache, GatheredContext
from sglang_dflash.draft import make_blocks, plan_commit
from sglang_dflash.model import PagedContext
from sglang_dflash.adapter.disaggregation import ContextPoolView
from sglang_dflash.adapter import one_row_verify, returned_states
from sglang_dflash.adapter.linear_state import commit_accepted_state, has_linear_state, prefix_cache_track
from sglang_dflash.adapter.server_args import policy_config
from sglang_dflash.adapter.target_parts import decoder_stack
from sglang_dflash.adapter.tensor_parallel import local_row, tensor_parallel, vocab_head
from sglang_dflash.adapter.verify_logits import VerifyLogits
from sglang_dflash.policy import TUNING, SpeculationPolicy
from sglang_dflash.propose import Proposal, propose
from sglang_dflash.ragged import ragged_runs
from sglang_dflash.randomness import counter_uniforms
from sglang_dflash.rejection import PAD_TOKEN_ID
from sglang_dflash.static_draft import DraftInputs, StaticDraftStep, default_buckets, paged_draft_body
from sglang_dflash.stats import SpecStats, StepClock
from sglang_dflash.verify import SamplingRows, VerifyUniforms, verify_block
from sglang_dflash.verify_widths import ANY, backend_rule, check_mode_widths, safe_widths

logger = logging.getLogger(__name__)

TRACE_ENV = "SGLANG_DFLASH_STEP_TRACE"


def _open_trace():
    """A line-buffered JSON-lines file for per-step decisions and timing samples
    when SGLANG_DFLASH_STEP_TRACE names one (a diagnostic: one line per forward)."""
    path = os.environ.get(TRACE_ENV, "").strip()
    if not path:
        return None
    logger.info("sglang-dflash: tracing decode steps to %s", path)
    return open(path, "a", buffering=1)


SYNC_CHECK_ENV = "SGLANG_DFLASH_CHECK_SYNCS"
PAGED_ENV = "SGLANG_DFLASH_PAGED_CONTEXT"
STATIC_ENV = "SGLANG_DFLASH_STATIC_DRAFT"
FULL_SORT_ENV = "SGLANG_DFLASH_FULL_SORT"
# Tokens ranked first for a top-p / min-p row on a CPU (at most a quarter of the
# vocabulary): a top-1024 costs a twentieth of a full sort of a 152k vocabulary,
# and nuclei of real models at the usual top-p rarely reach past it (a batch
# with a row that does falls back to the sort).
PROBE_RANKS = 1024


class _SyncCheck:
    """A diagnostic (SGLANG_DFLASH_CHECK_SYNCS=1): counts this worker's host reads
    of device values per decode step (host_syncs.py), the target model's own
    forward excluded. Reported under "host_syncs" in /get_server_info."""

    def __init__(self, where: bool = False):
        self.where = where
        self.counter = None
        self.steps = 0
        self.max_per_step = 0
        self.reads: dict[str, int] = {}

    def run(self, step, *args):
        self.counter = HostSyncCounter(where=self.where)
        try:
            with self.counter:
                return step(*args)
        finally:
            self.steps += 1
            self.max_per_step = max(self.max_per_step, self.counter.total)
            for name, n in self.counter.reads.items():
                self.reads[name] = self.reads.get(name, 0) + n
            self.counter = None

    def paused(self):
        return self.counter.paused() if self.counter is not None else contextlib.nullcontext()

    def snapshot(self) -> dict:
        return {"decode_steps": self.steps, "max_per_step": self.max_per_step, "reads": dict(self.reads)}


class DFlashWorker(BaseSpecWorker):
    """Spec-v2 worker contract: see docs/design.md §10.4 (duck-typed)."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__()
        self.server_args = server_args
        self.gpu_id = gpu_id
        self.nccl_port = nccl_port
        self._target_worker = target_worker
        # The drafter is not a TpModelWorker: no draft runner, graphs or pools.
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        returned_states.check_keeps_final_states(self.model_runner.model)
        self.device = target_worker.device
        spec = get_spec()  # resolved arguments (server_args holds the raw ones)
        self.block_size = int(spec.speculative_num_draft_tokens)
        self.tp = tensor_parallel()  # None on one rank (tensor_parallel.py: what ranks share)
        self.drafter = self._load_drafter(spec.speculative_draft_model_path,
                                          spec.speculative_draft_model_revision)
        # With --enable-lora the target's embedding and head may be LoRA wrappers;
        # the drafter uses the plain modules (an adapter changes only what the
        # target verifies, and the verify decides every committed token).
        target = self.model_runner.model
        self._target_embed = unwrap_lora_layer(decoder_stack(target).embed_tokens)
        self.mask_token_id = resolve_mask_token_id(
            self.drafter.cfg, getattr(target_worker, "tokenizer", None),
            int(self.model_runner.model_config.vocab_size))
        self.merge_mask_embedding()
        self.head = vocab_head(unwrap_lora_layer(target.lm_head),
                               int(self.model_runner.model_config.vocab_size), self.tp)
        # check_weights on the drafter (drafter_weights.py); one per worker, since
        # a snapshot is compared by a later call.
        self.drafter_weight_checker = WeightChecker(get_model=lambda: self.drafter)
        self.context: DraftContext | None = None  # drafter context K/V (alloc_memory_pool)
        self.verify_logits: VerifyLogits | None = None  # penalties, grammar, bias (alloc_memory_pool)
        self.linear_state = False  # a GDN hybrid target: commit its recurrent state (alloc_memory_pool)
        # Draws for the selector walk and the accept tests; independent of the
        # target sampler's stream (docs/design.md §6.5 item 3).
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(get_spec_seed(server_args)))
        # (width, batch size, policy step) of decode steps awaiting their accept
        # counts: with the overlap scheduler, step N's counts arrive after step
        # N+1 launched.
        self._pending_steps: deque[tuple[int, int, int]] = deque(maxlen=8)
        self._offsets = torch.arange(self.block_size, dtype=torch.int64, device=self.device)
        self.overlap_schedule = not get_schedule().disable_overlap_schedule
        self.clock = StepClock(self.overlap_schedule)  # decode step periods for the cost model
        self._last_decode_reqs = []  # requests of the last decode step (idle detection)
        self._trace = _open_trace()
        check = os.environ.get(SYNC_CHECK_ENV, "0")  # "1": count; "where": by caller line
        # The drafter reads its context in place (ops.block_context_attention:
        # no gather, no host read) where the Triton kernel runs; on CPU the
        # gathered path is faster, and SGLANG_DFLASH_PAGED_CONTEXT=1 forces the
        # paged one (through its torch twin) so that it is tested end to end.
        self.paged_context = (ops.backend(self.device) == ops.BACKEND_TRITON
                              or os.environ.get(PAGED_ENV, "0") == "1")
        self._syncs = _SyncCheck(where=check == "where") if check in ("1", "where") else None
        # Sampled rows rank only what their filters can keep: a bound from the
        # requests' own filters (host values), or, for top-p / min-p alone, a
        # probe of the most probable tokens at the cost of one host read: only
        # where that read is free, a CPU (the sync check runs the step as a CUDA
        # device would). SGLANG_DFLASH_FULL_SORT=1 sorts the whole vocabulary
        # for every sampled row instead (same p; for A/B checks and tests).
        self._rank_less = os.environ.get(FULL_SORT_ENV, "0") != "1"
        cpu = torch.device(self.device).type == "cpu"
        vocab = int(self.model_runner.model_config.vocab_size)
        self._probe = min(PROBE_RANKS, vocab // 4) if cpu and self._syncs is None and self._rank_less else None
        self.static_draft: StaticDraftStep | None = None  # init_cuda_graphs
        self.one_row: one_row_verify.OneRowVerify | None = None  # W = 0 as a one-row verify (init_cuda_graphs)
        self._body = None  # the paged draft step (_paged_body)
        self.policy = self._build_policy()
        self.stats = SpecStats(self.block_size - 1)
        logger.info(
            "sglang-dflash worker: v%d drafter, %d layers, block %d, target layers %s",
            self.drafter.cfg.version,
            self.drafter.cfg.num_hidden_layers,
            self.block_size,
            list(self.drafter.cfg.target_layer_ids),
        )

    # ---- construction -------------------------------------------------------------

    def _load_drafter(self, path, revision):
        quantization = getattr(get_spec(), "speculative_draft_model_quantization", None)
        if quantization:  # set explicitly, or inherited from --quantization
            logger.info("sglang-dflash: the drafter runs in %s; drafter quantization %r is not applied (an FP8 "
                        "drafter checkpoint is dequantized at load)", self.model_runner.dtype, quantization)
        hf = self.model_runner.model_config.hf_text_config
        path = resolve_drafter_path(path, revision)  # a local directory once start-up resolved it
        drafter = load_drafter(
            path,
            target_hidden_size=int(hf.hidden_size),
            target_vocab_size=int(hf.vocab_size),
            target_num_layers=int(hf.num_hidden_layers) * int(getattr(hf, "num_loops", 1) or 1),
            dtype=self.model_runner.dtype,
        )
        # Moved to the device inside the memory saver's weights region, as SGLang
        # loads a draft model, so /release_memory_occupation frees it too; backed
        # up to the host while released, so it comes back intact (a trainer
        # rarely pushes drafter weights after a resume).
        with self._memory_region(GPU_MEMORY_TYPE_WEIGHTS, enable_cpu_backup=True):
            return drafter.to(self.device).eval()

    def _memory_region(self, tag, **kwargs):
        """SGLang's memory-saver region for `tag` (a no-op without --enable-memory-saver)."""
        adapter = getattr(self.model_runner, "memory_saver_adapter", None)
        return contextlib.nullcontext() if adapter is None else adapter.region(tag, **kwargs)

    def merge_mask_embedding(self):
        """A trained mask embedding (`mask_embedding.pt`) replaces the target
        embedding's mask row, as upstream does: the block's MASK inputs are
        embedded through the target's table. Written again after every weight
        update that reaches the target (drafter_weights.py)."""
        emb = mask_embedding_for(self.drafter, self.mask_token_id)  # raises on an id mismatch
        if emb is None:
            return
        embed_tokens = self._target_embed
        row = local_row(embed_tokens, self.mask_token_id, self.tp)
        if row is None:  # another rank's vocabulary shard holds the mask token
            return
        with torch.no_grad():
            embed_tokens.weight[row].copy_(emb.to(embed_tokens.weight.dtype))

    # ---- weight operations (drafter_weights.py) ----------------------------------

    def weight_update_runners(self):
        """The drafter as SGLang's "draft" runner; `drafter_weights.bind_drafter_runner`
        rebinds it to each operation's selector."""
        from sglang_dflash.adapter.drafter_weights import DrafterWeightRunner

        return [("draft", DrafterWeightRunner(self, draft=True, target=False))]

    def _verify_widths(self) -> tuple[int, ...]:
        """The widths the target's attention backend verifies losslessly
        (verify_widths.py); TARGET_VERIFY runs on the decode backend when
        --speculative-attention-mode is decode, else on the prefill one."""
        backend = _verify_backend()
        graphs = self._cuda_graphs()
        tracked = get_exec().mamba.enable_mamba_extra_buffer  # a hybrid target's tracked radix cache
        widths = safe_widths(backend, self.block_size, cuda_graphs=graphs, tracked_linear_state=tracked)
        if tracked:
            logger.warning("sglang-dflash: the full block only under the extra_buffer hybrid radix "
                           "cache (a W = 0 step would not write its state snapshots); speculation "
                           "stays on")
        logger.info("sglang-dflash: verify widths %s on attention backend %r%s (%s)", list(widths),
                    backend, " with CUDA graphs" if graphs else "", backend_rule(backend).why)
        return widths

    def _build_policy(self) -> SpeculationPolicy:
        cfg = policy_config(get_spec())
        widths = self._verify_widths()
        check_mode_widths(cfg, widths)
        tuning = TUNING
        if self.overlap_schedule and tuning.probe_length < 2:
            # Under overlap only a probe's second step is timed cleanly (see StepClock).
            tuning = dataclasses.replace(tuning, probe_length=2)
        if cfg.mode == "adaptive" and len(widths) == 1:  # only the full block: stays on
            cfg = dataclasses.replace(cfg, mode="on")
        if cfg.mode != "adaptive":
            return SpeculationPolicy(cfg, self.block_size, widths=widths, tuning=tuning)
        from sglang_dflash.adapter.profile import profile_costs

        start = time.perf_counter()
        samples = profile_costs(self.model_runner.model, self.drafter, self.block_size,
                                dtype=self.model_runner.dtype, widths=widths)
        logger.info("sglang-dflash: cost profile (%d samples) in %.1fs",
                    len(samples), time.perf_counter() - start)
        if self._trace is not None:  # so a trace replays offline through the same CostModel
            self._trace.write(json.dumps({"pid": os.getpid(), "t": round(time.perf_counter(), 6),
                                          "kind": "profile", "samples": samples}) + "\n")
        return SpeculationPolicy.from_profile(cfg, self.block_size, samples, widths=widths,
                                              tuning=tuning)

    def alloc_memory_pool(
        self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None
    ):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        num_slots = _kv_pool_rows(self.model_runner)
        self.linear_state = has_linear_state(self.model_runner)
        cfg = self.drafter.cfg
        # In the KV cache's region: released with it (its rows, like the target's
        # KV, are rebuilt by the prefills after SGLang flushes the cache).
        with self._memory_region(GPU_MEMORY_TYPE_KV_CACHE):
            kv = DraftKVCache(
                num_layers=cfg.num_hidden_layers,
                num_slots=num_slots,
                num_kv_heads=cfg.num_key_value_heads,
                head_dim=cfg.head_dim,
                dtype=self.model_runner.dtype,
                device=self.device,
            )
        # Under PD disaggregation SGLang's KV transfer reads (prefill server) and
        # writes (decode server) the pool's rows: no row may wait in the queue.
        disaggregated = str(get_disagg().disaggregation_mode or "null") != "null"
        self.context = DraftContext(kv, self._project_context, deferrable=not disaggregated)
        self._log_context_pool(kv)
        self.verify_logits = VerifyLogits(
            num_slots=req_to_token_pool.req_to_token.shape[0],
            vocab_size=int(self.model_runner.model_config.vocab_size),
            device=self.device,
        )

    @property
    def primary_draft_kv_pool(self):
        """The drafter's context K/V, for SGLang's PD KV transfer (disaggregation.py)."""
        if self.context is None:
            return None
        return ContextPoolView(self.context.kv, self.model_runner.token_to_kv_pool.page_size)

    def on_transferred(self, batch) -> None:
        """Requests a PD decode server received (their KV, context rows included,
        came from the prefill server): start their output counts as `_prefill` does."""
        self.verify_logits.on_transferred(batch)

    def _log_context_pool(self, kv: DraftKVCache) -> None:
        """Log the context pool's size and whether SGLang's KV budget counted it:
        the target runner adds the DFLASH draft pool's bytes per token to its
        own when it sizes the pool from --mem-fraction-static, so a server that
        starts does not run out of memory later because of this pool."""
        per_slot = 2 * kv.k[:, 0].numel() * kv.k.element_size()
        counted = budgeted_draft_bytes_per_token(self.model_runner)
        logger.info("sglang-dflash: drafter context pool %d slots x %d B = %.1f MiB "
                    "(SGLang's KV budget counts %s B/token for it)", kv.num_slots, per_slot,
                    kv.num_slots * per_slot / 2**20, counted)
        if counted is not None and per_slot > counted:
            logger.warning("sglang-dflash: the drafter context pool takes %d B/token, more than "
                           "the %d B/token SGLang's KV budget counted; lower "
                           "--mem-fraction-static if the device runs out of memory",
                           per_slot, counted)

    def init_attention_backends(self):
        pass

    def init_cuda_graphs(self):
        """The draft step on static buffers (static_draft.py), captured per
        batch-size bucket where SGLang captures its own decode graphs: on CUDA
        with the Triton kernels (the paged context), one rank (a collective
        inside the step would need SGLang's graph-capture communicators), and
        graphs not disabled; buckets from SGLang's decode graph sizes, clipped
        to --cuda-graph-max-bs. SGLANG_DFLASH_STATIC_DRAFT=1 forces the static
        path eagerly (any device), so it is served and tested on CPU. First the
        W = 0 step's own backend and graphs (one_row_verify.py)."""
        self._init_one_row_verify()
        capture = self.paged_context and self.tp is None and self._cuda_graphs()
        if not capture and os.environ.get(STATIC_ENV, "0") != "1":
            return
        self.paged_context = True  # the static body reads its context in place
        max_bs = int(self.req_to_token_pool.req_to_token.shape[0])
        cfg = get_exec().graph.cuda_graph_config
        configured = None if cfg is None else getattr(cfg.decode, "bs", None)
        buckets = default_buckets(max_bs, configured)
        self.static_draft = StaticDraftStep(self._paged_body(), buckets, self.block_size - 1,
                                            self.device)
        if capture:
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    self.static_draft.capture()
            except Exception as e:  # serve eagerly rather than not at all; say why
                logger.warning("sglang-dflash: draft step capture failed (%s: %s); the drafter "
                               "runs eagerly", type(e).__name__, e)
                self.static_draft = None
                return
            logger.info("sglang-dflash: draft step captured for batch sizes %s in %.1fs",
                        buckets, time.perf_counter() - start)
        else:
            logger.info("sglang-dflash: draft step on static buffers (eager) for batch sizes %s",
                        buckets)

    def _cuda_graphs(self) -> bool:
        """SGLang captures decode / verify graphs on this (CUDA) device."""
        return str(self.device).startswith("cuda") and _decode_graphs_enabled()

    def _init_one_row_verify(self):
        runner = self.model_runner
        way, why = one_row_verify.wanted(
            cuda_graphs=self._cuda_graphs(), any_width=backend_rule(_verify_backend()).rule == ANY,
            widths=self.policy.widths, mode=self.policy.cfg.mode, linear_state=self.linear_state,
            lora=getattr(runner, "lora_manager", None) is not None,
            two_batch_overlap=bool(get_exec().overlap.enable_two_batch_overlap),
            prefill_server=str(get_disagg().disaggregation_mode or "null") == "prefill")
        if way is None:
            logger.info("sglang-dflash: W = 0 runs the target's DECODE forward (%s)", why)
            return
        self.one_row = one_row_verify.build_logged(runner, capture=way == "graphs")

    def _paged_body(self):
        """The draft step reading its context in place (static_draft.py), built
        once the pools exist: served eagerly, or captured per bucket."""
        if self._body is None:
            self._body = paged_draft_body(self.drafter, self.head, self._embed, self.context.kv.k,
                                          self.context.kv.v, self.req_to_token_pool.req_to_token,
                                          self.mask_token_id, self.block_size)
        return self._body

    def __getattr__(self, name):
        if name == "_target_worker":
            raise AttributeError(name)
        return getattr(self._target_worker, name)

    # ---- the step -----------------------------------------------------------------

    @torch.no_grad()
    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish, pp_proxy_tensors)
        if batch.forward_mode.is_idle():
            raise NotImplementedError("sglang-dflash: idle batches (DP attention) are not supported")
        return self._decode(batch, on_publish, grammar_barrier)

    def _prefill(self, batch, on_publish, pp_proxy_tensors):
        # The decode step before this prefill ends here, and its period up to now
        # is a sample like any other (under prefill traffic half the decode steps
        # precede a prefill: voiding them starved the rarely run widths of
        # samples), unless the server idled in between: the scheduler only
        # waits for requests once every running one has finished (StepClock).
        start = time.perf_counter()
        idle = all(req.finished() for req in self._last_decode_reqs)
        sample = self.clock.prefill_started(start, idle_before=idle)
        self._record(sample)
        if self._trace is not None:
            self._trace_line(start, "prefill", len(batch.reqs), None, sample, idle=idle)
        out = self.target_worker.forward_batch_generation(
            batch,
            pp_proxy_tensors=pp_proxy_tensors,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        self.verify_logits.on_prefill(batch, out.next_token_ids)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH prefill: the target returned no captured hidden states")
        prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64, device=self.device)
        lens = torch.tensor(batch.extend_lens, dtype=torch.int64, device=self.device)
        positions = _extend_positions(prefix, lens)
        if self.policy.width == 0 and self.context.deferrable:
            # Speculation off: the prompt's rows wait with the decode steps'
            # (projected in one pass when the drafter next reads, or the queue
            # is full). Eagerly, every prefill projected its own rows and
            # flushed the queue: ~2% of an off server's scheduler time at chat
            # c4, mostly per-call work on a few hundred rows.
            self.context.commit(hidden.clone(), positions, batch.out_cache_loc, defer=True)
        else:
            self.context.commit(hidden, positions, batch.out_cache_loc)
        final = returned_states.take_final_states(out.logits_output)
        out.logits_output.hidden_states = returned_states.prefill_states(batch, final)
        out.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(out.new_seq_lens)
        out.next_draft_input = make_draft_input_v2(
            bonus_tokens=out.next_token_ids, new_seq_lens=batch.seq_lens
        )
        self.stats.time_prefill(time.perf_counter() - start, len(batch.decoding_reqs or ()))
        return out

    def _decode(self, batch, on_publish, grammar_barrier=None):
        if self._syncs is not None:
            return self._syncs.run(self._decode_step, batch, on_publish, grammar_barrier)
        return self._decode_step(batch, on_publish, grammar_barrier)

    def _decode_step(self, batch, on_publish, grammar_barrier=None):
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DFLASH decode expects DFlashDraftInputV2 on the batch")
        prefix = batch.seq_lens.to(torch.int64)
        bs = len(prefix)
        now = time.perf_counter()
        sample = self.clock.decode_started(bs, now)
        self._record(sample)
        self._last_decode_reqs = list(batch.reqs)
        width = self._choose_width(bs)  # verified drafts this step; 0 = plain decode
        self.clock.ran(width)
        if self._trace is not None:
            trials = self.policy.trials
            self._trace_line(now, "decode", bs, width, sample, decided=self.policy.width,
                             trial=trials is not None and trials.trial is not None,
                             model=self.policy.last_decision(bs),
                             bias=None if trials is None else round(trials.bias_at(bs), 4))
        anchor = draft_input.bonus_tokens.to(torch.int64)
        sampling = _sampling_rows(batch.sampling_info, batch.reqs if self._rank_less else None, bs)
        if width == 0:
            return self._decode_off(batch, draft_input, on_publish, anchor, prefix, sampling,
                                    grammar_barrier)
        num_verify = width + 1
        positions = prefix.unsqueeze(1) + self._offsets[:num_verify]  # [bs, W+1] the verify rows
        if self.paged_context:  # no host read: the kernel reads each request's length itself
            context = self.context.paged(self.req_to_token_pool.req_to_token, batch.req_pool_indices, prefix)
            cache_loc = self._token_slots(batch.req_pool_indices, positions)
        else:
            max_prefix = int(prefix.max())  # the step's one host read of the lengths
            rows = self._context_rows(batch.req_pool_indices, max_prefix)
            context = self.context.gathered(rows, prefix, max_prefix)
            cache_loc = rows.gather(1, positions).to(torch.int64)
        walk_u, verify_u = self._draw_uniforms(batch.reqs, prefix, width)
        proposal = self._draft(anchor, prefix, context, sampling, walk_u).first(width)
        verify_ids = torch.cat([anchor.unsqueeze(1), proposal.drafts], dim=1)
        target_out = self._verify(batch, verify_ids, positions, cache_loc, num_verify)
        logits_output = target_out.logits_output
        self.verify_logits.adjust(batch, logits_output.next_token_logits, verify_ids, grammar_barrier)
        logits = logits_output.next_token_logits.view(bs, num_verify, -1)
        result = verify_block(proposal.drafts, logits, sampling, verify_u,
                              q_ids=proposal.q_ids, q_probs=proposal.q_probs, probe=self._probe)
        if self.tp is not None:
            self.tp.check_same(torch.cat([result.tokens, result.accept_len.unsqueeze(1)], dim=1),
                               "the verified tokens")
        self.verify_logits.on_commit(batch, result.tokens, result.accept_len)
        plan = plan_commit(result.accept_len, prefix)
        if self.linear_state:  # a GDN hybrid: its recurrent state at the accepted position
            commit_accepted_state(self.model_runner, plan.commit_lens,
                                  prefix_cache_track(batch, prefix, plan.new_seq_lens),
                                  batch.req_pool_indices[:bs])
        self._report_sampling(batch, draft_input, logits_output, result.tokens, plan.commit_lens)
        if on_publish is not None:
            on_publish(plan.new_seq_lens)

        # Committed rows become drafter context, also when speculation is off
        # (`_decode_off`), so the drafter is current whenever speculation resumes.
        # Every verify row is written, rejected ones too: selecting the committed
        # ones by mask is a host read, and a rejected row's slot holds a position
        # past the request's committed length, which the next step verifies and
        # writes again before any draft reads it (DraftKVCache's invariant).
        hidden = logits_output.hidden_states.view(bs * num_verify, -1)
        self.context.commit(hidden, positions.reshape(-1), cache_loc.reshape(-1))
        final = returned_states.take_final_states(logits_output)
        logits_output.hidden_states = returned_states.decode_states(batch, final, num_verify, self.block_size)
        self._pending_steps.append((width, bs, self.policy.steps - 1))
        return self._step_result(target_out, result.tokens, result.bonus, plan.commit_lens, plan.new_seq_lens)

    def _decode_off(self, batch, draft_input, on_publish, anchor, prefix, sampling,
                    grammar_barrier=None):
        """Speculation off (W = 0): a plain decode step, the target's DECODE
        forward (`_target_decode`), or where graphs were captured for it a
        one-row verify replaying them (one_row_verify.py), without the block,
        the drafter, the walk's draws or a commit plan (every request commits
        exactly its anchor). Its op count is kept low: at a few requests a CPU
        step lasts a few ms and each small torch op costs tens of us, so the
        general path's accept, plan and bonus bookkeeping would be a visible
        share of an off step."""
        bs = len(prefix)
        cache_loc = self._token_slots(batch.req_pool_indices, prefix.unsqueeze(1))  # [bs, 1]
        if self.one_row is not None and self.one_row.takes(bs):
            with self.one_row.active():  # its own captured graphs, where there are
                target_out = self._verify(batch, anchor.unsqueeze(1), prefix.unsqueeze(1), cache_loc, 1)
        else:
            target_out = self._target_decode(batch, anchor, cache_loc[:, 0])
        logits_output = target_out.logits_output
        self.verify_logits.adjust(batch, logits_output.next_token_logits, anchor.unsqueeze(1), grammar_barrier)
        logits = logits_output.next_token_logits  # [bs, V]
        if sampling is None:
            bonus = logits.argmax(dim=-1)  # greedy: what verify_block emits with no drafts
        else:
            verify_u = self._draw_uniforms(batch.reqs, prefix, 0)[1]
            no_drafts = anchor.new_empty((bs, 0))
            bonus = verify_block(no_drafts, logits.view(bs, 1, -1), sampling, verify_u,
                                 probe=self._probe).tokens[:, 0]
        if self.tp is not None:
            self.tp.check_same(bonus, "the decoded tokens")
        self.verify_logits.on_commit(batch, bonus.unsqueeze(1), None)
        self._report_sampling(batch, draft_input, logits_output, bonus.unsqueeze(1),
                              torch.ones_like(bonus))
        new_seq_lens = prefix + 1
        if on_publish is not None:
            on_publish(new_seq_lens)
        # The anchor's row becomes drafter context, deferred: projected in one
        # pass when the drafter next reads. A copy: a deferred row must not
        # alias the forward's output buffer (a context that never defers, on a
        # PD server, writes it at once).
        hidden = logits_output.hidden_states
        self.context.commit(hidden.clone() if self.context.deferrable else hidden, prefix, cache_loc[:, 0],
                            defer=True)
        final = returned_states.take_final_states(logits_output)
        logits_output.hidden_states = returned_states.decode_states(batch, final, 1, self.block_size)
        self._pending_steps.append((0, bs, self.policy.steps - 1))
        return self._step_result(target_out, bonus.unsqueeze(1), bonus, None, new_seq_lens)

    def _target_decode(self, batch, anchor, cache_loc):
        """Plain decoding's target forward (ForwardMode.DECODE) of one token per
        request, its hidden states captured for the drafter: anchors [bs] at
        their positions (the committed lengths), written to cache_loc [bs].

        DECODE metadata comes from the batch on every attention backend,
        including those that size TARGET_VERIFY from the server-wide block
        (verify_widths.py), so W = 0 is lossless everywhere. It runs eagerly:
        in a DFLASH server SGLang's decode graph runner holds TARGET_VERIFY
        graphs, and its `can_run_graph` would accept this DECODE batch (no
        spec_info) and replay a verify graph over it, so the runner is held
        back for this call."""
        runner = self.model_runner
        saved = (batch.input_ids, batch.spec_info, batch.forward_mode, batch.out_cache_loc,
                 batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        lens, host_lens, host_sum = batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum
        batch.input_ids, batch.spec_info, batch.forward_mode = anchor, None, ForwardMode.DECODE
        batch.out_cache_loc = cache_loc
        # DECODE lengths count the new token (positions are seq_lens - 1), the
        # host copies too: backends size page tables and index buffers from them.
        batch.seq_lens = lens + 1
        batch.seq_lens_cpu = None if host_lens is None else host_lens + 1
        batch.seq_lens_sum = None if host_sum is None else int(host_sum) + len(anchor)
        graphs = runner.decode_cuda_graph_runner
        try:
            with self._syncs.paused() if self._syncs is not None else contextlib.nullcontext():
                forward_batch = ForwardBatch.init_new(batch, runner,
                                                      capture_hidden_mode=CaptureHiddenMode.FULL,
                                                      return_hidden_states_before_norm=False)
                runner.decode_cuda_graph_runner = None
                out = runner.forward(forward_batch)
        finally:
            runner.decode_cuda_graph_runner = graphs
            (batch.input_ids, batch.spec_info, batch.forward_mode, batch.out_cache_loc,
             batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum) = saved
        return out

    def _step_result(self, target_out, tokens, bonus, commit_lens, new_seq_lens) -> GenerationBatchResult:
        """The scheduler's view of a decode step: tokens [bs, W+1] (PAD after each
        request's bonus) padded to the block, commit lengths [bs] (None: one each),
        and what the target's forward recorded per token slot for the scheduler
        to keep (routed experts, indexer top-k, expert-load metrics): under the
        overlap scheduler those wait on the result and are stored when it is
        processed, so a result without them loses the decoded tokens' records."""
        logits_output = target_out.logits_output
        bs, num_verify = tokens.shape
        # The verify logits ([bs * (W+1), V] float32) are spent: the scheduler
        # reads only the tokens, counts and logprobs, but keeps the result alive
        # into the next step (its result queue under the overlap scheduler), so
        # holding them would keep two steps' logits resident at once.
        logits_output.next_token_logits = None
        padded = torch.nn.functional.pad(tokens, (0, self.block_size - num_verify), value=PAD_TOKEN_ID)
        if commit_lens is None:
            accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        else:
            accept_lens = commit_lens.to(torch.int32)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=padded.reshape(-1),
            accept_lens=accept_lens,
            can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=self.block_size,
            new_seq_lens=new_seq_lens,
            # Drafts each request really verified (W, 0 when off): SGLang's per-request
            # "cap" counter carries them to meta_info and the metrics, whose accept
            # rate would otherwise assume B-1 per step (adapter/metrics.py).
            cap_lens=torch.full((bs,), num_verify - 1, dtype=torch.int32, device=self.device),
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
            expert_distribution_metrics=target_out.expert_distribution_metrics,
        )

    def _token_slots(self, req_pool_indices, positions):
        """KV slots [bs, n] int64 of each request's token positions [bs, n]."""
        table = self.req_to_token_pool.req_to_token
        return table[req_pool_indices.unsqueeze(1), positions].to(torch.int64)

    def _context_rows(self, req_pool_indices, max_prefix: int):
        """Slot-table rows [bs, L] covering every request's context and its block
        (L = longest prefix + B): not the table's full width, which is the
        model's context length (a full-row copy per request per step)."""
        span = max_prefix + self.block_size  # a slice clamps at the table's width
        return self.req_to_token_pool.req_to_token[req_pool_indices, :span]

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
        """Host-side feedback after the scheduler copied the accept counts (no sync here)."""
        accepted = list(num_correct_drafts_per_req)
        step = self._pop_pending(len(accepted))
        if step is None:
            return
        width, bs, index = step
        self.stats.observe(width, accepted)
        if width == 0:
            self.policy.observe_plain(None, bs, step=index)
        else:
            self.policy.observe_verify(width, accepted, None, bs, step=index)

    def _pop_pending(self, bs):
        """The oldest decode step awaiting feedback, in launch order. A step whose
        result the scheduler never processed (none seen so far) would show as a
        batch-size mismatch: skip such entries rather than misattribute counts."""
        while self._pending_steps:
            step = self._pending_steps.popleft()
            if step[1] == bs:
                return step
        return None

    def _record(self, sample):
        """Feed a closed decode step period (StepClock) to the policy: every
        period to its regime trials, timed samples also to the cost model and
        the counters."""
        if self.clock.last_period is not None:
            self.policy.observe_period(self.clock.last_period)
        if sample is None:
            return
        self.stats.time_step(sample.width, sample.seconds)
        self.policy.observe_step_time(sample.width, sample.seconds, sample.batch_size)

    def _trace_line(self, now, kind, bs, width, sample, **extra):
        row = {"pid": os.getpid(), "t": round(now, 6), "kind": kind, "bs": bs, "width": width, **extra,
               "sample": None if sample is None else
               [sample.width, sample.batch_size, round(sample.seconds * 1e3, 3)]}
        self._trace.write(json.dumps(row) + "\n")

    def stats_snapshot(self) -> dict:
        """Server-level speculation state for /get_server_info (JSON-serializable)."""
        return {
            "block_size": self.block_size,
            "drafter_version": self.drafter.cfg.version,
            "overlap_schedule": self.overlap_schedule,
            "policy": self.policy.snapshot(),
            **self.stats.snapshot(),
            **({} if self._syncs is None else {"host_syncs": self._syncs.snapshot()}),
            **({} if self.static_draft is None else {"static_draft": self.static_draft.snapshot()}),
            **({} if self.one_row is None else {"one_row_verify": self.one_row.snapshot()}),
        }

    # ---- stages -------------------------------------------------------------------

    def _embed(self, token_ids):
        return self._target_embed(token_ids)

    def _choose_width(self, bs: int) -> int:
        """The policy's width; under tensor parallelism rank 0's, broadcast
        (each rank times its own steps, so their policies would drift apart).
        The other ranks' policies still step, fed their own timings; only
        their choice is overridden (none of their state reaches the output)."""
        width = self.policy.choose_width(bs)
        return width if self.tp is None else self.tp.share_width(width)

    def _draw_uniforms(self, reqs, prefix, width):
        """All uniforms of a step: the selector walk's [bs, B-1] (none at W = 0),
        the accept tests' [bs, W] and the emitted tokens' [bs, W+1]. A request with a
        `sampling_seed` draws from a counter-based stream keyed by (seed, anchor
        position), so its output does not depend on the rest of the batch; the
        key stays on the device (no host read of the positions)."""
        bs = len(prefix)
        num_drafts = self.block_size - 1 if width > 0 else 0  # the drafter does not run at W = 0
        total = num_drafts + 2 * width + 1
        u = torch.rand((bs, total), generator=self.generator, device=self.device)
        seeds = [getattr(req.sampling_params, "sampling_seed", None) for req in reqs]
        if any(seed is not None for seed in seeds):
            seeded = torch.tensor([seed is not None for seed in seeds], device=self.device)
            keys = torch.tensor([int(seed or 0) for seed in seeds], dtype=torch.int64, device=self.device)
            u = torch.where(seeded.unsqueeze(1), counter_uniforms(keys, prefix, total), u)
        walk = u[:, :num_drafts]
        accept = u[:, num_drafts : num_drafts + width]
        return walk, VerifyUniforms(accept=accept, sample=u[:, num_drafts + width :])

    def _draft(self, anchor, prefix, context: PagedContext | GatheredContext, sampling,
               uniforms) -> Proposal:
        """One drafter pass over the whole block (its cost barely depends on how
        many drafts are verified), then the v1 argmax or the v2 selector path:
        on the static buffers when they serve this batch size, else directly.
        The context is read in place (`PagedContext`) or was copied out and
        padded (`GatheredContext`)."""
        bs = anchor.shape[0]
        if sampling is None:  # all greedy
            greedy = torch.ones(bs, dtype=torch.bool, device=self.device)
            temperature = torch.ones(bs, device=self.device)
        else:
            greedy, temperature = sampling.greedy, sampling.temperature
        if isinstance(context, PagedContext):
            inputs = DraftInputs(anchor, prefix, context.req_pool_indices.to(torch.int64),
                                 temperature.float(), greedy, uniforms)
            if self.static_draft is not None:
                proposal = self.static_draft.run(inputs)
                if proposal is not None:
                    return proposal
            return self._paged_body()(inputs, all_greedy=sampling is None)
        block = make_blocks(anchor, prefix, self.mask_token_id, self.block_size)
        hidden = self.drafter.forward_block(self._embed(block.token_ids), block.positions,
                                            context.k, context.v, context.valid)[:, 1:]
        return propose(self.drafter, hidden, anchor, self.head, temperature, greedy, uniforms,
                       all_greedy=sampling is None)

    def _verify(self, batch, verify_ids, positions, cache_loc, num_verify):
        """Target TARGET_VERIFY forward over [bs, num_verify] rows: the target
        worker's result (raw logits in its logits_output)."""
        verify_input = DFlashVerifyInput(
            draft_token=verify_ids.reshape(-1),
            positions=positions.reshape(-1),
            draft_token_num=num_verify,
            custom_mask=None,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch.out_cache_loc = cache_loc.reshape(-1)
        # Host-side length bound during the verify, as SGLang's DFLASH sets it:
        # backends that plan on the host (FlashInfer's verify plan) read the KV
        # length of each request as seq_lens_cpu, which must cover the block.
        host_lens, host_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        if host_lens is not None:
            batch.seq_lens_cpu = host_lens + num_verify
            batch.seq_lens_sum = int(host_sum) + num_verify * len(host_lens)
        try:
            with self._syncs.paused() if self._syncs is not None else contextlib.nullcontext():
                forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
                out = self.target_worker.forward_batch_generation(
                    batch=None, forward_batch=forward_batch, is_verify=True,
                    skip_attn_backend_init=True)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = host_lens, host_sum
        return out

    @staticmethod
    def _report_sampling(batch, draft_input, logits_output, tokens, commit_lens):
        """What requests asked to see of the sampling of their committed tokens
        (tokens [bs, R], PAD after the bonus; never read past commit_lens), from
        the adjusted verify logits as plain decoding computes it: output logprobs
        (with the requested top / id logprobs) and sampling masks (the support of
        p each token was drawn from)."""
        bs, rows = tokens.shape
        ids = tokens.clamp(min=0)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, ids.reshape(-1), chain_stride=rows)
        capture = SpeculativeSamplingMaskCapture.from_logits(
            batch.sampling_info, next_token_logits=logits_output.next_token_logits,
            draft_input=draft_input, draft_token_num=rows, bs=bs)
        if capture is not None:
            logits_output.sampling_mask_output = capture.build_output(
                out_tokens=ids, commit_lens=commit_lens.to(torch.int32))

    def _project_context(self, target_hidden, positions):
        """Target features [N, n*H] at positions [N] -> drafter context K/V."""
        ctx = self.drafter.context_features(target_hidden.to(self.drafter_dtype))
        return self.drafter.context_kv(ctx, positions)

    @property
    def drafter_dtype(self):
        return next(self.drafter.parameters()).dtype


def _kv_pool_rows(model_runner) -> int:
    """Rows of the target's full-attention KV pool (the token slot ids). A GDN
    hybrid's pool holds its full-attention layers only, indexed by model layer
    id; the first one is asked. A hybrid sliding-window target's sliding layers
    sit in a smaller windowed pool (`SWAKVPool.layers_mapping`: layer id ->
    (pool layer, windowed)), whose rows are not slot ids: a full layer is asked."""
    pool = model_runner.token_to_kv_pool
    mapping = getattr(pool, "full_attention_layer_id_mapping", None)
    layer = min(mapping) if mapping else 0
    windowed = getattr(pool, "layers_mapping", None)
    if windowed:
        full = [i for i, (_, in_window) in windowed.items() if not in_window]
        if not full:  # every layer sliding: the full pool allocates slot ids but holds no layer
            return pool.full_kv_pool.size + pool.full_kv_pool.page_size
        layer = min(full)
    return pool.get_key_buffer(layer).shape[0]


def _verify_backend() -> str:
    """The target attention backend TARGET_VERIFY runs on: the decode one when
    --speculative-attention-mode is decode, else the prefill one."""
    prefill, decode = attention_backends()  # the target runner resolves the same pair later
    return str(decode if get_spec().speculative_attention_mode == "decode" else prefill)


def _decode_graphs_enabled() -> bool:
    """Whether SGLang will capture decode / verify CUDA graphs (captured after
    this worker starts, so read from the configuration)."""
    cfg = get_exec().graph.cuda_graph_config
    backend = None if cfg is None else cfg.decode.backend
    return backend is not None and getattr(backend, "name", str(backend)).upper() != "DISABLED"


def budgeted_draft_bytes_per_token(model_runner) -> int | None:
    """Bytes per token SGLang's KV budget set aside for the DFLASH draft pool
    (its target runner's pool configurator), None if it set none aside."""
    aux = getattr(model_runner, "spec_aux_config", None)
    if aux is None or aux.draft_model_config is None or not aux.dflash_draft_num_layers:
        return None
    from sglang.srt.mem_cache.draft_kv_budget import resolve_dflash_draft_cell_size

    try:
        return resolve_dflash_draft_cell_size(draft_model_config=aux.draft_model_config,
                                              draft_num_layers=aux.dflash_draft_num_layers,
                                              attn_tp_size=1)
    except Exception:  # the budget helper's own inputs did not resolve
        return None


def get_spec_seed(server_args) -> int:
    seed = getattr(server_args, "random_seed", None)
    return 0 if seed is None else seed


def _sampling_rows(sampling_info, reqs, bs: int):
    """Per-request sampling parameters, or None when every request is greedy.
    The filters also as the requests hold them on the host, when `reqs` are the
    batch's rows (SGLang builds `top_ks` etc. from them, in order)."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return None
    host = None
    if reqs is not None and len(reqs) == bs:
        host = tuple((r.sampling_params.top_k, r.sampling_params.top_p, r.sampling_params.min_p) for r in reqs)
    return SamplingRows(
        temperature=sampling_info.temperatures.view(bs).float(),
        top_p=sampling_info.top_ps.view(bs).float(),
        top_k=sampling_info.top_ks.view(bs).to(torch.int64),
        min_p=sampling_info.min_ps.view(bs).float(),
        host_filters=host,
    )


def _extend_positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor) -> torch.Tensor:
    """Absolute positions of every extend token, flattened in batch order."""
    return ragged_runs(prefix_lens, extend_lens)[1]  # on their device
