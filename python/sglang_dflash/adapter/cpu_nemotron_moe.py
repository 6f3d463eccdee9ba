"""Nemotron-H MoE layers on SGLang's CPU engine.

SGLang 0.5.23's Nemotron-H MoE block does not run on a CPU, with or without
speculation: its router computes `torch.mm(x, gate.T, out_dtype=float32)`
(a bfloat16 GEMM with float32 output, a CUDA-only overload), and SGLang's
native MoE path, the one a CPU takes, has no non-gated ReLU^2 experts (it
raises on the activation). Here:

* an AROUND hook on the block's forward gives `torch.mm` the `out_dtype` form
  for host tensors while the block runs (the inputs converted to that dtype
  first: products of bfloat16 values are exact in float32, so this is the
  float32-accumulated GEMM the CUDA kernel computes);
* an AROUND hook on the native MoE path computes non-gated ReLU^2 experts in
  torch, as that path computes its gated ones (per expert over the tokens
  routed to it, weighted by the router's weights, summed over the top k),
  scaled by the block's routed_scaling_factor where the router has not
  applied it (the native path itself never applies it: Nemotron-H's factor,
  2.5 in NVIDIA's checkpoints, would be lost).

Everything else goes to SGLang unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MOE_FORWARD_TARGET = "sglang.srt.models.nemotron_h.NemotronHMoE.forward"
NATIVE_MOE_TARGET = "sglang.srt.layers.moe.fused_moe_native.moe_forward_native"


def mm_with_out_dtype(mm):
    """`mm` taking `out_dtype` for host tensors as well."""

    def wrapped(a, b, *args, out_dtype=None, **kwargs):
        if out_dtype is None:
            return mm(a, b, *args, **kwargs)
        if a.device.type == "cpu":
            return mm(a.to(out_dtype), b.to(out_dtype), *args, **kwargs)
        return mm(a, b, *args, out_dtype=out_dtype, **kwargs)

    return wrapped


def router_mm_on_cpu(original, block, hidden_states, *args, **kwargs):
    """AROUND the MoE block's forward: host tensors get the out_dtype GEMM."""
    if hidden_states.device.type != "cpu":
        return original(block, hidden_states, *args, **kwargs)
    mm = torch.mm
    torch.mm = mm_with_out_dtype(mm)
    try:
        return original(block, hidden_states, *args, **kwargs)
    finally:
        torch.mm = mm


def relu2_experts(x, w13, w2, topk_weights, topk_ids, scale: float = 1.0) -> torch.Tensor:
    """x [T, H], w13 [E, I, H], w2 [E, H, I], topk_* [T, k] ->
    scale * sum over k of weight * w2[e] relu(w13[e] x)^2, [T, H] in x's dtype."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        y = F.linear(torch.relu(F.linear(x[rows], w13[e])).square(), w2[e])
        out.index_add_(0, rows, y.float() * topk_weights[rows, slot].float().unsqueeze(-1))
    return (out * scale if scale != 1.0 else out).to(x.dtype)


def relu2_moe_on_cpu(original, layer, x, topk_output, moe_runner_config):
    """AROUND SGLang's native MoE path: non-gated ReLU^2 experts of host tensors."""
    served = (x.device.type == "cpu" and moe_runner_config.activation == "relu2"
              and not moe_runner_config.is_gated and not moe_runner_config.apply_router_weight_on_input
              and getattr(layer, "w13_weight_bias", None) is None and getattr(layer, "w2_weight_bias", None) is None)
    if not served:
        return original(layer, x, topk_output, moe_runner_config)
    topk_weights, topk_ids, _ = topk_output
    factor = moe_runner_config.routed_scaling_factor
    scale = 1.0 if factor is None or getattr(layer, "should_fuse_routed_scaling_factor_in_topk", False) else factor
    return relu2_experts(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, float(scale))


def register(registry, hook_type) -> None:
    registry.register(MOE_FORWARD_TARGET, router_mm_on_cpu, hook_type.AROUND)
    registry.register(NATIVE_MOE_TARGET, relu2_moe_on_cpu, hook_type.AROUND)
