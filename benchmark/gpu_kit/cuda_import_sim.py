"""Import SGLang's server modules as if CUDA were present (torch.cuda.is_available
patched to True; nothing runs on a GPU), to find import-time failures of the CUDA
path with whichever sgl_kernel comes first on sys.path. On CPU, e.g.:

    PYTHONPATH=benchmark/gpu_kit/overlay:/tmp/gpu_kit/site:benchmark/gpu_kit/stubs:python \
        SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 python3.12 benchmark/gpu_kit/cuda_import_sim.py

With python/sglang_dflash/cpu_runtime first instead (our stand-in alone) most modules
fail at sglang/srt/layers/quantization/gguf.py:49 (no `sgl_kernel.quantization`)."""
import importlib, sys, traceback
import torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200 (simulated)"
mods = sys.argv[1:] or [
    "sglang.srt.utils", "sglang.srt.layers.layernorm", "sglang.srt.layers.activation",
    "sglang.srt.layers.rotary_embedding", "sglang.srt.layers.sampler",
    "sglang.srt.layers.logits_processor", "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocation", "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.quantization.utils", "sglang.srt.layers.linear",
    "sglang.srt.models.qwen3", "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
    "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.entrypoints.http_server", "sglang.srt.speculative.dflash_info",
    "sglang.srt.constrained.xgrammar_backend", "sglang.srt.mem_cache.memory_pool_host",
    "sglang_dflash.adapter.plugin", "sglang_dflash.adapter.worker",
]
bad = 0
for m in mods:
    try:
        importlib.import_module(m)
        print("ok  ", m)
    except BaseException as e:
        bad += 1
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename.split('site-packages/')[-1].split('/site/')[-1]}:{f.lineno}" for f in reversed(tb) if "sglang" in f.filename), "?")
        print(f"FAIL {m}: {type(e).__name__}: {e} [{where}]")
sk = sys.modules.get("sgl_kernel")
print("sgl_kernel from", getattr(sk, "__file__", None))
log = getattr(sk, "requested_names", None)
if log is not None:
    print("sgl_kernel names requested but not implemented:", sorted(log()))
sys.exit(1 if bad else 0)
