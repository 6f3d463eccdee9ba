"""The CPU hooks for LFM2's short convolution: prefill, decode and a verify
chain on host tensors run in torch with SGLang's call signatures; anything
else goes to SGLang's function."""

import pytest
import torch
import torch.nn.functional as F
from sglang_dflash.adapter.cpu_short_conv import conv_fn_on_cpu, conv_update_on_cpu

D, K = 6, 3  # channels, conv window (LFM2's conv_L_cache)


def _never(*args, **kwargs):
    raise AssertionError("SGLang's kernel was called for host tensors")


def _reference(window, x, weight):
    """Causal depthwise conv of x [D, L] after the K - 1 inputs in window [D, K-1]."""
    full = torch.cat([window, x], dim=-1).unsqueeze(0)  # [1, D, K-1+L]
    return F.conv1d(full, weight.unsqueeze(1), groups=D)[0]


def test_prefill_continues_each_window_and_leaves_the_last_inputs():
    torch.manual_seed(0)
    weight = torch.randn(D, K, dtype=torch.float64)
    lens = [5, 3]
    x = torch.randn(D, sum(lens), dtype=torch.float64)
    pool = torch.randn(4, D, K - 1, dtype=torch.float64)
    before = pool.clone()
    slots = torch.tensor([2, 0], dtype=torch.int32)
    out = conv_fn_on_cpu(_never, x, weight, None, query_start_loc=torch.tensor([0, 5, 8], dtype=torch.int32),
                         cache_indices=slots, has_initial_state=torch.tensor([False, True]),
                         conv_states=pool, activation=None)
    first = _reference(torch.zeros(D, K - 1, dtype=torch.float64), x[:, :5], weight)
    second = _reference(before[0], x[:, 5:], weight)  # continues a prefix (chunked prefill)
    torch.testing.assert_close(out, torch.cat([first, second], dim=-1))
    torch.testing.assert_close(pool[2], x[:, 3:5])
    torch.testing.assert_close(pool[0], x[:, 6:8])
    torch.testing.assert_close(pool[[1, 3]], before[[1, 3]])  # other requests' windows untouched


def test_verify_chain_equals_decode_steps_and_keeps_each_window():
    """A verify position's output and window are those of a decode step, bit for
    bit: what greedy identity with plain decoding and the commit need."""
    torch.manual_seed(1)
    weight, T, N = torch.randn(D, K), 4, 2
    pool = torch.randn(5, D, K - 1)
    slots = torch.tensor([3, 1], dtype=torch.int32)
    x = torch.randn(N, D, T)
    decoded, windows, step_pool = [], [], pool.clone()
    for t in range(T):
        decoded.append(conv_update_on_cpu(_never, x[:, :, t].contiguous(), step_pool, weight, None, None,
                                          conv_state_indices=slots))
        windows.append(step_pool[slots.long()].clone())
    tape = torch.zeros(N, T, D, K - 1)
    verify_pool = pool.clone()
    out = conv_update_on_cpu(_never, x, verify_pool, weight, None, activation=None,
                             conv_state_indices=slots, intermediate_conv_window=tape,
                             intermediate_state_indices=torch.arange(N, dtype=torch.int32))
    assert torch.equal(out, torch.stack(decoded, dim=-1))
    assert torch.equal(tape, torch.stack(windows, dim=1))
    assert torch.equal(verify_pool, step_pool)


@pytest.mark.parametrize("case", ["device", "accept_counts", "positional"])
def test_other_calls_go_to_sglang_as_given(case):
    """Device tensors, and the call forms DFLASH on a CPU never makes, are SGLang's,
    with their arguments exactly as the caller passed them."""
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))
        return "sglang"

    device = "meta" if case == "device" else "cpu"
    x, pool, weight = (torch.zeros(2, D, device=device), torch.zeros(3, D, K - 1, device=device),
                       torch.zeros(D, K, device=device))
    slots = torch.tensor([0, 1], dtype=torch.int32, device=device)
    if case == "positional":  # bias, activation, cache_seqlens, conv_state_indices
        args, kwargs = (x, pool, weight, None, None, None, slots), {}
    else:
        args = (x, pool, weight, None, None)
        kwargs = {"conv_state_indices": slots,
                  **({"num_accept_tokens": torch.ones(2, dtype=torch.int32)} if case == "accept_counts" else {})}
    assert conv_update_on_cpu(original, *args, **kwargs) == "sglang"
    assert len(seen[0][0]) == len(args) and all(a is b for a, b in zip(seen[0][0], args))
    assert seen[0][1].keys() == kwargs.keys()
    if case == "device":
        assert conv_fn_on_cpu(original, x.T, weight, query_start_loc=slots, cache_indices=slots,
                              conv_states=pool) == "sglang"
