"""The torch shared-expert gate SGLang's Qwen MoE blocks use on a CPU
(`adapter/cpu_moe.py`): the formula of SGLang's fused kernel, and the same bits
for a token whatever rows share its call (a verify gates bs x W rows where
plain decoding gates bs)."""

import pytest
import torch

from sglang_dflash.adapter.cpu_moe import gated_shared_output, row_invariant_sigmoid


def _inputs(rows, hidden=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.randn(hidden, generator=g) * 0.3).to(dtype)
    s = torch.randn(rows, hidden, generator=g).to(dtype)
    f = torch.randn(rows, hidden, generator=g).to(dtype)
    return h, w, s, f


@pytest.mark.parametrize("do_add", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_kernel_formula(do_add, dtype):
    h, w, s, f = _inputs(37, dtype=dtype)
    out = f.clone()
    gated_shared_output(h, w, s, out, do_add)
    want = torch.sigmoid(h.double() @ w.double()).unsqueeze(-1) * s.double()
    if do_add:
        want = want + f.double()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), want.to(dtype).double(), atol=tol, rtol=tol)
    assert out.dtype == dtype


def test_a_row_gets_the_same_bits_alone_or_in_a_batch():
    h, w, s, f = _inputs(300, seed=1)
    batched = f.clone()
    gated_shared_output(h, w, s, batched, True)
    for i in range(h.shape[0]):
        alone = f[i:i + 1].clone()
        gated_shared_output(h[i:i + 1], w, s[i:i + 1], alone, True)
        assert torch.equal(alone[0], batched[i]), f"row {i}"


def test_sigmoid_is_row_invariant_where_torch_is_not():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 3
    ours = row_invariant_sigmoid(x)
    assert all(torch.equal(row_invariant_sigmoid(x[i:i + 1])[0], ours[i]) for i in range(x.shape[0]))
    torch.testing.assert_close(ours, torch.sigmoid(x), atol=1e-6, rtol=0)
