"""Qwen-style MoE targets (Qwen3.5 MoE, Qwen3-Next, Qwen2-MoE) on SGLang's CPU engine.

Their sparse block adds a shared expert scaled by a per-token sigmoid gate. On a
host without Intel AMX, SGLang 0.5.23 fuses that gate into a Triton kernel
(`_launch_fused_gate_sigmoid_mul`), which fails on host tensors. An AROUND hook
computes it in torch for CPU tensors and leaves every other device to SGLang.

The torch version must give a token the same bits whatever the number of rows
beside it: a verify step gates `bs x W` rows where plain decoding gates `bs`,
and lossless greedy decoding needs both to agree. Products and sums round once
per element however they are vectorized, but torch's CPU `sigmoid` rounds an
element by its place in the vector loop (a vector lane or the scalar tail), so
each row's gate is computed at the start of its own `_LANE_ROW`-wide row.
"""

from __future__ import annotations

import torch

GATE_TARGET = "sglang.kernels.ops.elementwise.elementwise._launch_fused_gate_sigmoid_mul"

# A multiple of every CPU vector loop's stride (AVX-512: 16 floats, unrolled x2).
_LANE_ROW = 128
# Rows per sigmoid call: 128 x 128 elements stay below torch's parallel grain
# (32768), so one thread runs the call from its first element, and every row's
# value sits at lane 0 of a vector (a thread's share could start mid-vector).
_SERIAL_ROWS = 128


def gate_logits(hidden: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """[N] float32 dot products of each row with the gate vector."""
    return (hidden.float() * gate_weight.float()).sum(-1)


def row_invariant_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid of a 1-D tensor, each element computed at lane 0 of a full vector."""
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], _SERIAL_ROWS):
        part = x[start:start + _SERIAL_ROWS]
        wide = part.unsqueeze(-1).expand(part.shape[0], _LANE_ROW).contiguous()
        out[start:start + part.shape[0]] = torch.sigmoid(wide)[:, 0]
    return out


def gated_shared_output(hidden, gate_weight, shared_output, output, do_add: bool) -> None:
    """output := (output +) sigmoid(hidden . gate_weight) * shared_output, per row,
    in float32 (as SGLang's kernel), stored in output's dtype."""
    gate = row_invariant_sigmoid(gate_logits(hidden, gate_weight)).unsqueeze(-1)
    result = gate * shared_output.float()
    if do_add:
        # A separate op: a fused multiply-add would round once where the
        # vector loop rounds twice.
        result = result + output.float()
    output.copy_(result)


def torch_shared_gate_on_cpu(original, hidden_states, gate_weight, shared_output, output, *, do_add):
    """AROUND SGLang's fused shared-expert gate: host tensors take the torch path."""
    if hidden_states.device.type != "cpu":
        return original(hidden_states, gate_weight, shared_output, output, do_add=do_add)
    gated_shared_output(hidden_states, gate_weight, shared_output, output, do_add)
