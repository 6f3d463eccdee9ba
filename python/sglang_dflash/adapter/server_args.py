"""Our `_handle_dflash`: server-argument resolution for `--speculative-algorithm DFLASH`.

Installed as a HookRegistry REPLACE of
`sglang.srt.arg_groups.speculative_hook._handle_dflash`. Differences from
upstream: CPU is a supported device; the drafter checkpoint is validated here,
in the launching process, so a broken drafter fails start-up with the reason
before any worker process is spawned; the block size defaults to the
drafter's own `block_size`; on a CPU `--max-running-requests` is left to
SGLang's plain sizing instead of the speculative cap of 48 (a target with
recurrent state keeps 48); SGLang's overlap scheduler is left on unless the
user disables it (`--disable-overlap-schedule`). Every decision is written
through `declare_resolution`, like upstream, never by plain assignment.
"""

from __future__ import annotations

import json
import logging
import os

from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
from sglang.srt.runtime_context import attn_dp_enabled_of

from sglang_dflash.policy import PolicyConfig, load_policy_config
from sglang_dflash.target_support import has_recurrent_state, unsupported_target_reason

logger = logging.getLogger(__name__)

SOURCE = "sglang_dflash._handle_dflash"
SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # SGLang's default for every speculative algorithm


def default_max_running_requests(device, recurrent_state: bool) -> int | None:
    """`--max-running-requests` when the user gave none: on a CPU nothing, so the
    scheduler sizes it as for plain decoding (a cap below plain's makes a loaded
    server queue requests that plain decoding would batch, at the load where
    speculation is off and the two should run level; docs/decisions.md).
    SGLang's speculative default otherwise: on CUDA (unmeasured there by us, so
    upstream's choice stands) and for a target with recurrent state, whose
    speculative state buffers SGLang sizes from this number (it requires one)."""
    if str(device) == "cpu" and not recurrent_state:
        return None
    return SPECULATIVE_MAX_RUNNING_REQUESTS


def is_dflash(algorithm) -> bool:
    """Whether a server's `speculative_algorithm` (raw or resolved) is DFLASH:
    the hooks that change plain SGLang's behaviour act only on such servers."""
    return str(algorithm).upper().endswith("DFLASH")


def _target_text_config(cfg):
    """The target's HF text config (the config itself for a text-only model)."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    target = get_config(
        cfg.model_path,
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
        model_override_args=json.loads(cfg.json_model_override_args),
    )
    return getattr(target, "text_config", None) or target


def _target_dims(cfg, text) -> tuple[int, int, int]:
    """(hidden size, vocabulary, depth) of the target (its text config `text`),
    depth as SGLang counts it."""
    reason = unsupported_target_reason(text.to_dict())
    if reason is not None:
        raise ValueError(f"sglang-dflash DFLASH cannot serve the target {cfg.model_path!r}: {reason}; "
                         "set SGLANG_DFLASH_UPSTREAM=1 to use SGLang's own worker")
    depth = int(text.num_hidden_layers) * int(getattr(text, "num_loops", 1) or 1)
    return int(text.hidden_size), int(text.vocab_size), depth


def _target_tokenizer(cfg):
    if cfg.skip_tokenizer_init:
        return None
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(cfg.tokenizer_path or cfg.model_path, tokenizer_mode=cfg.tokenizer_mode,
                         trust_remote_code=cfg.trust_remote_code, tokenizer_revision=cfg.revision)


def validate_drafter(cfg, text):
    """Resolve the drafter (a local directory or a hub id, as SGLang resolves model
    paths), then parse and check it (config, weights, mask token) against the
    target (its text config `text`). Returns (local path, DrafterConfig)."""
    from sglang_dflash.checkpoint import load_drafter
    from sglang_dflash.config import resolve_mask_token_id
    from sglang_dflash.hub import resolve_drafter_path

    path = resolve_drafter_path(cfg.speculative_draft_model_path,
                                cfg.speculative_draft_model_revision,
                                cache_dir=getattr(cfg, "download_dir", None))
    hidden, vocab, layers = _target_dims(cfg, text)
    # NOTE: loads the weights once in the launching process so that every check
    # (names, shapes, finiteness) runs before workers start; cheap for the
    # drafters we ship, a header-only check would be cheaper for large ones.
    drafter = load_drafter(path, target_hidden_size=hidden, target_vocab_size=vocab,
                           target_num_layers=layers)
    if drafter.cfg.mask_token_id is None:  # resolved from the tokenizer: fail here if it cannot be
        resolve_mask_token_id(drafter.cfg, _target_tokenizer(cfg), vocab)
    return path, drafter.cfg


POLICY_ENV = "SGLANG_DFLASH_POLICY"  # alias of --speculative-adaptive-config (inline JSON or a path)
CONFIG_FLAG = "--speculative-adaptive-config"
ADAPTIVE_FLAG = "--speculative-adaptive"


def policy_config(cfg) -> PolicyConfig:
    """The speculation policy of a server: `--speculative-adaptive-config PATH`
    (or its alias, the SGLANG_DFLASH_POLICY environment variable, inline JSON
    or a path), default adaptive. `--speculative-adaptive` asks for adaptive
    explicitly, so a config with another mode contradicts it. `cfg`: the
    server arguments (the config path is passed through unresolved)."""
    path = getattr(cfg, "speculative_adaptive_config", None)
    env = os.environ.get(POLICY_ENV, "").strip()
    if path and env:
        raise ValueError(f"sglang-dflash: both {CONFIG_FLAG} and {POLICY_ENV} are set; "
                         f"give the policy once ({POLICY_ENV} is an alias of the flag)")
    policy = load_policy_config(path, CONFIG_FLAG) if path else load_policy_config(env, POLICY_ENV)
    if getattr(cfg, "speculative_adaptive", False) and policy.mode != "adaptive":
        raise ValueError(f"sglang-dflash: {ADAPTIVE_FLAG} contradicts the policy's mode = "
                         f"{policy.mode!r}; drop one of them")
    return policy


def keep_adaptive_for_dflash(original, server_args, *args, **kwargs):
    """AROUND SGLang's `_maybe_disable_adaptive`: for DFLASH, `--speculative-adaptive`
    selects our policy (validated in `handle_dflash`) instead of being turned
    off with a warning that it is EAGLE-only. SGLang's own adaptive machinery
    (EAGLE's step table) stays off, as upstream leaves it for DFLASH."""
    cfg = resolving_view(server_args)
    if str(cfg.speculative_algorithm).upper() != "DFLASH":
        return original(server_args, *args, **kwargs)
    # Checked here too: the flag is cleared below, before handle_dflash runs.
    policy_config(cfg)
    declare_resolution(server_args, SOURCE, speculative_adaptive=False)
    logger.info("sglang-dflash: %s selects the DFLASH speculation policy (adaptive)", ADAPTIVE_FLAG)
    return None


def _check_device_and_parallelism(cfg) -> None:
    device = str(cfg.device)
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(
            f"sglang-dflash DFLASH supports devices 'cuda' and 'cpu', got {device!r}; "
            "set SGLANG_DFLASH_UPSTREAM=1 to use SGLang's own worker"
        )
    if attn_dp_enabled_of(cfg):
        raise ValueError("sglang-dflash DFLASH does not support DP attention yet")
    if cfg.pp_size != 1:
        raise ValueError("DFLASH speculative decoding only supports pp_size == 1")
    if cfg.speculative_draft_model_path is None:
        raise ValueError(
            "DFLASH speculative decoding requires --speculative-draft-model-path"
        )


def _resolve_block_size(server_args, cfg, drafter_block_size: int) -> int:
    num_draft = cfg.speculative_num_draft_tokens
    alias = cfg.speculative_dflash_block_size
    if alias is not None and num_draft is not None and int(alias) != int(num_draft):
        raise ValueError(
            "--speculative-num-draft-tokens and --speculative-dflash-block-size differ "
            f"({num_draft} vs {alias}); for DFLASH they are the same block size"
        )
    block = num_draft if num_draft is not None else alias
    block = drafter_block_size if block is None else int(block)
    if block < 2:
        raise ValueError(f"DFLASH block size must be >= 2, got {block}")
    return block


def _not_applied(cfg) -> list[tuple[str, str]]:
    """SGLang flags its own DFLASH worker honours that ours accepts without
    acting on them, each with what happens instead (logged at start-up)."""
    out = []
    if cfg.speculative_draft_window_size is not None:
        # Upstream keeps a compact drafter KV cache of the last W tokens; ours has
        # no cache of its own to compact (context rows live at the target's slots).
        out.append((f"--speculative-draft-window-size {cfg.speculative_draft_window_size}",
                    "the drafter attends to each request's whole context (output is unaffected; "
                    "drafts may differ from SGLang's own DFLASH worker)"))
    single, acc = cfg.speculative_accept_threshold_single, cfg.speculative_accept_threshold_acc
    if (single is not None and float(single) != 1.0) or (acc is not None and float(acc) != 1.0):
        out.append((f"--speculative-accept-threshold-single {single} / -acc {acc}",
                    "sampled drafts are accepted with probability min(1, p/q) exactly, so the "
                    "output follows the target's distribution (SGLang relaxes it by the thresholds)"))
    load_format = cfg.speculative_draft_load_format
    if load_format not in (None, "auto", "safetensors"):
        out.append((f"--speculative-draft-load-format {load_format}",
                    "the drafter's weights are read from its checkpoint's safetensors"))
    if cfg.speculative_draft_kv_cache_dtype not in (None, "auto"):
        out.append((f"--speculative-draft-kv-cache-dtype {cfg.speculative_draft_kv_cache_dtype}",
                    "the drafter's context rows are kept in the drafter's dtype"))
    if getattr(cfg, "speculative_use_block_verification", False):
        out.append(("--speculative-use-block-verification",
                    "sampled drafts are verified token by token (exact rejection sampling, the same "
                    "output distribution)"))
    return out


def handle_dflash(server_args) -> None:
    cfg = resolving_view(server_args)
    _check_device_and_parallelism(cfg)
    text = _target_text_config(cfg)  # read once: the drafter's checks and the request cap
    drafter_path, drafter_cfg = validate_drafter(cfg, text)
    policy = policy_config(cfg)  # a bad policy fails here, before workers start
    block = _resolve_block_size(server_args, cfg, drafter_cfg.block_size)
    for name in ("speculative_num_steps", "speculative_eagle_topk"):
        value = getattr(cfg, name)
        if value is not None and int(value) != 1:
            logger.warning("DFLASH uses %s == 1; overriding %s", name, value)
    for flag, reason in _not_applied(cfg):
        logger.warning("sglang-dflash: %s is not applied: %s", flag, reason)
    fields = dict(
        speculative_num_steps=1,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=block,
        # The resolved local snapshot of a hub id, for the workers and SGLang's draft config.
        speculative_draft_model_path=str(drafter_path),
        # SGLang's overlap scheduler stays as the user set it (on by default):
        # the worker follows the spec-v2 contract (publishes next seq_lens,
        # relays only bonus tokens, takes accept counts in launch order).
    )
    if cfg.speculative_draft_attention_backend is None:
        # Our drafter runs its own attention; record the target's for tools that read it.
        fields["speculative_draft_attention_backend"] = cfg.attention_backend
    if cfg.max_running_requests is None:
        recurrent = has_recurrent_state(text.to_dict())
        cap = default_max_running_requests(cfg.device, recurrent)
        if cap is not None:
            fields["max_running_requests"] = cap
    declare_resolution(server_args, SOURCE, **fields)
    logger.info(
        "sglang-dflash: DFLASH with a v%d drafter, block size %d, policy %s",
        drafter_cfg.version, block, policy.mode,
    )
