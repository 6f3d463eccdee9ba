"""The CPU stand-in's Gated DeltaNet ops (hybrid targets: Qwen3.5, Qwen3-Next)
against the Qwen3.5 reference implementation in transformers, and decode /
verify consistency: a verified block must give, position by position, the
outputs and states that decode steps give (what greedy identity needs)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.adapter.cpu_gdn import gated_rmsnorm  # noqa: E402
from sglang_dflash.cpu_runtime.sgl_kernel import mamba  # noqa: E402

reference = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

torch.set_num_threads(1)
H, HV, DK, DV, KC = 2, 4, 8, 6, 4  # q/k heads, value heads, head dims, conv width
CONV_DIM = 2 * H * DK + HV * DV


def _inputs(gen, tokens):
    return dict(q=torch.randn(1, tokens, H, DK, generator=gen), k=torch.randn(1, tokens, H, DK, generator=gen),
                v=torch.randn(1, tokens, HV, DV, generator=gen), a=torch.randn(tokens, HV, generator=gen),
                b=torch.randn(tokens, HV, generator=gen))


def _gate_params(gen):
    return torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen) * 0.5  # A_log, dt_bias


def _reference_delta_rule(q, k, v, g, beta, state):
    """transformers' per-token recurrence for one sequence; state [HV, V, K] (SGLang's layout)."""
    groups = HV // H
    out, final = reference.torch_recurrent_gated_delta_rule(
        q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2), v, g, beta,
        initial_state=state.transpose(-1, -2).unsqueeze(0), output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out, final[0].transpose(-1, -2)


def test_prefill_delta_rule_matches_reference_and_updates_the_pool():
    gen = torch.Generator().manual_seed(0)
    lens = [5, 3]
    x = _inputs(gen, sum(lens))
    A_log, dt_bias = _gate_params(gen)
    g, beta = mamba.fused_gdn_gating_cpu(A_log, x["a"], x["b"], dt_bias)
    pool = torch.randn(4, HV, DV, DK, generator=gen)
    start = pool.clone()
    slots = torch.tensor([2, 0])
    cu = torch.tensor([0, 5, 8])
    out, _, _ = mamba.chunk_gated_delta_rule_cpu(x["q"], x["k"], x["v"], g, beta, pool, cu, False, True, slots)
    for i, slot in enumerate(slots.tolist()):
        s, e = cu[i].item(), cu[i + 1].item()
        want, final = _reference_delta_rule(x["q"][:, s:e], x["k"][:, s:e], x["v"][:, s:e], g[:, s:e], beta[:, s:e],
                                            start[slot])
        torch.testing.assert_close(out[:, s:e], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[slot], final, rtol=1e-5, atol=1e-5)
    assert torch.equal(pool[[1, 3]], start[[1, 3]])  # other slots untouched


def test_gates_match_their_formula():
    gen = torch.Generator().manual_seed(1)
    A_log, dt_bias = _gate_params(gen)
    a, b = torch.randn(7, HV, generator=gen) * 10, torch.randn(7, HV, generator=gen)
    g, beta = mamba.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    assert g.shape == beta.shape == (1, 7, HV) and g.dtype == beta.dtype == torch.float32
    torch.testing.assert_close(g[0], -A_log.exp() * F.softplus(a + dt_bias))
    torch.testing.assert_close(beta[0], torch.sigmoid(b))


def _decode(x, t, A_log, dt_bias, pool, slots):
    """One decode step of token t of every request (x holds [N, T] tokens request-major)."""
    n = slots.shape[0]
    steps = x["q"].shape[1] // n
    rows = torch.arange(n) * steps + t
    return mamba.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=x["q"][:, rows], k=x["k"][:, rows], v=x["v"][:, rows], a=x["a"][rows],
        b=x["b"][rows], initial_state_source=pool, initial_state_indices=slots, cu_seqlens=torch.arange(n + 1),
        use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)


def test_decode_steps_continue_the_prefill_recurrence():
    gen = torch.Generator().manual_seed(2)
    x = _inputs(gen, 6)
    A_log, dt_bias = _gate_params(gen)
    pool = torch.zeros(2, HV, DV, DK)
    for t in range(6):
        out = _decode(x, t, A_log, dt_bias, pool, torch.tensor([1]))
        assert out.shape == (1, 1, HV, DV)
        if t == 5:
            last = out
    g, beta = mamba.fused_gdn_gating_cpu(A_log, x["a"], x["b"], dt_bias)
    want, final = _reference_delta_rule(x["q"], x["k"], x["v"], g, beta, torch.zeros(HV, DV, DK))
    torch.testing.assert_close(last[0, 0], want[0, 5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[1], final, rtol=1e-5, atol=1e-5)


def test_verify_block_equals_decode_steps_bit_for_bit():
    """Verify T positions of N requests at once, state updates disabled: each
    position's output and cached state equal those of decode steps exactly, and
    the pool is left for the commit."""
    gen = torch.Generator().manual_seed(3)
    n, steps = 3, 4
    x = _inputs(gen, n * steps)
    A_log, dt_bias = _gate_params(gen)
    pool = torch.randn(5, HV, DV, DK, generator=gen)
    slots, rows = torch.tensor([4, 1, 2]), torch.tensor([0, 1, 2])
    before = pool.clone()
    buffer = torch.zeros(n + 1, steps, HV, DV, DK)
    out = mamba.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=x["q"], k=x["k"], v=x["v"], a=x["a"], b=x["b"],
        initial_state_source=pool, initial_state_indices=slots, cu_seqlens=torch.arange(0, n * steps + 1, steps),
        use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
        disable_state_update=True, intermediate_states_buffer=buffer, intermediate_state_indices=rows,
        cache_steps=steps, retrieve_parent_token=None)
    assert torch.equal(pool, before)
    decoded = pool.clone()
    for t in range(steps):
        step = _decode(x, t, A_log, dt_bias, decoded, slots)
        assert torch.equal(out.view(n, steps, HV, DV)[:, t], step[0]), t
        assert torch.equal(buffer[rows, t], decoded[slots]), t


def test_prefill_conv_matches_reference_and_leaves_the_window():
    gen = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(CONV_DIM, KC, generator=gen), torch.randn(CONV_DIM, generator=gen)
    lens = [6, 2]
    x = torch.randn(CONV_DIM, sum(lens), generator=gen)
    pool = torch.randn(3, CONV_DIM, KC - 1, generator=gen)
    start = pool.clone()
    slots, has_state = torch.tensor([0, 2]), torch.tensor([False, True])
    out = mamba.causal_conv1d_fn_cpu(x, weight, bias, "silu", pool, has_state, slots, torch.tensor([0, 6, 8]),
                                     lens)
    # Fresh sequence: transformers' causal conv (zero left padding).
    want = reference.causal_conv1d_fn(x[None, :, :6], weight, bias, activation="silu")[0]
    torch.testing.assert_close(out[:, :6], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[0], x[:, 6 - (KC - 1):6])
    # Continued sequence of 2 tokens: transformers' update from the window.
    window = start[2].unsqueeze(0).clone()
    want = reference.causal_conv1d_update(x[None, :, 6:], window, weight, bias, activation="silu")[0]
    torch.testing.assert_close(out[:, 6:], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[2], window[0])
    assert torch.equal(pool[1], start[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_verify_equals_decode_steps_bit_for_bit(dtype):
    """The window pool in float32 or bfloat16 (SGLang's default conv dtype): a
    verified block's outputs and per-position windows are the decode steps'."""
    gen = torch.Generator().manual_seed(5)
    n, steps = 2, 3
    weight, bias = torch.randn(CONV_DIM, KC, generator=gen), torch.randn(CONV_DIM, generator=gen)
    x = torch.randn(n, CONV_DIM, steps, generator=gen)
    pool = torch.randn(4, CONV_DIM, KC - 1, generator=gen).to(dtype)
    slots, rows = torch.tensor([3, 0]), torch.tensor([0, 1])
    windows = torch.zeros(n + 1, steps, CONV_DIM, KC - 1, dtype=dtype)
    decoded = pool.clone()
    out = mamba.causal_conv1d_update_cpu(x, pool, weight, bias, "silu", slots, intermediate_conv_window=windows,
                                         intermediate_state_indices=rows)
    for t in range(steps):
        step = mamba.causal_conv1d_update_cpu(x[:, :, t].contiguous(), decoded, weight, bias, "silu", slots)
        assert torch.equal(out[:, :, t], step), t
        assert torch.equal(windows[rows, t], decoded[slots]), t
    assert torch.equal(pool[slots], decoded[slots])  # the pool holds the window after the block


def test_gated_rmsnorm_matches_reference():
    gen = torch.Generator().manual_seed(6)
    norm = reference.Qwen3_5RMSNormGated(DV, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(DV, generator=gen))
    x, z = torch.randn(5, DV, generator=gen), torch.randn(5, DV, generator=gen)
    torch.testing.assert_close(gated_rmsnorm(x, norm.weight, z, 1e-6), norm(x, z).detach())


def test_qk_gemma_norm_with_gate_splits_each_head():
    gen = torch.Generator().manual_seed(7)
    tokens, heads, kv_heads, hd = 3, 2, 1, 4
    q_gate, k = torch.randn(tokens, heads * 2 * hd, generator=gen), torch.randn(tokens, kv_heads * hd, generator=gen)
    qw, kw = torch.randn(hd, generator=gen), torch.randn(hd, generator=gen)
    q, kn, gate = mamba.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, 1e-6, hd, heads)
    norm = reference.Qwen3_5RMSNorm(hd, eps=1e-6)
    per_head = q_gate.view(tokens, heads, 2 * hd)
    with torch.no_grad():
        norm.weight.copy_(qw)
        torch.testing.assert_close(q.view(tokens, heads, hd), norm(per_head[..., :hd]))
        norm.weight.copy_(kw)
        torch.testing.assert_close(kn.view(tokens, kv_heads, hd), norm(k.view(tokens, kv_heads, hd)))
    assert torch.equal(gate.view(tokens, heads, hd), per_head[..., hd:])
    q2, k2 = mamba.fused_qk_gemma_rmsnorm_cpu(per_head[..., :hd].reshape(tokens, -1), k, qw, kw, 1e-6, hd)
    assert torch.equal(q2.view(tokens, -1), q) and torch.equal(k2.view(tokens, -1), kn)


def test_sigmoid_mul_and_projection_split():
    gen = torch.Generator().manual_seed(8)
    x, gate = torch.randn(3, 8, generator=gen), torch.randn(3, 2, 4, generator=gen)
    want = x * torch.sigmoid(gate.reshape(3, 8))
    mamba.fused_sigmoid_mul_cpu(x, gate)
    torch.testing.assert_close(x, want)
    qkvz, ba = torch.randn(2, CONV_DIM + HV * DV, generator=gen), torch.randn(2, 2 * HV, generator=gen)
    qkv, z, b, a = mamba.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, H, HV, DK, DV)
    assert torch.equal(qkv, qkvz[:, :CONV_DIM]) and torch.equal(z.reshape(2, -1), qkvz[:, CONV_DIM:])
    assert torch.equal(b, ba[:, :HV]) and torch.equal(a, ba[:, HV:])


def test_tree_verify_is_refused():
    with pytest.raises(NotImplementedError, match="linear chains"):
        mamba.causal_conv1d_update_cpu(torch.zeros(1, CONV_DIM, 2), torch.zeros(1, CONV_DIM, KC - 1),
                                       torch.zeros(CONV_DIM, KC), None, "silu", torch.tensor([0]),
                                       retrieve_parent_token=torch.zeros(1, 2, dtype=torch.long))


def test_commit_copies_each_requests_accepted_step():
    """The worker's commit after a verify (adapter/linear_state.py): request i's
    slot takes its buffer row i at step commit_len_i - 1, in every layer."""
    from sglang_dflash.adapter.linear_state import copy_accepted

    layers, slots_total, rows, steps = 2, 6, 4, 5
    pool = torch.zeros(layers, slots_total, 3)
    per_step = torch.arange(layers * rows * steps * 3, dtype=torch.float32).view(layers, rows, steps, 3)
    slots, last = torch.tensor([5, 1, 3]), torch.tensor([0, 4, 2])
    copy_accepted(pool, per_step, slots, last)
    for i in range(3):
        assert torch.equal(pool[:, slots[i]], per_step[:, i, last[i]])
    assert not pool[:, [0, 2, 4]].any()


def test_qwen3_next_gdn_layer_is_built_on_the_cpu_without_a_gpu():
    from sglang_dflash.adapter.cpu_gdn import cpu_device_module_without_gpu

    accelerator_module = torch.get_device_module
    seen = {}

    def build(name):
        seen[name] = torch.get_device_module()
        return name

    if torch.cuda.is_available():
        pytest.skip("a GPU host keeps its accelerator module")
    assert cpu_device_module_without_gpu(build, "layer") == "layer"
    assert seen["layer"] is torch.cpu and torch.get_device_module is accelerator_module
    with pytest.raises(ValueError):  # restored after a failing build as well
        cpu_device_module_without_gpu(lambda: (_ for _ in ()).throw(ValueError("bad config")))
    assert torch.get_device_module is accelerator_module
