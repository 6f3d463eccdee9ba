"""Which verify widths each SGLang 0.5.23 attention backend handles.

The adaptive policy verifies W+1 <= B rows per request for W > 0, and runs
W = 0 (speculation off) as plain decoding: the target's DECODE forward, one
token per request, whose attention metadata every backend builds from the
batch itself (seq_lens, req_pool_indices) when the batch carries no
spec_info. A backend that builds its TARGET_VERIFY metadata (query offsets,
KV lengths, masks) from the server-wide draft token count B instead of the
batch's own `draft_token_num` reads the wrong rows at any narrower verify
width: not a slowdown, wrong output. So the worker restricts the policy's
widths to what the backend handles (`safe_widths`), and refuses a backend
with no verify path at all. Read from SGLang 0.5.23's sources (paths relative
to `sglang/srt/`); the rule per backend:

* ANY - every width 0..B-1: verify metadata from the batch's
  `spec_info.draft_token_num`.
* FULL - the full block and W = 0 (DECODE, per-batch metadata).
* FULL_ONLY - the full block only (speculation stays on): a DECODE step
  between verifies is not known to be lossless there.
* NONE - no TARGET_VERIFY path usable by a DFLASH chain: refused at start-up.

CUDA graphs: SGLang captures TARGET_VERIFY only at the full block
(`model_executor/runner/decode_cuda_graph_runner.py`, `can_run_graph` refuses
other widths), so with graphs a narrower verify runs eager and loses the
graph. With graphs on, widths are limited to the full block and W = 0. On an
ANY backend the W = 0 step is a one-row verify with graphs of its own
(adapter/one_row_verify.py); elsewhere it is the DECODE forward, eager (the
worker holds the decode graph runner back for it: its graphs are
TARGET_VERIFY graphs).

Hybrid targets under SGLang's `extra_buffer` radix cache keep the full block
only, whatever the backend (`safe_widths`'s `tracked_linear_state`).

Imports the stdlib only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ANY, FULL, FULL_ONLY, NONE = "any", "full", "full_only", "none"


@dataclass(frozen=True)
class BackendRule:
    rule: str  # ANY | FULL | FULL_ONLY | NONE
    why: str  # where the verify token count comes from (file:line in SGLang 0.5.23), and
    # for FULL where the DECODE path takes its metadata from the batch


_PER_BATCH = "TARGET_VERIFY metadata from spec_info.draft_token_num"
_SERVER_WIDE = "TARGET_VERIFY metadata sized from the server-wide speculative_num_draft_tokens"
_DECODE = "DECODE metadata from the batch's seq_lens when spec_info is None"

BACKENDS: dict[str, BackendRule] = {
    "triton": BackendRule(ANY, f"{_PER_BATCH} (layers/attention/triton_backend.py:586-590, 1009)"),
    "flashinfer": BackendRule(ANY, f"{_PER_BATCH} via generate_attn_arg_prefill "
                                   "(layers/attention/flashinfer_backend.py:2271-2281, "
                                   "speculative/dflash_info.py:159-167)"),
    "llada2_cfg_flashinfer": BackendRule(ANY, "inherits flashinfer's TARGET_VERIFY path"),
    "torch_native": BackendRule(ANY, "sglang-dflash's verify-capable replacement reads "
                                     "spec_info.draft_token_num (adapter/attention.py)"),
    "intel_xpu": BackendRule(ANY, f"{_PER_BATCH} (layers/attention/xpu_backend.py:453)"),
    "qsa": BackendRule(ANY, f"{_PER_BATCH} (layers/attention/qwen_sparse_attn_backend.py:397)"),
    "trtllm_mha": BackendRule(FULL, "lengths per batch, but on SM90/SM120 the XQA spec-decoding "
                                    "mask is built for B rows per request "
                                    "(layers/attention/trtllm_mha_backend.py:417-427) and offset by "
                                    f"W+1 rows in the kernel; {_DECODE} (:1262-1269)"),
    "fa3": BackendRule(FULL, f"{_SERVER_WIDE} (layers/attention/flashattention_backend.py:1058-1070); "
                             f"{_DECODE} (:908-1033)"),
    "fa4": BackendRule(FULL, f"{_SERVER_WIDE} (layers/attention/flashattention_backend.py:1058-1070); "
                             f"{_DECODE} (:908-1033)"),
    "flashmla": BackendRule(FULL, f"{_SERVER_WIDE} (layers/attention/flashmla_backend.py:102, 200); "
                                  f"{_DECODE} (:168-196)"),
    "trtllm_mla": BackendRule(FULL, f"{_SERVER_WIDE} (layers/attention/trtllm_mla_backend.py:298, "
                                    f"841); {_DECODE} (:847-851)"),
    "cutedsl_mla": BackendRule(FULL, "inherits trtllm_mla's TARGET_VERIFY and DECODE metadata "
                                     "(layers/attention/cutedsl_mla_backend.py:176-183)"),
    "tokenspeed_mla": BackendRule(FULL, "alias of cutedsl_mla"),
    "dsa": BackendRule(FULL, f"{_SERVER_WIDE} (layers/attention/dsa_backend.py:1100-1101); "
                             f"{_DECODE} (:1163-1167)"),
    "nsa": BackendRule(FULL, "alias of dsa"),
    "dsv4": BackendRule(FULL_ONLY, f"{_SERVER_WIDE} (layers/attention/deepseek_v4_backend.py:"
                                   "2171-2176); with online c128 compression a DECODE step commits "
                                   "the previous verify by its length difference "
                                   "(layers/attention/dsv4/online_c128_mtp.py:94-113)"),
    "compressed": BackendRule(FULL_ONLY, "alias of dsv4"),
    "ascend": BackendRule(FULL_ONLY, f"{_SERVER_WIDE} (hardware_backend/npu/attention/"
                                     "ascend_backend.py:1501); its DECODE path not read"),
    "aiter": BackendRule(ANY, f"ROCm; eager {_PER_BATCH} (layers/attention/aiter_backend.py:2300, "
                              "2450); its graphs, like every backend's, are full-block only"),
    "flex_attention": BackendRule(NONE, "reads extend_seq_lens, which TARGET_VERIFY batches leave "
                                        "unset (layers/attention/torch_flex_backend.py:280)"),
    "wave": BackendRule(NONE, "reads extend_seq_lens, unset for TARGET_VERIFY "
                              "(layers/attention/wave_backend.py:504)"),
    "hpc_ops": BackendRule(NONE, "refuses speculative decoding (layers/attention/attention_registry.py:292)"),
    "intel_amx": BackendRule(NONE, "reads spec_info.tree_topk, which a DFLASH verify input lacks "
                                   "(layers/attention/intel_amx_backend.py:115)"),
    "minicpm_flashattn": BackendRule(NONE, "refuses target verify (layers/attention/minicpm/backend.py:380)"),
    "minicpm_flashinfer": BackendRule(NONE, "refuses target verify (layers/attention/minicpm/backend.py:380)"),
}


class UnsupportedBackend(ValueError):
    pass


def backend_rule(backend: str) -> BackendRule:
    """The rule of a backend name; an unknown name gets the conservative FULL_ONLY."""
    return BACKENDS.get(backend, BackendRule(FULL_ONLY, f"{backend!r} is not in the table: "
                                                        "assumed to size verify from the full block"))


def safe_widths(backend: str, block_size: int, *, cuda_graphs: bool = False,
                tracked_linear_state: bool = False) -> tuple[int, ...]:
    """The verify widths W (drafts per request, 0..B-1) that are lossless on
    `backend`, and, with CUDA graphs, that do not give up the target's graph
    for a narrower eager verify (the full block and W = 0 only).

    Args:
        tracked_linear_state: a hybrid target under SGLang's `extra_buffer`
            radix cache. The scheduler records a state snapshot at each grid
            length a decode step crosses, and in a speculative batch only a
            verify's commit writes it: a W = 0 DECODE step would leave it
            unwritten. So the full block only, as on FULL_ONLY backends (the
            adaptive policy's regimes need W = 0, so speculation stays on).

    Raises:
        UnsupportedBackend: the backend has no TARGET_VERIFY path for DFLASH.
    """
    rule = backend_rule(backend)
    top = block_size - 1
    if rule.rule == NONE:
        raise UnsupportedBackend(
            f"sglang-dflash: attention backend {backend!r} cannot run DFLASH verification: "
            f"{rule.why}; use triton, flashinfer or torch_native")
    if rule.rule == FULL_ONLY or tracked_linear_state:
        return (top,)
    widths = (0, top) if rule.rule == FULL or cuda_graphs else tuple(range(top + 1))
    return tuple(sorted(set(widths)))


def check_mode_widths(cfg, widths: tuple[int, ...]) -> None:
    """A policy mode the widths cannot serve is a start-up error; adaptive with
    only the full block left keeps speculation on (and says so).

    Args:
        cfg: a PolicyConfig (mode, fixed_width).
        widths: `safe_widths(...)`.
    """
    if cfg.mode == "off" and 0 not in widths:
        raise UnsupportedBackend(
            f"sglang-dflash: policy mode 'off' needs W = 0 steps, which this server is not known "
            f"to take losslessly (verify widths {list(widths)}: the attention backend, or a hybrid "
            "target's extra_buffer radix cache); use triton, flashinfer or torch_native, "
            "--mamba-radix-cache-strategy no_buffer, or serve without --speculative-algorithm")
    if cfg.mode == "fixed" and cfg.fixed_width not in widths:
        raise UnsupportedBackend(
            f"sglang-dflash: fixed_width = {cfg.fixed_width} is not a verify width this attention "
            f"backend handles (widths {list(widths)})")
    if cfg.mode == "adaptive" and len(widths) == 1:
        logger.warning("sglang-dflash: the attention backend verifies only the full block, so the "
                       "adaptive policy cannot turn speculation off; it stays on")
