#!/usr/bin/env python
"""Download the kit's wheels into benchmark/gpu_kit/wheels/ (git-ignored; carried).

    python benchmark/gpu_kit/fetch_wheels.py            # download + trim + size check
    python benchmark/gpu_kit/fetch_wheels.py --check    # size check only

Each line of requirements.txt is fetched with `pip download --no-deps` for
CPython 3.12 on manylinux x86_64 (the H200 image's python3), whatever this
host's Python is. The sglang wheel (37 MiB) is then rewritten without what a
text-only Qwen3 server never imports: the diffusion runtime
(`sglang/multimodal_gen`), the test suites (all of `sglang/test` but
`scripted_runtime`, which the scheduler imports lazily), and four Rust
extensions (`_server`, `_grpc`, `_bench`, `_multimodal`: the Rust HTTP
front-end, gRPC, the benchmark client, image processing; the Python server
imports none of them by default). Its RECORD is regenerated so that pip
installs it like the original. The Rust radix-tree core
(`mem_cache/rust_tree_core`) stays, although the kit selects the Python tree
core on torch 2.11 (see README.md).

The total must fit the device tool's 64 MiB together with the working tree;
the script prints both and exits 1 if it does not.
"""

from __future__ import annotations

import argparse
import base64
import csv
import glob
import hashlib
import io
import os
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WHEELS = os.path.join(HERE, "wheels")
LIMIT = 64 * 2**20  # the device tool's limit on what travels (tree + carried paths)
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_5_x86_64"]

SGLANG_DROP_PREFIXES = (
    "sglang/multimodal_gen/",
    "sglang/srt/rust_extensions/_server.",
    "sglang/srt/rust_extensions/_grpc.",
    "sglang/srt/rust_extensions/_bench.",
    "sglang/srt/rust_extensions/_multimodal.",
)
SGLANG_KEEP_UNDER_TEST = ("sglang/test/__init__.py", "sglang/test/scripted_runtime/")


def requirements(path: str) -> list[str]:
    out = []
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def download(reqs: list[str]) -> None:
    os.makedirs(WHEELS, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           "--abi", "abi3", "--abi", "none", "-d", WHEELS, "-q"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    for req in reqs:
        print("fetch", req, flush=True)
        subprocess.run(cmd + [req], check=True)


def _dropped(name: str) -> bool:
    if name.startswith(SGLANG_DROP_PREFIXES):
        return True
    if name.startswith("sglang/test/"):
        return not name.startswith(SGLANG_KEEP_UNDER_TEST)
    return False


def trim_sglang() -> None:
    """Rewrite wheels/sglang-*.whl without the parts listed above (idempotent)."""
    paths = glob.glob(os.path.join(WHEELS, "sglang-*.whl"))
    if not paths:
        return
    path = paths[0]
    with zipfile.ZipFile(path) as src:
        names = src.namelist()
        if not any(_dropped(n) for n in names):
            print("sglang wheel already trimmed")
            return
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows, buf = [], io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
            for info in src.infolist():
                name = info.filename
                if name == record_name or _dropped(name):
                    continue
                data = src.read(name)
                dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                rows.append((name, "sha256=" + digest.decode(), str(len(data))))
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            writer.writerows(rows)
            writer.writerow((record_name, "", ""))
            dst.writestr(record_name, text.getvalue())
    before = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    print(f"trimmed {os.path.basename(path)}: {before / 2**20:.1f} -> "
          f"{os.path.getsize(path) / 2**20:.1f} MiB")


def tree_bytes() -> int:
    """Bytes of what the device tool sends besides carried paths: tracked files
    plus untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True).stdout
    total = 0
    for rel in out.decode().split("\0"):
        p = os.path.join(REPO, rel)
        if rel and os.path.isfile(p) and not os.path.islink(p):
            total += os.path.getsize(p)
    return total


def check() -> bool:
    wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
    size = sum(os.path.getsize(p) for p in wheels)
    for p in wheels:
        print(f"{os.path.getsize(p) / 2**20:8.2f} MiB  {os.path.basename(p)}")
    tree = tree_bytes()
    total = size + tree
    print(f"wheels {size / 2**20:.1f} MiB ({len(wheels)} files) + working tree "
          f"{tree / 2**20:.1f} MiB = {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB")
    return total <= LIMIT


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="size check only")
    parser.add_argument("--requirements", default=os.path.join(HERE, "requirements.txt"))
    args = parser.parse_args(argv)
    if not args.check:
        download(requirements(args.requirements))
        trim_sglang()
    ok = check()
    print("fits" if ok else "DOES NOT FIT: carry less")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
