"""Check and apply the diffs in `patches/` against the installed sglang package.

    sglang-dflash patches check [--dir DIR]   exit 1 unless every patch applies cleanly
    sglang-dflash patches apply [--dir DIR]   apply them (idempotent: already-applied ones are skipped)
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import subprocess
import sys

REPO_PATCHES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "patches")


def sglang_dir() -> str:
    spec = importlib.util.find_spec("sglang")  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed")
    return list(spec.submodule_search_locations)[0]


def list_patches(patch_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(patch_dir, "*.patch")))


def _git_apply(patch: str, target: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["git", "apply", "--unsafe-paths", f"--directory={os.path.relpath(target, os.getcwd())}", *extra, patch]
    return subprocess.run(cmd, capture_output=True, text=True)


def check(patch_dir: str, target: str | None = None) -> list[tuple[str, str]]:
    """Patches that do not apply cleanly, as (name, reason); empty when all do."""
    target = target or sglang_dir()
    failures = []
    for patch in list_patches(patch_dir):
        if _git_apply(patch, target, "--check", "--reverse").returncode == 0:
            continue  # already applied
        proc = _git_apply(patch, target, "--check")
        if proc.returncode != 0:
            failures.append((os.path.basename(patch), proc.stderr.strip()))
    return failures


def apply(patch_dir: str, target: str | None = None) -> None:
    target = target or sglang_dir()
    failures = check(patch_dir, target)
    if failures:
        raise RuntimeError(f"patches do not apply: {failures}")
    for patch in list_patches(patch_dir):
        if _git_apply(patch, target, "--check", "--reverse").returncode != 0:
            subprocess.run(["git", "apply", "--unsafe-paths",
                            f"--directory={os.path.relpath(target, os.getcwd())}", patch], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sglang-dflash patches")
    parser.add_argument("action", choices=["check", "apply"])
    parser.add_argument("--dir", default=os.path.normpath(REPO_PATCHES))
    args = parser.parse_args(argv)
    patches = list_patches(args.dir)
    if args.action == "check":
        failures = check(args.dir)
        for name, reason in failures:
            print(f"FAIL {name}: {reason}")
        print(f"{len(patches) - len(failures)}/{len(patches)} patches apply cleanly to {sglang_dir()}")
        sys.exit(1 if failures else 0)
    apply(args.dir)
    print(f"applied {len(patches)} patches to {sglang_dir()}")


if __name__ == "__main__":
    main()
