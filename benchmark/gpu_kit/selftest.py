"""GPU kit self-test (run by run.py with the servers' environment).

1. `sgl_kernel` is the kit's overlay (CUDA) or at least importable (CPU).
2. The overlay's torch ops against independent references on the run's device
   (cuda, or cpu with --cpu), bf16 and fp32.
3. SGLang's server modules import in this process (the CUDA code paths on a GPU).
Prints one line per check; exit 1 on any failure.
"""

import importlib
import sys
import traceback

import torch

dev = "cpu" if "--cpu" in sys.argv else "cuda"
failures = 0


def check(name, fn):
    global failures
    try:
        detail = fn()
        print(f"ok   {name}{': ' + detail if detail else ''}")
    except Exception as e:  # noqa: BLE001
        failures += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)


import sgl_kernel  # noqa: E402

print(f"sgl_kernel: {getattr(sgl_kernel, '__file__', None)} overlay={getattr(sgl_kernel, 'IS_GPU_KIT_OVERLAY', False)}")


def close(a, b, tol):
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol, f"max err {err:.3g} > {tol}"
    return f"max err {err:.2g}"


def t_rmsnorm():
    out = []
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        x = torch.randn(7, 256, device=dev, dtype=dt)
        w = torch.randn(256, device=dev, dtype=dt)
        ref = (x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double())
        out.append(close(sgl_kernel.rmsnorm(x, w, 1e-6), ref, tol))
        r = torch.randn_like(x)
        x2, r2 = x.clone(), r.clone()
        sgl_kernel.fused_add_rmsnorm(x2, r2, w, 1e-6)
        s = x.double() + r.double()
        close(r2, s, tol)
        out.append(close(x2, s / (s.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double(), tol * 4))
    return ", ".join(out)


def t_silu():
    x = torch.randn(5, 2 * 96, device=dev)
    ref = torch.nn.functional.silu(x[:, :96]) * x[:, 96:]
    o = torch.empty(5, 96, device=dev)
    sgl_kernel.silu_and_mul(x, o)
    return close(o, ref, 1e-6)


def t_rope():
    T, H, D, base = 6, 3, 64, 10000.0
    pos = torch.tensor([0, 1, 5, 17, 3, 100], device=dev)
    inv = 1.0 / base ** (torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
    ang = torch.arange(128, device=dev, dtype=torch.float64)[:, None] * inv[None]
    cache = torch.cat((ang.cos(), ang.sin()), -1).float()
    q = torch.randn(T, H * D, device=dev)
    k = torch.randn(T, 1 * D, device=dev)
    q2, k2 = q.clone(), k.clone()
    sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions=pos, query=q2, key=k2, head_size=D,
                                                     cos_sin_cache=cache, is_neox=True)
    # neox reference through complex rotation of (x_i, x_{i+D/2}) pairs
    def ref(x):
        x = x.view(T, -1, D).double()
        z = torch.complex(x[..., : D // 2], x[..., D // 2:]) * torch.polar(
            torch.ones_like(ang[pos.long()]), ang[pos.long()])[:, None, :]
        return torch.cat((z.real, z.imag), -1).reshape(T, -1)
    close(k2, ref(k), 1e-4)
    return close(q2, ref(q), 1e-4)


def t_sampling_filters():
    p = torch.softmax(torch.randn(4, 50, device=dev), -1)
    k = sgl_kernel.top_k_renorm_prob(p, torch.tensor([1, 5, 50, 3], device=dev))
    assert torch.allclose(k.sum(-1), torch.ones(4, device=dev), atol=1e-5)
    assert (k > 0).sum(-1).tolist() == [1, 5, 50, 3], (k > 0).sum(-1).tolist()
    q = sgl_kernel.top_p_renorm_prob(p, torch.tensor([1e-9, 0.5, 1.0, 0.9], device=dev))
    assert (q > 0).sum(-1)[0].item() == 1 and (q > 0).sum(-1)[2].item() == 50
    return "ok"


def t_missing():
    from sgl_kernel.scalar_type import scalar_types  # noqa: F401

    name = scalar_types.uint4b8  # attribute chains must work at import time
    try:
        sgl_kernel.kit_selftest_missing_op()
    except NotImplementedError:
        return f"placeholder {name!r} raises when called"
    raise AssertionError("a missing op did not raise")


if getattr(sgl_kernel, "IS_GPU_KIT_OVERLAY", False):
    check("overlay rmsnorm / fused_add_rmsnorm", t_rmsnorm)
    check("overlay silu_and_mul", t_silu)
    check("overlay rope (neox)", t_rope)
    check("overlay top-k / top-p renorm", t_sampling_filters)
    check("overlay placeholders", t_missing)
elif dev == "cuda":
    failures += 1
    print("FAIL sgl_kernel is not the kit's overlay on CUDA")

MODULES = [
    "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.sampler",
    "sglang.srt.models.qwen3", "sglang.srt.model_executor.model_runner",
    "sglang.srt.managers.scheduler", "sglang.srt.entrypoints.http_server",
    "sglang_dflash.adapter.plugin", "sglang_dflash.adapter.worker",
]
for m in MODULES:
    check(f"import {m}", lambda m=m: importlib.import_module(m) and None)

print(f"selftest on {dev}: {'PASS' if not failures else f'{failures} FAILED'}")
sys.exit(1 if failures else 0)
