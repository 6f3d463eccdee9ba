"""The bundled model pair.

`python -m sglang_dflash.demo --print-paths` prints the target and the DFLASH
drafter directories, one per line: the demo pair in `assets/demo/` (a 4.2M
parameter Qwen3-architecture target trained here with its own BPE tokenizer
and chat template, and a DFlash 2 drafter, block 8, K 16, trained for it with
`sglang-dflash train`; see `assets/demo/MODEL_CARD.md`). `sglang-dflash demo`
serves this pair; the tests use the smaller tiny pair (`tiny_paths()`, built by
`python -m sglang_dflash.tools.tiny_models`).
"""

from __future__ import annotations

import argparse
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
ASSETS = os.path.join(_HERE, "assets", "tiny")
DEMO_ASSETS = os.path.join(_HERE, "assets", "demo")


def tiny_paths() -> dict[str, str]:
    """Directories of the bundled tiny models by role."""
    names = ("target", "drafter-random", "drafter-trained", "dflash2-random",
             "hybrid-target", "hybrid-drafter-trained", "hybrid-moe-target", "hybrid-moe-drafter-trained",
             "hybrid-next-target", "hybrid-next-drafter-trained", "swa-target", "swa-drafter-trained",
             "swa-drafter-laguna", "lfm2-target", "lfm2-drafter-trained", "nemotron-h-target",
             "nemotron-h-drafter-trained", "mla-target", "mla-drafter-trained", "vl-target", "vl-drafter",
             "llama-target", "llama-drafter-trained")
    return {name: os.path.join(ASSETS, name) for name in names}


def demo_pair() -> tuple[str, str]:
    """(target, drafter) directories of the bundled demo pair."""
    return os.path.join(DEMO_ASSETS, "target"), os.path.join(DEMO_ASSETS, "drafter")


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
