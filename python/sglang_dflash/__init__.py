"""sglang-dflash: DFlash / DFlash 2 speculative decoding for SGLang 0.5.23.

The package root imports nothing heavy: algorithm modules (`draft`, `accept`,
`select`, ...) need only torch; `sglang_dflash.adapter` is the one place that
imports SGLang, and it is loaded by SGLang's plugin entry point.
"""

__version__ = "0.1.0"
SGLANG_VERSION = "0.5.23"
