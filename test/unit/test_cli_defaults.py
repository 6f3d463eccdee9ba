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


def test_float32_checkpoints_keep_float32_on_cpu(tmp_path):
    """SGLang's dtype "auto" downcasts float32 checkpoints to float16, the
    slowest float type of torch's CPU kernels; the CPU defaults keep float32."""
    import json

    from sglang_dflash.demo import demo_pair

    target, _ = demo_pair()
    args = with_cpu_defaults(["--model-path", target])
    assert args[args.index("--dtype") + 1] == "float32"
    given = with_cpu_defaults([f"--model-path={target}", "--dtype=bfloat16"])
    assert "--dtype" not in given and "--dtype=bfloat16" in given  # the user's dtype wins
    for stored, expect in (("bfloat16", None), ("float16", None), ("float32", "float32"), (None, "float32")):
        model = tmp_path / str(stored)
        model.mkdir()
        (model / "config.json").write_text(json.dumps({} if stored is None else {"torch_dtype": stored}))
        args = with_cpu_defaults(["--model-path", str(model)])
        assert (args[args.index("--dtype") + 1] if "--dtype" in args else None) == expect, stored
    assert "--dtype" not in with_cpu_defaults(["--model-path", "org/hub-id"])  # not local: SGLang decides


def test_cpu_env_asks_for_huge_pages_unless_set():
    from sglang_dflash.cpu_runtime import cpu_env

    env = cpu_env({"PYTHONPATH": ""})
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["THP_MEM_ALLOC_ENABLE"] == "1"
    assert cpu_env({"THP_MEM_ALLOC_ENABLE": "0"})["THP_MEM_ALLOC_ENABLE"] == "0"  # the user's wins


def test_idle_cpu_server_sleeps_unless_told_otherwise():
    """An idle SGLang scheduler busy-polls a core; on CPU hosts it sleeps by default."""
    assert "--sleep-on-idle" in with_cpu_defaults(["--model-path", "m"])
    args = with_cpu_defaults(["--model-path", "m", "--no-sleep-on-idle"])
    assert "--sleep-on-idle" not in args and "--no-sleep-on-idle" not in args  # ours, not SGLang's
    assert with_cpu_defaults(["--sleep-on-idle"]).count("--sleep-on-idle") == 1
