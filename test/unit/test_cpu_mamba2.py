"""The CPU path of SGLang's Mamba2 mixer (Nemotron-H): the torch scan and state
update against transformers' reference implementations, a verify chain against
decode steps bit for bit, and the hooks' routing (host tensors to the twins,
anything else to SGLang)."""

import sys
import types

import pytest
import torch
from sglang_dflash.adapter.cpu_mamba2 import bind_cpu_convolutions, scan_on_cpu, state_update_on_cpu
from sglang_dflash.cpu_runtime.mamba2 import mamba_chunk_scan_cpu, selective_state_update_cpu

H, P, G, S = 4, 8, 2, 6  # heads, head dim, groups, state size


def _never(*args, **kwargs):
    raise AssertionError("SGLang's kernel was called for host tensors")


def _params(seed):
    gen = torch.Generator().manual_seed(seed)
    A = -torch.rand(H, generator=gen) - 0.5  # -exp(A_log): negative, a decaying state
    return {"A": A, "D": torch.randn(H, generator=gen), "dt_bias": torch.randn(H, generator=gen) * 0.5}, gen


def _decode_args(params):
    """The decode form SGLang's mixer passes: A, D and dt_bias expanded over P."""
    return (params["A"][:, None, None].expand(H, P, S), params["D"][:, None].expand(H, P),
            params["dt_bias"][:, None].expand(H, P))


def test_decode_step_equals_transformers_reference():
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_selective_state_update

    params, gen = _params(0)
    A, D, dt_bias = _decode_args(params)
    n = 3
    pool = torch.randn(5, H, P, S, generator=gen)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    x = torch.randn(n, H, P, generator=gen)
    B, C = torch.randn(n, G, S, generator=gen), torch.randn(n, G, S, generator=gen)
    dt = torch.randn(n, H, generator=gen)[:, :, None].expand(n, H, P)
    state = pool[slots.long()].clone()
    want = mamba2_selective_state_update(state, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True)
    before, out = pool.clone(), torch.empty(n, H, P)
    state_update_on_cpu(_never, pool, x, dt, A, B, C, D, z=None, dt_bias=dt_bias, dt_softplus=True,
                        state_batch_indices=slots, out=out)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(pool[slots.long()], state)  # the reference updated its state in place
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


def test_verify_chain_equals_decode_steps_and_keeps_each_state():
    """A verify position's output and state are those of a decode step, bit for
    bit, and the pool keeps the state before the block (the commit picks one)."""
    params, gen = _params(1)
    A, D, dt_bias = _decode_args(params)
    n, T = 2, 4
    pool = torch.randn(4, H, P, S, generator=gen)
    slots = torch.tensor([3, 1], dtype=torch.int32)
    x = torch.randn(n, T, H, P, generator=gen)
    dt = torch.randn(n, T, H, generator=gen)[..., None].expand(n, T, H, P)
    B, C = torch.randn(n, T, G, S, generator=gen), torch.randn(n, T, G, S, generator=gen)
    step_pool, decoded, states = pool.clone(), [], []
    for t in range(T):
        out = torch.empty(n, H, P)
        selective_state_update_cpu(step_pool, x[:, t], dt[:, t], A, B[:, t], C[:, t], D, dt_bias=dt_bias,
                                   dt_softplus=True, state_batch_indices=slots, out=out)
        decoded.append(out)
        states.append(step_pool[slots.long()].clone())
    verify_pool, tape, out = pool.clone(), torch.zeros(n + 1, T, H, P, S), torch.empty(n, T, H, P)
    state_update_on_cpu(_never, verify_pool, x, dt, A, B, C, D, z=None, dt_bias=dt_bias, dt_softplus=True,
                        state_batch_indices=slots, out=out, disable_state_update=True,
                        intermediate_states_buffer=tape, cache_steps=T,
                        intermediate_state_indices=torch.arange(n + 1, dtype=torch.int32))
    assert torch.equal(out, torch.stack(decoded, dim=1))
    assert torch.equal(tape[:n], torch.stack(states, dim=1))
    assert torch.equal(verify_pool, pool)


def test_prefill_scan_equals_transformers_reference_per_sequence():
    """Two packed sequences, the second continuing a cached state (chunked
    prefill): outputs and final states are the chunked SSD reference's."""
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    params, gen = _params(2)
    lens = [7, 5]
    total = sum(lens)
    x, dt = torch.randn(1, total, H, P, generator=gen), torch.randn(1, total, H, generator=gen)
    B, C = torch.randn(1, total, G, S, generator=gen), torch.randn(1, total, G, S, generator=gen)
    initial = torch.stack([torch.zeros(H, P, S), torch.randn(H, P, S, generator=gen)])
    out = torch.empty_like(x)
    _, final, _ = scan_on_cpu(_never, x, dt, params["A"], B, C, chunk_size=4, D=params["D"], z=None,
                              dt_bias=params["dt_bias"], cu_seqlens=torch.tensor([0, 7, 12], dtype=torch.int32),
                              initial_states=initial, return_varlen_states=True, return_final_states=False,
                              return_track_states=True, track_end_locs=None, dt_softplus=True, out=out,
                              state_dtype=torch.float32)
    for i, (s, e) in enumerate([(0, 7), (7, 12)]):
        want, want_state = mamba2_chunk_scan(x[:, s:e], dt[:, s:e], params["A"], B[:, s:e], C[:, s:e], 4,
                                             D=params["D"], dt_bias=params["dt_bias"], dt_softplus=True,
                                             initial_states=initial[i:i + 1], return_final_states=True)
        torch.testing.assert_close(out[:, s:e], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(final[i], want_state[0], atol=1e-5, rtol=1e-5)


def test_other_forms_go_to_sglang():
    """Device tensors, gated forms, draft trees, state tracking and unknown
    positionals are SGLang's."""
    called = []

    def sglang(*args, **kwargs):
        called.append(kwargs)
        return "sglang"

    meta = torch.empty(1, 2, H, P, device="meta")
    host = torch.zeros(1, 2, H, P)
    assert scan_on_cpu(sglang, meta, None, None, None, None, chunk_size=4) == "sglang"
    assert scan_on_cpu(sglang, host, None, None, None, None, 4, None, z=host) == "sglang"
    assert scan_on_cpu(sglang, host, None, None, None, None, 4, None, track_end_locs=torch.zeros(1)) == "sglang"
    assert state_update_on_cpu(sglang, None, host, None, None, None, None, None, state_batch_indices=None) == "sglang"
    assert state_update_on_cpu(sglang, None, host, None, None, None, None, None, "z",
                               state_batch_indices=torch.zeros(1)) == "sglang"
    assert state_update_on_cpu(sglang, None, host, None, None, None, None, None, state_batch_indices=torch.zeros(1),
                               retrieve_parent_token=torch.zeros(1)) == "sglang"
    assert len(called) == 6


def test_missing_convolutions_are_bound_and_present_ones_kept():
    """A CPU build of SGLang leaves the mixer module's conv names unbound; a
    GPU build's own kernels stay."""
    module = types.ModuleType("fake_mamba_module")
    module.causal_conv1d_update_triton = sentinel = object()
    mixer_class = type("MambaMixer2", (), {"__module__": "fake_mamba_module"})
    sys.modules["fake_mamba_module"] = module
    try:
        built = []
        bind_cpu_convolutions(lambda mixer, *a: built.append(a), mixer_class(), 1, 2)
        assert built == [(1, 2)]
        assert module.causal_conv1d_update_triton is sentinel
        for name in ("causal_conv1d_fn", "causal_conv1d_fn_triton", "causal_conv1d_update"):
            assert callable(getattr(module, name))
        with pytest.raises(NotImplementedError, match="causal-conv1d"):
            module.causal_conv1d_fn(torch.empty(2, 3, device="meta"), torch.empty(2, 4))
    finally:
        del sys.modules["fake_mamba_module"]
