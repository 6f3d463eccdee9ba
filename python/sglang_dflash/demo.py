"""The bundled model pair.

`python -m sglang_dflash.demo --print-paths` prints the target and the DFLASH
drafter directories, one per line. Today these are the tiny test pair (a random
Qwen3-architecture target and a drafter trained on its own outputs, built by
`python -m sglang_dflash.tiny_models`); a trained demo pair replaces them when
the training issue lands.
"""

from __future__ import annotations

import argparse
import os

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny")


def tiny_paths() -> dict[str, str]:
    """Directories of the bundled tiny models by role."""
    names = ("target", "drafter-random", "drafter-trained", "dflash2-random")
    return {name: os.path.join(ASSETS, name) for name in names}


def demo_pair() -> tuple[str, str]:
    paths = tiny_paths()
    return paths["target"], paths["drafter-trained"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-paths", action="store_true", help="print target and drafter dirs")
    args = parser.parse_args(argv)
    target, drafter = demo_pair()
    if args.print_paths:
        print(target)
        print(drafter)
        return
    parser.print_help()


if __name__ == "__main__":
    main()
