"""Honest speculation metrics when the verify width varies.

SGLang's accept rate divides the accepted drafts by (B-1) per verify step, per
request in `meta_info` and per window in the decode log and the Prometheus
gauge `sglang:spec_accept_rate`. Our steps verify W <= B-1 drafts (0 when
speculation is off), which that formula understates. The worker reports the
drafts each request verified as SGLang's per-request verify cap (`cap_lens`,
summed into `spec_num_cap_tokens`, shown as `spec_cap_length`: drafts verified
per step); these hooks divide by them instead.
"""

from __future__ import annotations

from sglang.srt.runtime_context import get_spec

from sglang_dflash.adapter.server_args import is_dflash

METRICS_TARGET = ("sglang.srt.managers.scheduler_components.metrics_reporter."
                  "SchedulerMetricsReporter.report_decode_stats")
META_INFO_TARGET = ("sglang.srt.managers.tokenizer_manager.TokenizerManager."
                    "_calculate_spec_decoding_metrics")


def rescale_window_accept_rate(reporter, *args, **kwargs):
    """BEFORE `report_decode_stats`: scale the window's accepted-draft count so
    that SGLang's formula, correct / (steps * (B-1)), yields correct / verified.
    The count feeds only that rate and is reset right after it, but only on the
    calls that reach the periodic report: the others return early and keep
    accumulating, so they must be left alone (scaling them would compound)."""
    if not is_dflash(get_spec().speculative_algorithm) or not _reports_now(reporter):
        return None
    steps, verified = reporter.spec_num_forward_ct, reporter.spec_num_cap_tokens
    per_step = (get_spec().speculative_num_draft_tokens or 1) - 1
    if steps > 0 and verified > 0 and per_step > 0:
        reporter.spec_num_correct_drafts *= steps * per_step / verified
    return None


def _reports_now(reporter) -> bool:
    """Whether this `report_decode_stats` call reaches its periodic part (the
    two early returns at its top, read from SGLang 0.5.23)."""
    interval = getattr(reporter, "decode_log_interval", 1) or 1
    if getattr(reporter, "forward_ct_decode", 0) % interval != 0:
        return False
    return bool(getattr(reporter, "is_stats_logging_rank", True)
                or getattr(reporter, "current_scheduler_metrics_enabled", False))


def per_request_accept_rate(result, manager, meta_info, recv_obj, i, *args, **kwargs):
    """AFTER `_calculate_spec_decoding_metrics`: a request's accept rate over the
    drafts it really verified."""
    if not is_dflash(get_spec().speculative_algorithm) or "spec_num_correct_drafts" not in meta_info:
        return result
    caps = getattr(recv_obj, "spec_num_cap_tokens", None) or []
    verified = caps[i] if len(caps) > i else 0
    meta_info["spec_num_proposed_drafts"] = verified
    meta_info["spec_accept_rate"] = meta_info["spec_num_correct_drafts"] / verified if verified else 0.0
    return result
