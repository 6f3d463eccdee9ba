"""The CPU path of Nemotron-H's MoE block: ReLU^2 experts against a per-token
reference, the routed scaling factor applied once, the router's out_dtype GEMM,
and every other form left to SGLang."""

from types import SimpleNamespace

import pytest
import torch
from sglang_dflash.adapter.cpu_nemotron_moe import mm_with_out_dtype, relu2_moe_on_cpu, router_mm_on_cpu

E, I, H, K, T = 4, 6, 5, 2, 7  # experts, expert width, hidden, top k, tokens


def _never(*args, **kwargs):
    raise AssertionError("SGLang's path was called for a form the hook serves")


def _layer_and_routing(seed=0):
    gen = torch.Generator().manual_seed(seed)
    layer = SimpleNamespace(w13_weight=torch.randn(E, I, H, generator=gen),
                            w2_weight=torch.randn(E, H, I, generator=gen),
                            should_fuse_routed_scaling_factor_in_topk=False)
    x = torch.randn(T, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=gen)
    return layer, x, (weights, ids, None)


def _config(**overrides):
    return SimpleNamespace(**{"activation": "relu2", "is_gated": False, "apply_router_weight_on_input": False,
                              "routed_scaling_factor": 2.5, **overrides})


def test_relu2_experts_equal_per_token_reference_scaled_once():
    layer, x, (weights, ids, _) = _layer_and_routing()
    got = relu2_moe_on_cpu(_never, layer, x, (weights, ids, None), _config())
    want = torch.stack([
        2.5 * sum(weights[t, j] * (layer.w2_weight[e] @ torch.relu(layer.w13_weight[e] @ x[t]).square())
                  for j, e in enumerate(ids[t].tolist()))
        for t in range(T)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    layer.should_fuse_routed_scaling_factor_in_topk = True  # the router scaled its weights already
    torch.testing.assert_close(relu2_moe_on_cpu(_never, layer, x, (weights, ids, None), _config()), want / 2.5,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [{"activation": "silu", "is_gated": True}, {"is_gated": True},
                                       {"apply_router_weight_on_input": True}])
def test_other_forms_go_to_sglang(overrides):
    layer, x, routing = _layer_and_routing()
    assert relu2_moe_on_cpu(lambda *a: "sglang", layer, x, routing, _config(**overrides)) == "sglang"


def test_router_gemm_takes_out_dtype_on_host_tensors_and_torch_mm_is_restored():
    a, b = torch.randn(3, 4).bfloat16(), torch.randn(4, 2).bfloat16()
    got = mm_with_out_dtype(torch.mm)(a, b, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, a.float() @ b.float())
    mm = torch.mm
    seen = []

    def block_forward(block, hidden):
        seen.append(torch.mm(hidden, b, out_dtype=torch.float32).dtype)
        raise RuntimeError("the block failed")

    with pytest.raises(RuntimeError, match="the block failed"):
        router_mm_on_cpu(block_forward, None, a)
    assert seen == [torch.float32] and torch.mm is mm
