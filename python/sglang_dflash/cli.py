"""`sglang-dflash` command line.

  sglang-dflash serve ARGS...   run `python -m sglang.launch_server ARGS...`; on a
                                host without CUDA, first set up SGLang's CPU engine
                                (sgl_kernel stand-in, SGLANG_USE_CPU_ENGINE=1) and
                                add CPU defaults for arguments the user did not give
                                (--no-sleep-on-idle keeps an idle scheduler polling).
  sglang-dflash demo ARGS...    serve the bundled pair with DFLASH (`serve` with the
                                pair's --model-path/--speculative-* arguments filled in).
  sglang-dflash train ARGS...   train a DFlash / DFlash 2 drafter (python -m sglang_dflash.train --help).
  sglang-dflash cpu-env         print the shell exports for the plain CPU command.
  sglang-dflash patches check|apply   check / apply `patches/` against the installed sglang.
"""

from __future__ import annotations

import os
import sys

# Server arguments we default on CPU (sgl.Engine keywords), with the reason. A
# user-given flag always wins. Benchmarks and tests that start `sgl.Engine` on
# CPU start from these too.
CPU_ENGINE_DEFAULTS: dict[str, object] = dict(
    device="cpu",
    # torch SDPA; our plugin adds TARGET_VERIFY to it.
    attention_backend="torch_native",
    sampling_backend="pytorch",
    # SGLang's default LoRA backends are Triton kernels; used only with --enable-lora.
    lora_backend="torch_native",
    # CPU graphs require torch.compile and exclude speculation.
    disable_cuda_graph=True,
    # A shared host: do not size the KV cache from most of its RAM.
    max_total_tokens=65536,
    mem_fraction_static=0.3,
    # An idle scheduler otherwise busy-polls: each one holds a whole core.
    sleep_on_idle=True,
)
NO_SLEEP_ON_IDLE = "--no-sleep-on-idle"  # ours: opt out of the sleep_on_idle default

# The same as `launch_server` flags (a True value is a bare flag).
CPU_DEFAULTS: list[tuple[str, list[str]]] = [
    ("--" + key.replace("_", "-"), [] if value is True else [str(value)])
    for key, value in CPU_ENGINE_DEFAULTS.items()
]


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in `args` (`--flag v` or `--flag=v`), the last one given."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def cpu_dtype(model_path: str | None) -> str | None:
    """"float32" for a local checkpoint stored in float32 (or whose config names
    no dtype), else None (SGLang's "auto" keeps the checkpoint's dtype).

    Why: "auto" downcasts a float32 checkpoint to float16, a GPU convention;
    torch's CPU kernels run float16 slowest of the three float types (they
    convert to and from it; docs/decisions.md has the measurement). bfloat16 is
    fast only where the CPU has native bfloat16 units, so the default keeps the
    checkpoint's float32; `--dtype` overrides it."""
    if not model_path:
        return None
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return None  # a hub id or an unusual layout: leave SGLang's default
    import json

    with open(path) as f:
        cfg = json.load(f)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    dtype = (cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype")
             or text.get("torch_dtype"))
    return "float32" if dtype in (None, "float32") else None


def with_cpu_defaults(args: list[str]) -> list[str]:
    out = [a for a in args if a != NO_SLEEP_ON_IDLE]
    for flag, values in CPU_DEFAULTS:
        if flag == "--sleep-on-idle" and NO_SLEEP_ON_IDLE in args:
            continue
        if not _given(out, flag):
            out += [flag, *values]
    if not _given(out, "--dtype"):
        dtype = cpu_dtype(_value(out, "--model-path"))
        if dtype is not None:
            out += ["--dtype", dtype]
    return out


def launch_server_setup(args: list[str], env: dict) -> tuple[list[str], dict]:
    """The `sglang.launch_server` arguments and environment `serve` runs: on a
    host without CUDA, the CPU defaults added and the CPU runtime's environment."""
    from sglang_dflash import cpu_runtime

    if cpu_runtime.cuda_available():
        return list(args), dict(env)
    return with_cpu_defaults(args), cpu_runtime.cpu_env(env)


def serve(args: list[str]) -> None:
    args, env = launch_server_setup(args, os.environ)
    cmd = [sys.executable, "-m", "sglang.launch_server", *args]
    print("sglang-dflash:", " ".join(cmd), flush=True)
    os.execvpe(sys.executable, cmd, env)


def demo(args: list[str]) -> None:
    from sglang_dflash.demo import demo_pair

    target, drafter = demo_pair()
    serve(
        [
            "--model-path", target,
            "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", drafter,
            *args,
        ]
    )


def print_cpu_env() -> None:
    from sglang_dflash import cpu_runtime

    env = cpu_runtime.cpu_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    for key in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE", "TORCHDYNAMO_DISABLE", "THP_MEM_ALLOC_ENABLE"):
        print(f"export {key}={env[key]}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        serve(rest)
    elif cmd == "demo":
        demo(rest)
    elif cmd == "train":
        from sglang_dflash.train.cli import main as train_main

        train_main(rest)
    elif cmd == "patches":
        from sglang_dflash.patches import main as patches_main

        patches_main(rest)
    elif cmd == "cpu-env":
        print_cpu_env()
    else:
        sys.exit(f"sglang-dflash: unknown command {cmd!r}; try 'sglang-dflash --help'")


if __name__ == "__main__":
    main()
