"""verify_widths.py: the verify widths each SGLang 0.5.23 attention backend is
given (one case per backend name), graphs, a hybrid target's tracked radix
cache, and policy modes they cannot serve.
That the table names every backend SGLang registers is checked against the
installed SGLang in test/integration/test_hook_targets.py."""

import pytest

from sglang_dflash.policy import PolicyConfig
from sglang_dflash.verify_widths import (
    BACKENDS,
    UnsupportedBackend,
    check_mode_widths,
    safe_widths,
)

B = 8
EVERY = tuple(range(B))

EXPECTED = {
    "triton": EVERY, "flashinfer": EVERY, "llada2_cfg_flashinfer": EVERY, "torch_native": EVERY,
    "intel_xpu": EVERY, "qsa": EVERY, "aiter": EVERY,
    # The full block, and W = 0 through the target's DECODE forward.
    "trtllm_mha": (0, B - 1), "fa3": (0, B - 1), "fa4": (0, B - 1), "flashmla": (0, B - 1),
    "trtllm_mla": (0, B - 1), "cutedsl_mla": (0, B - 1), "tokenspeed_mla": (0, B - 1),
    "dsa": (0, B - 1), "nsa": (0, B - 1),
    "dsv4": (B - 1,), "compressed": (B - 1,), "ascend": (B - 1,),
    "flex_attention": None, "wave": None, "hpc_ops": None, "intel_amx": None,
    "minicpm_flashattn": None, "minicpm_flashinfer": None,
}


def test_every_backend_in_the_table_has_a_case_here():
    assert set(EXPECTED) == set(BACKENDS)


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("tracked_linear_state", [False, True])
@pytest.mark.parametrize("backend", sorted(EXPECTED))
def test_widths_per_backend(backend, cuda_graphs, tracked_linear_state):
    expected = EXPECTED[backend]
    flags = dict(cuda_graphs=cuda_graphs, tracked_linear_state=tracked_linear_state)
    if expected is None:  # refused whatever the flags: the backend cannot verify at all
        with pytest.raises(UnsupportedBackend, match=f"attention backend '{backend}' cannot run DFLASH"):
            safe_widths(backend, B, **flags)
        return
    if cuda_graphs:  # only the full block (graphed) and W = 0 remain, where allowed
        expected = tuple(w for w in expected if w in (0, B - 1))
    if tracked_linear_state:  # a hybrid's extra_buffer radix cache: no W = 0 step, the full block only
        expected = (B - 1,)
    assert safe_widths(backend, B, **flags) == expected


def test_unknown_backend_is_full_block_only():
    assert safe_widths("some_future_backend", B) == (B - 1,)


@pytest.mark.parametrize("mode, extra, widths, needle", [
    ("off", {}, (B - 1,), "policy mode 'off' needs W = 0 steps"),
    ("fixed", {"fixed_width": 3}, (0, B - 1), "fixed_width = 3 is not a verify width"),
])
def test_modes_the_widths_cannot_serve_are_refused(mode, extra, widths, needle):
    with pytest.raises(UnsupportedBackend, match=needle):
        check_mode_widths(PolicyConfig(mode=mode, **extra), widths)


@pytest.mark.parametrize("mode, extra", [("off", {}), ("on", {}), ("adaptive", {}),
                                         ("fixed", {"fixed_width": B - 1})])
def test_modes_the_widths_serve_pass(mode, extra):
    check_mode_widths(PolicyConfig(mode=mode, **extra), (0, B - 1))


@pytest.mark.parametrize("backend", ["triton", "fa3", "dsv4"])  # ANY, FULL, FULL_ONLY
def test_extra_buffer_hybrid_keeps_the_full_block_and_refuses_off(backend):
    """A hybrid under the extra_buffer radix cache: no W = 0 step; adaptive
    stays on (the FULL_ONLY path), off is refused with the way out."""
    narrowed = safe_widths(backend, B, tracked_linear_state=True)
    assert narrowed == (B - 1,)
    with pytest.raises(UnsupportedBackend, match="no_buffer"):
        check_mode_widths(PolicyConfig(mode="off"), narrowed)
    check_mode_widths(PolicyConfig(mode="adaptive"), narrowed)
