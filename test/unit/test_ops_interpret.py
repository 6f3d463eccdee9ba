"""sglang_dflash.ops on CPU: the dispatch point, the RNG-free rejection twin,
and parity of each Triton kernel with its torch twin under the Triton
interpreter.

The kernel checks run in ONE subprocess (this file run as a script) with
TRITON_INTERPRET=1 set before triton is imported; each check reports its own
result and gets its own test here. They skip, with the reason, when triton
does not import or the interpreter cannot run a trivial kernel on this
triton version; a kernel check that fails once the interpreter works fails.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

from sglang_dflash import ops, select  # noqa: E402
from sglang_dflash.ops.rejection_ref import (  # noqa: E402
    chain_rejection_sample_uniforms,
    inverse_cdf,
)
from sglang_dflash.rejection import (  # noqa: E402
    PAD_TOKEN_ID,
    chain_rejection_sample,
    target_probs,
)

torch.set_num_threads(1)

RESULT_MARKER = "OPS_INTERPRET_RESULTS "
NEG_INF, POS_INF, NAN = float("-inf"), float("inf"), float("nan")
TOP_K_ALL = 1 << 30

# --------------------------------------------------------------------------
# Random inputs shared by the kernel checks (fresh per seed)
# --------------------------------------------------------------------------


def _walk_inputs(seed, bs, slots, k, vocab=1000, nonfinite=False):
    """Scores [bs, S, K, K], ids, temperatures, a mixed greedy mask, uniforms."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(bs, slots, k, k, generator=gen) * 3.0
    if nonfinite:
        scores[0, 0] = NAN  # every row of slot 0 NaN: a dead slot
        scores[1 % bs, :, :, :1] = POS_INF
        scores[2 % bs, slots - 1] = NEG_INF  # dead last slot
        mask = torch.rand(bs, slots, k, k, generator=gen) < 0.3
        scores = scores.masked_fill(mask, NEG_INF)
        scores = scores.masked_fill(torch.rand(bs, slots, k, k, generator=gen) < 0.1, NAN)
    ids = torch.randint(vocab, (bs, slots, k), generator=gen)
    temps = torch.tensor([1e-7, 0.3, 1.0, 2.5, 0.7])[torch.arange(bs) % 5]
    greedy = torch.rand(bs, generator=gen) < 0.4
    uniforms = torch.rand(bs, slots, generator=gen)
    return scores, ids, temps, greedy, uniforms


def _chain_inputs(seed, bs, slots, vocab, k=16):
    """Target p (with top-k / top-p filters), a selector-like q over k
    candidates (sparse: ids and probabilities), drafts drawn from q, and
    uniforms. Rows 0-3 are edge cases: q = p (all accepted, bonus), q =
    1.001 p (empty residual at a rejection), both with p cut to its top 8,
    one-hot q (deterministic draft) and drafts the target gives zero mass."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, slots + 1, vocab, generator=gen) * 2.0
    n = bs * (slots + 1)
    top_k = torch.where(torch.rand(n, generator=gen) < 0.5, torch.full((n,), 8), TOP_K_ALL)
    top_k.view(bs, slots + 1)[:2] = 8  # the q = p rows: p within k candidates
    p = target_probs(logits.view(n, vocab), torch.rand(n, generator=gen) + 0.5,
                     torch.where(torch.rand(n, generator=gen) < 0.5, 0.9, 1.0), top_k,
                     torch.zeros(n)).view(bs, slots + 1, vocab)
    draft_logits = logits[:, :slots] + torch.randn(bs, slots, vocab, generator=gen) * 0.5
    cand = torch.topk(draft_logits, min(k, vocab), dim=-1).indices
    outside = torch.ones_like(draft_logits, dtype=torch.bool).scatter_(-1, cand, False)
    q = torch.softmax(draft_logits.masked_fill(outside, NEG_INF), dim=-1)
    q[0] = p[0, :slots]
    q[1 % bs] = p[1 % bs, :slots] * 1.001
    q[2 % bs] = torch.nn.functional.one_hot(q[2 % bs].argmax(-1), vocab).float()
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(bs, slots)
    if bs > 3 and slots > 0:
        drafts[3, 0] = int(p[3, 0].argmin())  # zero (or least) target mass
    q_probs, q_ids = torch.topk(q, min(k, vocab), dim=-1)  # every row's support fits in k
    accept_u = torch.rand(bs, slots, generator=gen)
    accept_u[0] = 0.0  # q = p: every draft accepted, the bonus comes from p_S
    accept_u[1 % bs] = 0.9995  # 1.001 p: rejected, the residual is empty
    sample_u = torch.rand(bs, slots + 1, generator=gen)
    return drafts, q_ids, q_probs, p, accept_u, sample_u


def _to(device, tensors):
    return tuple(t.to(device) for t in tensors)


def _assert_paths_equal(got, want):
    assert torch.equal(got.choice, want.choice), (got.choice, want.choice)
    assert torch.equal(got.tokens, want.tokens)
    assert got.q.shape == want.q.shape and got.q.dtype == torch.float32
    err = float((got.q - want.q).abs().max()) if got.q.numel() else 0.0
    assert err <= 1e-6, f"q differs by {err}"


def _assert_results_equal(got, want):
    assert torch.equal(got.accept_len, want.accept_len), (got.accept_len, want.accept_len)
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)


# --------------------------------------------------------------------------
# Kernel checks (run in the interpreter subprocess)
# --------------------------------------------------------------------------


def check_walk_k16_s7(device="cpu"):
    from sglang_dflash.ops import walk_triton

    for seed in range(3):
        args = _to(device, _walk_inputs(seed, bs=8, slots=7, k=16))
        _assert_paths_equal(walk_triton.walk(*args), select.walk(*args))


def check_walk_nonfinite_rows(device="cpu"):
    from sglang_dflash.ops import walk_triton

    for seed in range(3):
        args = _to(device, _walk_inputs(seed, bs=6, slots=7, k=16, nonfinite=True))
        got = walk_triton.walk(*args)
        _assert_paths_equal(got, select.walk(*args))
        assert got.choice[0, 0] == 0 and got.q[0, 0, 0] == 1.0  # the dead slot


def check_walk_shapes_and_strides(device="cpu"):
    from sglang_dflash.ops import walk_triton

    for seed, (bs, slots, k) in enumerate([(1, 1, 1), (3, 2, 5), (2, 7, 16), (5, 3, 32)]):
        args = _to(device, _walk_inputs(100 + seed, bs, slots, k))
        _assert_paths_equal(walk_triton.walk(*args), select.walk(*args))
    # a non-contiguous lattice (transposed storage) and uniforms view
    scores, ids, temps, greedy, u = _to(device, _walk_inputs(7, 4, 7, 16))
    scores_t = scores.transpose(2, 3).contiguous().transpose(2, 3)
    u_t = u.t().contiguous().t()
    _assert_paths_equal(walk_triton.walk(scores_t, ids, temps, greedy, u_t),
                        select.walk(scores, ids, temps, greedy, u))


def check_walk_ties_and_uniform_edges(device="cpu"):
    from sglang_dflash.ops import walk_triton

    gen = torch.Generator().manual_seed(11)
    scores = torch.randint(0, 3, (6, 7, 16, 16), generator=gen).float()  # many ties
    ids = torch.randint(1000, (6, 7, 16), generator=gen)
    temps = torch.tensor([1.0, 0.5, 1e-6, 1.0, 3.0, 1.0])
    greedy = torch.tensor([True, False, False, True, False, False])
    u = torch.rand(6, 7, generator=gen)
    u[1], u[4] = 0.0, 1.0 - 2.0 ** -24  # the smallest and largest float32 uniform below 1
    u[5] = 0.9999999
    scores[5, :, :, 8:] = NEG_INF  # q = 0 past candidate 7: the clamp must stop there
    args = _to(device, (scores, ids, temps, greedy, u))
    _assert_paths_equal(walk_triton.walk(*args), select.walk(*args))


def check_rejection_vocab32_s7(device="cpu"):
    from sglang_dflash.ops import rejection_triton

    for seed in range(3):
        args = _to(device, _chain_inputs(seed, bs=24, slots=7, vocab=32))
        _assert_results_equal(rejection_triton.chain_rejection_sample_uniforms(*args),
                              chain_rejection_sample_uniforms(*args))


def check_rejection_vocab1000_chunked(device="cpu"):
    from sglang_dflash.ops import rejection_triton

    for seed, block_v in [(20, 256), (21, 128), (22, 2048)]:
        args = _to(device, _chain_inputs(seed, bs=12, slots=7, vocab=1000))
        want = chain_rejection_sample_uniforms(*args)
        accept_len = torch.full((12,), -7, dtype=torch.int64, device=device)  # poisoned outputs
        tokens = torch.full((12, 8), -7, dtype=torch.int64, device=device)
        rejection_triton.chain_rejection_into(*args, accept_len, tokens, block_v=block_v)
        assert torch.equal(accept_len, want.accept_len) and torch.equal(tokens, want.tokens)
        assert bool((want.accept_len < 7).any() & (want.accept_len > 0).any())


def check_rejection_edges_and_strides(device="cpu"):
    from sglang_dflash.ops import rejection_triton

    twin, kernel = chain_rejection_sample_uniforms, rejection_triton.chain_rejection_sample_uniforms
    drafts, ids, probs, p, ua, us = _to(device, _chain_inputs(30, bs=6, slots=7, vocab=100))
    want = twin(drafts, ids, probs, p, ua, us)
    assert want.accept_len[0] == 7 and want.accept_len[1] == 0  # the edge rows do their job
    _assert_results_equal(kernel(drafts, ids, probs, p, ua, us), want)
    # p as a view into a padded vocabulary (row stride != vocab), q in transposed storage
    cols = torch.arange(100, device=device)
    pad_p = torch.zeros(6, 8, 128, device=device).index_copy_(2, cols, p)[..., :100]
    ids_t, probs_t = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (ids, probs))
    _assert_results_equal(kernel(drafts, ids_t, probs_t, pad_p, ua, us), want)
    # K = 1 (a deterministic draft's one-hot q) and K not a power of two
    one = (drafts.unsqueeze(-1), torch.ones_like(probs[..., :1]))
    _assert_results_equal(kernel(drafts, *one, p, ua, us), twin(drafts, *one, p, ua, us))
    _assert_results_equal(kernel(drafts, ids[..., :11], probs[..., :11], p, ua, us),
                          twin(drafts, ids[..., :11], probs[..., :11], p, ua, us))
    # S = 0: only the bonus, drawn from p_0
    args0 = (drafts[:, :0], ids[:, :0], probs[:, :0], p[:, :1], ua[:, :0], us[:, :1])
    _assert_results_equal(kernel(*args0), twin(*args0))
    # uniform edges for the emitted draw
    for value in (0.0, 1.0 - 2.0 ** -24):
        us_edge = torch.full_like(us, value)
        _assert_results_equal(kernel(drafts, ids, probs, p, ua, us_edge),
                              twin(drafts, ids, probs, p, ua, us_edge))


def _context_attention_case(seed, *, bs, block, heads, kv_heads, dim, causal, window,
                            dtype=torch.float32):
    """Ragged prefixes (one empty, one shorter than a tile, one over several
    tiles), a strided req_to_token, int32 slots, shuffled slot order."""
    from sglang_dflash.ops.context_attention_ref import PagedLayer

    gen = torch.Generator().manual_seed(seed)
    slots = 800
    q = torch.randn(bs, block, heads, dim, generator=gen).to(dtype)
    k_block = torch.randn(bs, block, kv_heads, dim, generator=gen).to(dtype)
    v_block = torch.randn(bs, block, kv_heads, dim, generator=gen).to(dtype)
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    table = torch.randperm(slots, generator=gen)[:8 * 90].view(8, 90).to(torch.int32)
    req_to_token = table[:, ::2]  # a strided slot table: [8, 45]
    prefix = torch.tensor([0, 5, 44, 31, 70 % 45][:bs])
    req_pool_indices = torch.tensor([3, 0, 7, 1, 5][:bs])
    positions = prefix[:, None] + torch.arange(block)
    ctx = PagedLayer(k_cache, v_cache, req_to_token, req_pool_indices, prefix)
    return (q, k_block, v_block, ctx, positions), dict(causal=causal, window=window)


def _check_context_attention(**case):
    from sglang_dflash.ops import context_attention_ref, context_attention_triton

    args, kw = _context_attention_case(0, **case)
    want = context_attention_ref.block_context_attention(*args, **kw)
    got = context_attention_triton.block_context_attention(*args, **kw)
    tol = 1e-5 if args[0].dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def check_context_attention_full(device="cpu"):
    _check_context_attention(bs=5, block=8, heads=4, kv_heads=2, dim=16, causal=False, window=None)


def check_context_attention_causal_window_gqa(device="cpu"):
    _check_context_attention(bs=4, block=8, heads=8, kv_heads=2, dim=24, causal=True, window=9)


def check_context_attention_two_sided_window(device="cpu"):
    _check_context_attention(bs=3, block=16, heads=2, kv_heads=2, dim=32, causal=False, window=4)


KERNEL_CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _child_main() -> None:
    """Run every kernel check under the interpreter; print one JSON line."""
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # numpy 0/0 on dead rows
    results = {}
    try:
        _interpreter_smoke()
    except Exception as exc:  # any failure here means the interpreter, not our kernels
        results["__interpreter__"] = f"{type(exc).__name__}: {exc}"
        print(RESULT_MARKER + json.dumps(results), flush=True)
        return
    for name, fn in KERNEL_CHECKS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception as exc:  # reported per check to the parent test
            results[name] = f"{type(exc).__name__}: {str(exc)[:1500]}"
    print(RESULT_MARKER + json.dumps(results), flush=True)


def _interpreter_smoke() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.cumsum(tl.load(x_ptr + offs), axis=0))

    x = torch.arange(8, dtype=torch.float32)
    y = torch.zeros(8)
    _copy[(1,)](x, y, N=8)
    assert torch.equal(y, torch.cumsum(x, 0)), y


def _pythonpath() -> str:
    """python/ first, then whatever PYTHONPATH the test run already has."""
    return os.pathsep.join(p for p in (os.path.join(REPO, "python"),
                                       os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="module")
def interpreter_results():
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"triton is not importable here ({exc}): kernel parity is not checked on CPU")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=_pythonpath())
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    assert lines, f"interpreter child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    results = json.loads(lines[-1][len(RESULT_MARKER):])
    if "__interpreter__" in results:
        pytest.skip("the Triton interpreter (TRITON_INTERPRET=1) cannot run a trivial kernel "
                    f"on this triton version: {results['__interpreter__']}")
    return results


@pytest.mark.parametrize("name", sorted(KERNEL_CHECKS))
def test_kernel_matches_twin_in_interpreter(interpreter_results, name):
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


_SM90_SIGNATURES = {
    "walk": dict(ptrs=dict(scores_ptr="*fp32", cand_ptr="*i64", temp_ptr="*fp32",
                           greedy_ptr="*u8", u_ptr="*fp32", tokens_ptr="*i64", choice_ptr="*i64",
                           q_ptr="*fp32"),
                 constexprs=dict(NUM_SLOTS=7, K=16, BLOCK_K=16, MIN_TEMP=1e-5,
                                 FMAX=3.4028234663852886e38), num_warps=1),
    "rejection": dict(ptrs=dict(draft_ptr="*i64", qid_ptr="*i64", qpr_ptr="*fp32", p_ptr="*fp32",
                                ua_ptr="*fp32", us_ptr="*fp32", accept_len_ptr="*i64",
                                tokens_ptr="*i64"),
                      constexprs=dict(NUM_SLOTS=7, K=16, BLOCK_K=16, BLOCK_V=2048, PAD=PAD_TOKEN_ID),
                      num_warps=8),
    "context_attention": dict(
        ptrs=dict(q_ptr="*bf16", kb_ptr="*bf16", vb_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16",
                  r2t_ptr="*i32", rpi_ptr="*i64", prefix_ptr="*i64", pos_ptr="*i64",
                  out_ptr="*bf16", scale="fp32"),
        constexprs=dict(B=16, D=128, GROUP=8, BLOCK_M=16, BLOCK_N=32, BLOCK_D=128, CAUSAL=False,
                        WINDOWED=True, IEEE=False), num_warps=4),
}


@pytest.mark.parametrize("kernel", sorted(_SM90_SIGNATURES))
def test_kernel_compiles_for_sm90_without_a_gpu(kernel):
    """Ahead-of-time compile to a Hopper cubin: catches what only the real
    compiler rejects (the interpreter runs numpy, not the lowering)."""
    triton = pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    from triton.backends.compiler import GPUTarget

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 3):
        pytest.skip(f"the ASTSource signature format used here needs triton >= 3.3, "
                    f"found {triton.__version__}")
    from sglang_dflash.ops import context_attention_triton, rejection_triton, walk_triton

    fn = {"walk": walk_triton._walk_kernel,
          "rejection": rejection_triton._chain_rejection_kernel,
          "context_attention": context_attention_triton._block_context_attention_kernel}[kernel]
    spec = _SM90_SIGNATURES[kernel]
    signature = {name: spec["ptrs"].get(name, "constexpr" if name in spec["constexprs"] else "i32")
                 for name in fn.arg_names}
    src = compiler.ASTSource(fn, signature, constexprs=spec["constexprs"])
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=spec["num_warps"]))
    assert compiled.asm["cubin"], "no cubin"
    assert ".local" not in compiled.asm["ptx"], "local memory (spills or a dynamic array)"


# --------------------------------------------------------------------------
# The dispatch point
# --------------------------------------------------------------------------


@pytest.fixture
def fresh_dispatch(monkeypatch):
    monkeypatch.delenv(ops.DISABLE_TRITON_ENV, raising=False)
    ops.reset_backend_cache()
    yield
    ops.reset_backend_cache()


def test_dispatch_uses_torch_twins_on_cpu(fresh_dispatch, caplog):
    caplog.set_level("INFO", logger="sglang_dflash.ops")
    args = _walk_inputs(3, bs=5, slots=7, k=16, nonfinite=True)
    _assert_paths_equal(ops.selector_walk(*args), select.walk(*args))
    chain = _chain_inputs(4, bs=8, slots=7, vocab=32)
    _assert_results_equal(ops.chain_rejection(*chain), chain_rejection_sample_uniforms(*chain))
    assert ops.backend("cpu") == ops.BACKEND_TORCH
    decisions = [r for r in caplog.records if "backend" in r.getMessage()]
    assert len(decisions) == 1, [r.getMessage() for r in decisions]  # decided and logged once
    assert "cpu" in decisions[0].getMessage() and "torch" in decisions[0].getMessage()


def test_dispatch_env_override_disables_triton_on_cuda(fresh_dispatch, monkeypatch):
    monkeypatch.setenv(ops.DISABLE_TRITON_ENV, "1")
    impl, reason = ops._decide("cuda")
    assert impl.name == ops.BACKEND_TORCH and ops.DISABLE_TRITON_ENV in reason


def test_dispatch_without_triton_falls_back_to_torch_on_cuda(fresh_dispatch, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    for mod in ("sglang_dflash.ops.walk_triton", "sglang_dflash.ops.rejection_triton"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    impl, reason = ops._decide("cuda")
    assert impl.name == ops.BACKEND_TORCH and "triton does not import" in reason


def test_dispatch_picks_triton_on_cuda_when_available(fresh_dispatch):
    pytest.importorskip("triton")
    impl, _ = ops._decide("cuda")
    assert impl.name == ops.BACKEND_TRITON
    assert impl.walk.__module__ == "sglang_dflash.ops.walk_triton"


def test_ops_imports_and_runs_without_triton():
    code = ("import sys; sys.modules['triton'] = None; import torch; "
            "from sglang_dflash import ops, select; "
            "from sglang_dflash.candidates import Candidates; "
            "s = torch.randn(2, 3, 4, 4); ids = torch.randint(9, (2, 3, 4)); "
            "t = torch.ones(2); g = torch.tensor([True, False]); u = torch.rand(2, 3); "
            "assert torch.equal(ops.selector_walk(s, ids, t, g, u).tokens, "
            "select.walk(s, ids, t, g, u).tokens); assert 'triton' not in str(ops.backend('cpu'))")
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --------------------------------------------------------------------------
# The RNG-free twin: handmade cases and statistical losslessness
# --------------------------------------------------------------------------


def test_inverse_cdf_handmade():
    w = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0], [0.0] * 5, [2.0, 2.0, 0.0, 0.0, 0.0]])
    assert inverse_cdf(w, torch.tensor([0.0, 0.5, 0.0])).tolist() == [1, 0, 0]
    assert inverse_cdf(w, torch.tensor([0.25, 0.5, 0.5])).tolist() == [3, 0, 1]
    assert inverse_cdf(w, torch.tensor([0.2499, 0.5, 0.9999999])).tolist() == [1, 0, 1]


def _dense(ids, probs, vocab):
    return torch.zeros(ids.shape[:2] + (vocab,)).scatter_add_(-1, ids, probs)


def test_twin_accepts_like_multinomial_version():
    drafts, ids, probs, p, ua, us = _chain_inputs(5, bs=64, slots=7, vocab=32)
    twin = chain_rejection_sample_uniforms(drafts, ids, probs, p, ua, us)
    ref = chain_rejection_sample(drafts, _dense(ids, probs, 32), p, ua, torch.Generator().manual_seed(0))
    assert torch.equal(twin.accept_len, ref.accept_len)
    rows = torch.arange(64)
    n = twin.accept_len
    assert bool((twin.tokens[rows, n] >= 0).all())
    positions = torch.arange(8).expand(64, -1)
    assert torch.equal(twin.tokens[positions < n.unsqueeze(1)],
                       drafts[positions[:, :7] < n.unsqueeze(1)])
    assert bool((twin.tokens[positions > n.unsqueeze(1)] == PAD_TOKEN_ID).all())
    # the emitted token always has positive mass in the emit distribution
    p_row = p[rows, n]
    assert bool((p_row[rows, twin.tokens[rows, n]] > 0).all())


def test_twin_edge_rows():
    drafts, ids, probs, p, ua, us = _chain_inputs(6, bs=6, slots=7, vocab=50)
    res = chain_rejection_sample_uniforms(drafts, ids, probs, p, ua, us)
    assert res.accept_len[0] == 7  # q = p, u = 0
    assert res.accept_len[1] == 0 and p[1, 0, res.tokens[1, 0]] > 0  # empty residual -> p_0
    with pytest.raises(ValueError, match="sample_uniforms"):
        chain_rejection_sample_uniforms(drafts, ids, probs, p, ua, us[:, :7])
    with pytest.raises(ValueError, match="q_ids and q_probs"):
        chain_rejection_sample_uniforms(drafts, ids, probs[..., :3], p, ua, us)


@pytest.mark.parametrize("seed", range(4))
def test_sparse_twin_equals_the_dense_rule(seed):
    """The sparse q gives bit-for-bit what the same rule gives over the dense q
    (accept tests on q(x) gathered from the dense q, the residual against its
    whole row), so the sparse form changes memory and nothing else."""
    from sglang_dflash.rejection import _dense_q_row, _emit_distribution, _leading_true

    drafts, ids, probs, p, ua, us = _chain_inputs(40 + seed, bs=32, slots=7, vocab=64)
    q = _dense(ids, probs, 64)
    q_x = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    p_x = p[:, :7].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    n = _leading_true(ua * q_x < p_x)
    emitted = inverse_cdf(_emit_distribution(_dense_q_row(q, n), p, n), us.gather(1, n[:, None])[:, 0])
    got = chain_rejection_sample_uniforms(drafts, ids, probs, p, ua, us)
    assert torch.equal(got.accept_len, n)
    assert torch.equal(got.tokens[torch.arange(32), n], emitted)
    assert bool((n < 7).any() & (n > 0).any())


LOSSLESS_ROWS = 40_000  # a fifth of test_rejection.py's sample: this twin shares its rule


def _twin_counts(target, sample_cdf, q_table, seed, rows=LOSSLESS_ROWS):
    """`test_rejection._speculative_counts`, verified by the uniform-driven twin."""
    from test_rejection import ANCHOR, NUM_SLOTS, VOCAB

    gen = torch.Generator().manual_seed(seed)
    prev = torch.full((rows,), ANCHOR, dtype=torch.int64)
    drafts = []
    for slot in range(NUM_SLOTS):
        u = torch.rand(rows, 1, generator=gen)
        prev = (sample_cdf[slot, prev] <= u).sum(-1).clamp(max=VOCAB - 1)
        drafts.append(prev)
    drafts = torch.stack(drafts, dim=1)
    context = torch.cat([torch.full((rows, 1), ANCHOR), drafts], dim=1)
    q = q_table[torch.arange(NUM_SLOTS), context[:, :NUM_SLOTS]]  # dense: K = V candidates
    p = target[context]
    ids = torch.arange(VOCAB).expand(rows, NUM_SLOTS, VOCAB)
    res = chain_rejection_sample_uniforms(drafts, ids, q, p, torch.rand(rows, NUM_SLOTS, generator=gen),
                                          torch.rand(rows, NUM_SLOTS + 1, generator=gen))
    positions = torch.arange(NUM_SLOTS + 1).expand(rows, -1)
    reached = positions <= res.accept_len.unsqueeze(1)
    flat = (positions * VOCAB + context) * VOCAB + res.tokens
    counts = torch.bincount(flat[reached], minlength=(NUM_SLOTS + 1) * VOCAB * VOCAB)
    return counts.view(NUM_SLOTS + 1, VOCAB, VOCAB)


@pytest.mark.parametrize("temperature,filters", [(0.5, "none"), (1.7, "top_p_0.9_top_k_8")])
def test_twin_is_lossless(temperature, filters):
    """Emitted tokens follow the target chain (checks of test_rejection.py,
    tolerance E[TV] + 4 sd at this sample size, never below TV 0.01)."""
    from test_rejection import FILTERS, NUM_SLOTS, _assert_lossless, _chain_case, _tv_checks

    top_p, top_k = FILTERS[filters]
    target, sample_cdf, q_table = _chain_case(11, temperature, top_p, top_k, temperature)
    checks = _tv_checks(_twin_counts(target, sample_cdf, q_table, seed=5), target)
    pooled = {label for label, _, _ in checks if "pooled" in label}
    assert {f"pos {i} pooled" for i in range(3)} <= pooled, pooled
    assert len(pooled) >= NUM_SLOTS // 2
    _assert_lossless(checks, strict_positions=[])


def test_twin_detects_wrong_temperature_q():
    """The same checks have power at this sample size: q at T = 1 for drafts at T = 0.5."""
    from test_rejection import TV_THRESHOLD, _chain_case, _tv_checks

    target, sample_cdf, q_table = _chain_case(11, 0.5, 1.0, TOP_K_ALL, q_temperature=1.0)
    checks = _tv_checks(_twin_counts(target, sample_cdf, q_table, seed=5), target)
    flagged = [label for label, tv, tol in checks if tv > tol]
    assert len(flagged) > len(checks) // 2, (len(flagged), len(checks))
    first = {label: tv for label, tv, _ in checks}["pos 0 pooled"]
    assert first > 3 * TV_THRESHOLD and not math.isnan(first), first


if __name__ == "__main__":
    _child_main()
