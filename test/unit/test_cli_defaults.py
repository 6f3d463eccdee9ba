"""`sglang-dflash serve` CPU defaults: one table, as Engine keywords and as flags."""

from sglang_dflash.cli import CPU_DEFAULTS, CPU_ENGINE_DEFAULTS, with_cpu_defaults


def test_flags_mirror_engine_keywords():
    flags = dict((flag, values) for flag, values in CPU_DEFAULTS)
    assert flags["--device"] == ["cpu"]
    assert flags["--attention-backend"] == ["torch_native"]
    assert flags["--disable-cuda-graph"] == []  # a True keyword is a bare flag
    assert flags["--max-total-tokens"] == [str(CPU_ENGINE_DEFAULTS["max_total_tokens"])]
    assert len(flags) == len(CPU_ENGINE_DEFAULTS)


def test_user_flags_win_and_missing_ones_are_added():
    args = with_cpu_defaults(["--model-path", "m", "--max-total-tokens=4096", "--device", "cpu"])
    assert args.count("--device") == 1
    assert "--max-total-tokens" not in args and "--max-total-tokens=4096" in args
    assert args[args.index("--attention-backend") + 1] == "torch_native"
    assert "--disable-cuda-graph" in args
