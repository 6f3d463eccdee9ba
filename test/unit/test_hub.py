"""Drafter path resolution: local directories and Hugging Face Hub ids, offline.

Each test lays out a Hugging Face cache in a tmp dir the way huggingface_hub
writes one (models--org--name/{blobs, refs/<ref>, snapshots/<commit>/<file> ->
../../blobs/<hash>}) and points HF_HOME / HF_HUB_CACHE at it with
HF_HUB_OFFLINE=1, so nothing touches the network.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

pytest.importorskip("huggingface_hub")

from sglang_dflash.checkpoint import load_drafter, save_drafter  # noqa: E402
from sglang_dflash.config import parse_drafter_config  # noqa: E402
from sglang_dflash.hub import DrafterPathError, resolve_drafter_path  # noqa: E402
from sglang_dflash.model import DFlashDrafter  # noqa: E402

REPO = "org/name"
COMMIT = "a" * 40
OTHER_COMMIT = "b" * 40
TARGET = dict(target_hidden_size=32, target_vocab_size=96, target_num_layers=4)


def cfg_dict(block_size=4):
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "vocab_size": 96, "rope_theta": 10000.0, "num_target_layers": 4,
        "dflash_config": {"block_size": block_size, "target_layer_ids": [0, 2],
                          "mask_token_id": 95},
    }


def drafter_files(tmp_path: Path, block_size=4) -> dict[str, bytes]:
    """config.json + model.safetensors of a tiny drafter, as bytes."""
    raw = cfg_dict(block_size)
    out = tmp_path / f"src-{block_size}"
    save_drafter(DFlashDrafter(parse_drafter_config(raw)), raw, out)
    return {p.name: p.read_bytes() for p in out.iterdir()}


def add_snapshot(cache: Path, repo: str, commit: str, files: dict[str, bytes],
                 refs: tuple[str, ...] = ("main",)) -> Path:
    """Write one snapshot of `repo` into a Hugging Face cache layout."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def offline_home(tmp_path, monkeypatch):
    """HF_HOME in tmp_path, offline; returns the hub cache directory."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = home / "hub"
    cache.mkdir(parents=True)
    return cache


def test_local_directory_is_returned(tmp_path):
    files = drafter_files(tmp_path)
    local = tmp_path / "drafter"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
    assert resolve_drafter_path(str(local), revision="ignored") == local.resolve()


@pytest.mark.parametrize("remove,words", [
    ("config.json", ["not a drafter directory", "config.json"]),
    ("model.safetensors", ["not a drafter directory", "*.safetensors"]),
])
def test_local_directory_that_is_not_a_drafter(tmp_path, remove, words):
    files = drafter_files(tmp_path)
    local = tmp_path / "drafter"
    local.mkdir()
    for name, data in files.items():
        if name != remove:
            (local / name).write_bytes(data)
    with pytest.raises(DrafterPathError) as info:
        resolve_drafter_path(str(local), None)
    for word in [str(local), *words]:
        assert word in str(info.value)


def test_local_file_is_refused(tmp_path):
    f = tmp_path / "config.json"
    f.write_text("{}")
    with pytest.raises(DrafterPathError, match="is a file"):
        resolve_drafter_path(str(f), None)


def test_hub_id_from_the_offline_cache(tmp_path, offline_home):
    snapshot = add_snapshot(offline_home, REPO, COMMIT, drafter_files(tmp_path))
    path = resolve_drafter_path(REPO, None)
    assert path == snapshot.resolve()
    drafter = load_drafter(path, **TARGET)
    assert drafter.cfg.block_size == 4


def test_hub_revision_branch_tag_and_commit(tmp_path, offline_home):
    add_snapshot(offline_home, REPO, COMMIT, drafter_files(tmp_path, block_size=4))
    other = add_snapshot(offline_home, REPO, OTHER_COMMIT, drafter_files(tmp_path, block_size=6),
                         refs=("v2",))
    assert load_drafter(resolve_drafter_path(REPO, "main"), **TARGET).cfg.block_size == 4
    assert resolve_drafter_path(REPO, "v2") == other.resolve()
    assert load_drafter(resolve_drafter_path(REPO, OTHER_COMMIT), **TARGET).cfg.block_size == 6


def test_hub_cache_from_hf_hub_cache_and_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "explicit-cache"
    snapshot = add_snapshot(cache, REPO, COMMIT, drafter_files(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert resolve_drafter_path(REPO, None) == snapshot.resolve()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert resolve_drafter_path(REPO, None, cache_dir=cache) == snapshot.resolve()


def test_mask_embedding_comes_with_the_snapshot(tmp_path, offline_home):
    files = drafter_files(tmp_path)
    torch.save({"embedding": torch.ones(32), "mask_token_id": 95}, tmp_path / "m.pt")
    files["mask_embedding.pt"] = (tmp_path / "m.pt").read_bytes()
    add_snapshot(offline_home, REPO, COMMIT, files)
    drafter = load_drafter(resolve_drafter_path(REPO, None), **TARGET)
    assert drafter.mask_embedding_token_id == 95


def test_not_cached_while_offline(offline_home):
    with pytest.raises(DrafterPathError) as info:
        resolve_drafter_path("org/missing", None)
    message = str(info.value)
    for word in ("org/missing", "not in the Hugging Face cache", str(offline_home),
                 "HF_HUB_OFFLINE"):
        assert word in message, (word, message)


def test_unknown_revision_while_offline(tmp_path, offline_home):
    add_snapshot(offline_home, REPO, COMMIT, drafter_files(tmp_path))
    with pytest.raises(DrafterPathError, match=r"org/name \(revision v9\).*not in the"):
        resolve_drafter_path(REPO, "v9")


def test_incomplete_snapshot_while_offline(tmp_path, offline_home):
    files = drafter_files(tmp_path)
    weights = files.pop("model.safetensors")
    index = {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors",
                            "norm.weight": "model-00002-of-00002.safetensors"}}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    files["model-00001-of-00002.safetensors"] = weights  # the second shard never arrived
    add_snapshot(offline_home, REPO, COMMIT, files)
    with pytest.raises(DrafterPathError) as info:
        resolve_drafter_path(REPO, None)
    assert "incomplete" in str(info.value)
    assert "model-00002-of-00002.safetensors" in str(info.value)


@pytest.mark.parametrize("bad", ["a/b/c", "./not-here", "/abs/not-here"])
def test_neither_a_directory_nor_a_repo_id(bad, offline_home):
    with pytest.raises(DrafterPathError, match="neither an existing local directory nor"):
        resolve_drafter_path(bad, None)


def test_online_download_when_not_cached(tmp_path, monkeypatch):
    """Not cached and online: one snapshot_download with the revision, the cache
    and the drafter's file patterns (the call SGLang makes, narrowed)."""
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cache, files, calls = tmp_path / "cache", drafter_files(tmp_path), []

    def fake_snapshot_download(repo_id, *, revision, cache_dir, allow_patterns,
                               local_files_only=False):
        calls.append((repo_id, revision, Path(cache_dir), allow_patterns, local_files_only))
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        if repo_id == "org/gone":
            response = httpx.Response(404, request=httpx.Request("GET", "https://hf.co"))
            raise RepositoryNotFoundError("404", response=response)
        return str(add_snapshot(cache_dir, repo_id, COMMIT, files))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    path = resolve_drafter_path(REPO, "main", cache_dir=cache)
    assert load_drafter(path, **TARGET).cfg.block_size == 4
    assert calls == [(REPO, "main", cache, ["*.json", "*.safetensors", "mask_embedding.pt"],
                      True),
                     (REPO, "main", cache, ["*.json", "*.safetensors", "mask_embedding.pt"],
                      False)]
    with pytest.raises(DrafterPathError, match="org/gone.*not on the Hugging Face Hub"):
        resolve_drafter_path("org/gone", None, cache_dir=cache)
