"""SGLang plugin entry point (`sglang.srt.plugins` group).

SGLang calls `register()` with no arguments in every process it starts, then
applies the registered hooks once. With `SGLANG_DFLASH_UPSTREAM=1` we register
nothing, so SGLang's own DFLASH worker runs (for side-by-side comparison).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

UPSTREAM_ENV = "SGLANG_DFLASH_UPSTREAM"

WORKER_TARGET = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
ARGS_TARGET = "sglang.srt.arg_groups.speculative_hook._handle_dflash"
ADAPTIVE_TARGET = "sglang.srt.arg_groups.speculative_hook._maybe_disable_adaptive"
TORCH_NATIVE_TARGET = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
)
SERVER_INFO_TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController._add_speculative"
)

_registered = False


def use_upstream() -> bool:
    return os.environ.get(UPSTREAM_ENV, "0").lower() in ("1", "true", "yes")


def add_dflash_state(result, controller, state, *args, **kwargs):
    """After SGLang fills the speculative part of /get_server_info's internal
    state, add ours under "dflash" (width, on-ratio, acceptance by position)."""
    worker = getattr(controller.scheduler, "draft_worker", None)
    snapshot = getattr(worker, "stats_snapshot", None)
    if callable(snapshot):
        state["dflash"] = snapshot()
    return result


SAMPLING_VERIFY_TARGET = "sglang.srt.speculative.dflash_utils.is_dflash_sampling_verify_available"


def sampling_verify_available() -> bool:
    """Our worker verifies sampled rows exactly on every device (torch rejection
    sampler, Triton kernel on CUDA), so SGLang's request validation may accept
    `return_sampling_mask` with sampling under DFLASH."""
    return True


DFLASH_REQUEST_TARGET = "sglang.srt.speculative.dflash_utils.validate_dflash_request"


def dflash_request_allowed(req, enable_overlap) -> None:
    """SGLang refuses `return_hidden_states` under DFLASH with the overlap
    scheduler (its worker drops the target's states after drafting, so it
    returns none under the other scheduler either); ours returns the target's
    final states per emitted token under both (worker.py). Nothing else is
    checked there."""
    return None


VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def check_request(manager, obj, input_ids, *args, **kwargs):
    """BEFORE SGLang's request validation: requests SGLang 0.5.23 accepts but
    whose first step raises in the scheduler, taking every running request and
    the server with it (plain decoding and DFLASH alike), are bad requests (400)
    instead: token ids outside the vocabulary (an IndexError), an empty prompt
    (`"text": ""` tokenizes to no ids; SGLang refuses only `"input_ids": []`),
    and with `return_logprob` a `top_logprobs_num` above the vocabulary size (a
    top-k past the row) or a `logprob_start_len` below -1 (an assertion);
    `stop_token_ids` outside the vocabulary with `min_new_tokens` (the penalty
    that holds them back scatters into a vocabulary-sized row; without it such
    ids never match and are served as before); and a generation request
    (/generate, the OpenAI completion routes) to a server started with
    --is-embedding (its decode step has no logits to sample)."""
    if not getattr(manager, "is_generation", True) and type(obj).__name__ == "GenerateReqInput":
        raise ValueError("this server serves an embedding model (--is-embedding): it does not "
                         "generate; use /v1/embeddings or /encode")
    vocab = manager.model_config.vocab_size
    if input_ids is not None:
        if len(input_ids) == 0:
            raise ValueError("the prompt is empty: it tokenizes to no input tokens")
        bad = next((t for t in input_ids if not (isinstance(t, int) and 0 <= t < vocab)), None)
        if bad is not None:
            raise ValueError(f"input_ids contains token id {bad!r} outside the vocabulary "
                             f"[0, {vocab})")
    if getattr(obj, "return_logprob", False):
        top = getattr(obj, "top_logprobs_num", None)
        if isinstance(top, int) and top > vocab:
            raise ValueError(f"top_logprobs_num = {top} exceeds the vocabulary size ({vocab})")
        start = getattr(obj, "logprob_start_len", None)
        if isinstance(start, int) and start < -1:
            raise ValueError(f"logprob_start_len = {start} must be >= -1 (-1: no prompt logprobs)")
    params = getattr(obj, "sampling_params", None)
    if isinstance(params, dict) and (params.get("min_new_tokens") or 0) > 0:
        bad = next((t for t in params.get("stop_token_ids") or ()
                    if not (isinstance(t, int) and 0 <= t < vocab)), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids contains token id {bad!r} outside the vocabulary [0, {vocab})")
    return None


MODELS_PACKAGE = "sglang_dflash.adapter.models"
MODEL_LOADER_TARGET = "sglang.srt.model_loader.get_model"


def register_model_classes(*args, **kwargs):
    """Put our drafter classes in SGLang's ModelRegistry under the published
    architecture names (over upstream's). Runs as a BEFORE hook of the model
    loader, so only processes that load models import the registry."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.register(MODELS_PACKAGE, overwrite=True, strict=True)
    return None


def register() -> None:
    global _registered
    if _registered or use_upstream():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dflash.adapter import check_sglang_version

    check_sglang_version()

    from sglang_dflash.adapter.attention import VerifyCapableTorchNativeAttnBackend
    from sglang_dflash.adapter.server_args import handle_dflash, keep_adaptive_for_dflash
    from sglang_dflash.adapter.worker import DFlashWorker

    HookRegistry.register(WORKER_TARGET, DFlashWorker, HookType.REPLACE)
    HookRegistry.register(ARGS_TARGET, handle_dflash, HookType.REPLACE)
    HookRegistry.register(ADAPTIVE_TARGET, keep_adaptive_for_dflash, HookType.AROUND)
    HookRegistry.register(
        TORCH_NATIVE_TARGET, VerifyCapableTorchNativeAttnBackend, HookType.REPLACE
    )
    HookRegistry.register(SERVER_INFO_TARGET, add_dflash_state, HookType.AFTER)
    HookRegistry.register(MODEL_LOADER_TARGET, register_model_classes, HookType.BEFORE)
    HookRegistry.register(VALIDATE_TARGET, check_request, HookType.BEFORE)
    HookRegistry.register(SAMPLING_VERIFY_TARGET, sampling_verify_available, HookType.REPLACE)
    HookRegistry.register(DFLASH_REQUEST_TARGET, dflash_request_allowed, HookType.REPLACE)
    from sglang_dflash.adapter import returned_states

    HookRegistry.register(returned_states.LOGITS_PROCESSOR_TARGET, returned_states.keep_final_states,
                          HookType.AFTER)
    from sglang_dflash.adapter import cpu_parallel

    HookRegistry.register(cpu_parallel.PARALLEL_GROUP_TARGET, cpu_parallel.no_pynccl_on_cpu,
                          HookType.AROUND)
    HookRegistry.register(cpu_parallel.THREADS_BINDING_TARGET, cpu_parallel.bind_rank_threads,
                          HookType.AROUND)
    from sglang_dflash.adapter import cpu_lora

    HookRegistry.register(cpu_lora.LORA_MANAGER_TARGET, cpu_lora.unpinned_lora_on_cpu,
                          HookType.BEFORE)
    from sglang_dflash.adapter import cpu_host_pools

    HookRegistry.register(cpu_host_pools.RECORD_INIT_TARGET, cpu_host_pools.building_record, HookType.AROUND)
    HookRegistry.register(cpu_host_pools.HOST_REGISTER_TARGET, cpu_host_pools.unregistered_while_building,
                          HookType.AROUND)
    from sglang_dflash.adapter import cpu_memory_occupation

    HookRegistry.register(cpu_memory_occupation.RELEASE_TARGET, cpu_memory_occupation.release_on_cpu,
                          HookType.AROUND)
    from sglang_dflash.adapter import stream_logprobs

    HookRegistry.register(stream_logprobs.GENERATE_TARGET, stream_logprobs.send_every_step_logprobs,
                          HookType.AROUND)
    from sglang_dflash.adapter import mixed_chunk

    HookRegistry.register(mixed_chunk.MIX_TARGET, mixed_chunk.no_mixing_with_stateful_requests,
                          HookType.AROUND)
    from sglang_dflash.adapter import drafter_weights

    HookRegistry.register(drafter_weights.SELECT_TARGET, drafter_weights.bind_drafter_runner,
                          HookType.AROUND)
    from sglang_dflash.adapter import sessions

    HookRegistry.register(sessions.CREATE_TARGET, sessions.trim_finished_turns, HookType.BEFORE)
    from sglang_dflash.adapter import metrics

    HookRegistry.register(metrics.METRICS_TARGET, metrics.rescale_window_accept_rate, HookType.BEFORE)
    HookRegistry.register(metrics.META_INFO_TARGET, metrics.per_request_accept_rate, HookType.AFTER)
    from sglang_dflash.adapter import disaggregation

    disaggregation.register(HookRegistry, HookType)
    from sglang_dflash.adapter import cpu_gdn

    HookRegistry.register(cpu_gdn.GATED_NORM_TARGET, cpu_gdn.torch_gated_norm_on_cpu, HookType.AROUND)
    HookRegistry.register(cpu_gdn.FUSED_GATED_NORM_TARGET, cpu_gdn.torch_fused_gated_norm_on_cpu,
                          HookType.AROUND)
    HookRegistry.register(cpu_gdn.NEXT_GDN_INIT_TARGET, cpu_gdn.cpu_device_module_without_gpu,
                          HookType.AROUND)
    from sglang_dflash.adapter import cpu_short_conv

    cpu_short_conv.register(HookRegistry, HookType)
    from sglang_dflash.adapter import cpu_mamba2

    cpu_mamba2.register(HookRegistry, HookType)
    from sglang_dflash.adapter import cpu_nemotron_moe

    cpu_nemotron_moe.register(HookRegistry, HookType)
    from sglang_dflash.adapter import cpu_moe

    HookRegistry.register(cpu_moe.GATE_TARGET, cpu_moe.torch_shared_gate_on_cpu, HookType.AROUND)
    from sglang_dflash.adapter import penalty_order

    HookRegistry.register(penalty_order.ORCHESTRATOR_TARGET, penalty_order.fixed_penalty_order,
                          HookType.BEFORE)
    from sglang_dflash.adapter import penalty_counts

    HookRegistry.register(penalty_counts.ORCHESTRATOR_INIT_TARGET, penalty_counts.count_earlier_output,
                          HookType.AFTER)
    from sglang_dflash.adapter import input_embeds

    HookRegistry.register(input_embeds.EXTEND_KWARGS_TARGET, input_embeds.embeds_in_model_dtype,
                          HookType.AFTER)
    from sglang_dflash.adapter import layer_capture

    HookRegistry.register(layer_capture.QWEN3_VL_CAPTURE_TARGET, layer_capture.capture_qwen3_vl_layers,
                          HookType.REPLACE)
    _registered = True
