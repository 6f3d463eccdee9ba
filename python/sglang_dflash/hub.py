"""Resolve `--speculative-draft-model-path` to a local drafter directory.

SGLang 0.5.23 accepts a local directory or a Hugging Face repo id for the
draft model: weights come from `download_weights_from_hf`
(`srt/model_loader/weight_utils.py`), which returns a local directory as is,
else uses a complete snapshot already in the Hugging Face cache, else calls
`huggingface_hub.snapshot_download(repo_id, revision=..., cache_dir=...,
local_files_only=HF_HUB_OFFLINE)`. `resolve_drafter_path` does the same for
the files a drafter needs (config.json, *.safetensors with their index,
mask_embedding.pt), so that `checkpoint.load_drafter` always reads a local
directory, and says why when it cannot: not found locally while offline, an
unknown repo or revision, or a directory that is not a drafter checkpoint.

The cache location and offline flag are read when called (`cache_dir`, else
HF_HUB_CACHE / HF_HOME as huggingface_hub reads them), so a process that sets
them after importing huggingface_hub is honoured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DRAFTER_FILE_PATTERNS = ["*.json", "*.safetensors", "mask_embedding.pt"]
_INDEX_NAME = "model.safetensors.index.json"
_TRUE = {"1", "ON", "YES", "TRUE"}


class DrafterPathError(ValueError):
    """The drafter path or Hub id cannot be turned into a drafter directory."""


def resolve_drafter_path(path_or_id: str, revision: str | None = None, *,
                         cache_dir: str | os.PathLike | None = None) -> Path:
    """A local directory holding the drafter's config.json and weights.

    Args:
        path_or_id: a local directory, or a Hub repo id ("org/name").
        revision: branch, tag or commit of a Hub id (None = "main"); ignored
            for a local directory, as in SGLang.
        cache_dir: the Hugging Face cache (SGLang's --download-dir); None reads
            HF_HUB_CACHE / HF_HOME.

    Raises:
        DrafterPathError naming the path or repo id and the reason.
    """
    local = Path(path_or_id).expanduser()
    if local.exists():
        return _check_drafter_dir(local, str(local))
    repo_id = _as_repo_id(path_or_id)
    cache = _cache_dir(cache_dir)
    where = f"{repo_id} (revision {revision or 'main'})"
    snapshot = _cached_snapshot(repo_id, revision, cache)
    if snapshot is None or _missing_files(snapshot):
        if _offline():
            raise DrafterPathError(_offline_message(where, snapshot, cache))
        snapshot = _download(repo_id, revision, cache, where)
    return _check_drafter_dir(snapshot, f"{where} at {snapshot}")


def _as_repo_id(path_or_id: str) -> str:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(path_or_id)
    except HFValidationError:
        raise DrafterPathError(f"drafter path {path_or_id!r} is neither an existing local "
                               "directory nor a Hugging Face repo id ('org/name')") from None
    return path_or_id


def _cache_dir(cache_dir) -> Path:
    """The cache huggingface_hub would use, with its environment read now."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or \
        os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def _cached_snapshot(repo_id: str, revision: str | None, cache: Path) -> Path | None:
    """The cached snapshot for the revision, or None (no network)."""
    from huggingface_hub import errors, snapshot_download

    # IncompleteSnapshotError (newer huggingface_hub): the caller re-fetches
    # online and explains offline, as for a snapshot missing from the cache.
    absent = (errors.LocalEntryNotFoundError, FileNotFoundError,
              getattr(errors, "IncompleteSnapshotError", errors.LocalEntryNotFoundError))
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                 allow_patterns=DRAFTER_FILE_PATTERNS, local_files_only=True)
    except absent:
        return None
    return Path(path)


def _download(repo_id: str, revision: str | None, cache: Path, where: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                      allow_patterns=DRAFTER_FILE_PATTERNS))
    except RevisionNotFoundError:
        raise DrafterPathError(f"drafter {where}: the revision does not exist on the "
                               "Hugging Face Hub") from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise DrafterPathError(f"drafter {where}: the repository is not on the Hugging Face "
                               f"Hub or not accessible ({type(exc).__name__}; a private or "
                               "gated repo needs HF_TOKEN)") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise DrafterPathError(f"drafter {where}: download from the Hugging Face Hub failed "
                               f"and the cache at {cache} has no complete copy ({exc})") from None


def _offline_message(where: str, snapshot: Path | None, cache: Path) -> str:
    state = (f"the cached snapshot {snapshot} is incomplete ({', '.join(_missing_files(snapshot))})"
             if snapshot is not None else f"it is not in the Hugging Face cache at {cache}")
    return (f"drafter {where}: {state}, and HF_HUB_OFFLINE is set, so it cannot be "
            "downloaded (download it first, e.g. `hf download <repo>`, or pass a local "
            "directory)")


def _missing_files(root: Path) -> list[str]:
    """What a drafter directory lacks: config.json, weights, shards its index names."""
    missing = [] if (root / "config.json").is_file() else ["config.json"]
    if not any(p.is_file() for p in root.glob("*.safetensors")):  # is_file: no broken links
        missing.append("*.safetensors weights")
    index = root / _INDEX_NAME
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (json.JSONDecodeError, AttributeError):
            return missing + [f"a readable {_INDEX_NAME}"]
        missing += sorted(s for s in shards if not (root / s).is_file())
    return missing


def _check_drafter_dir(root: Path, origin: str) -> Path:
    if not root.is_dir():
        raise DrafterPathError(f"drafter path {origin} is a file, not a drafter directory")
    missing = _missing_files(root)
    if missing:
        raise DrafterPathError(f"drafter path {origin} is not a drafter directory: missing "
                               f"{', '.join(missing)}")
    return root.resolve()
