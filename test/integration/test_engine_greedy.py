"""Greedy losslessness with the real SGLang engine on the CPU engine.

32 real prompts (GSM8K, HumanEval, MT-Bench, chat template applied), submitted
in groups of 4 and 16 (the decode batch size), and the first 8 one at a time,
max_new_tokens 64: the token ids generated with DFLASH must equal those of the
same engine without speculation, for random drafters (acceptance near 0;
groups of 16) and for a drafter trained on the target (multi-token accepts;
every group size). The plain engine runs at the same group sizes, so any difference is
the speculative path's.
"""

import pytest

from harness import Job, chat_prompts, dflash_args, output_ids, run_engines

NUM_PROMPTS = 32
# batch size -> prompts: one at a time is the slow part, and takes the path of 4 with one request
BATCH_SIZES = {1: 8, 4: NUM_PROMPTS, 16: NUM_PROMPTS}
GREEDY = {"max_new_tokens": 64, "temperature": 0.0}


def _runs(prompts, batch_sizes=tuple(BATCH_SIZES)):
    return [{"name": f"bs{bs}", "prompts": prompts[:BATCH_SIZES[bs]], "batch_size": bs, "sampling_params": GREEDY}
            for bs in batch_sizes]


@pytest.fixture(scope="module")
def prompts():
    return chat_prompts(NUM_PROMPTS)


DRAFTERS = ["drafter-random", "drafter-trained", "dflash2-random"]


@pytest.fixture(scope="module")
def engines(prompts):
    """Plain decoding's runs and each drafter's, the engines started together.
    The random drafters run groups of 16 only: the smaller groups take the
    same path (the trained drafter runs them), and a drafter that is rejected
    at almost every position verifies once per token, the slow part."""
    jobs = {"plain": Job({}, _runs(prompts))}
    for drafter in DRAFTERS:
        sizes = tuple(BATCH_SIZES) if drafter == "drafter-trained" else (16,)
        jobs[drafter] = Job(dflash_args(drafter), _runs(prompts, sizes))
    return dict(zip(jobs, run_engines(list(jobs.values()))))


def _check_identical(plain, spec):
    for name in spec:
        want, got = output_ids(plain[name]), output_ids(spec[name])
        assert len(got) == len(want) == BATCH_SIZES[int(name.removeprefix("bs"))]
        for i, (w, g) in enumerate(zip(want, got)):
            assert g == w, f"{name} prompt {i}: DFLASH output differs from plain decoding"


def _accept_lengths(run):
    return [r["meta_info"]["spec_accept_length"] for r in run["results"]]


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_dflash_greedy_identical_to_plain(engines, drafter):
    spec = engines[drafter]
    _check_identical(engines["plain"], spec)
    for name, run in spec.items():
        lengths = _accept_lengths(run)
        assert all(length is not None and length >= 1.0 for length in lengths), name
        assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in run["results"]), name
        mean = sum(lengths) / len(lengths)
        if drafter == "drafter-trained":
            # The trained drafter predicts the target: well above one token per verify.
            assert mean > 1.5, f"{name}: mean spec_accept_length {mean:.2f} <= 1.5"


def test_demo_pair_greedy_identical_and_speculates():
    """The bundled demo pair (what `sglang-dflash demo` serves) through the real
    engine: identical greedy output, and a trained DFlash 2 drafter that really
    speculates (reference-loop acceptance 4-5.5 tokens per verify on these
    workloads, see assets/demo/MODEL_CARD.md)."""
    from sglang_dflash.demo import demo_pair
    from sglang_dflash.tools.prompts import mixed_chat_prompts

    target, drafter = demo_pair()
    demo_prompts = mixed_chat_prompts(target, 12)
    runs = [{"name": f"bs{bs}", "prompts": demo_prompts, "batch_size": bs, "sampling_params": GREEDY}
            for bs in (1, 6)]
    dflash = {"model_path": target, "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter}
    # Both scheduler loops: SGLang's overlap scheduler (the default) and the
    # synchronous one (--disable-overlap-schedule).
    plain, *specs = run_engines([Job({"model_path": target}, runs)] + [
        Job({**dflash, "disable_overlap_schedule": not overlap}, runs, with_state=True) for overlap in (True, False)])
    for overlap, (spec, state) in zip((True, False), specs):
        assert state["overlap_schedule"] is overlap
        for name in plain:
            assert output_ids(spec[name]) == output_ids(plain[name]), (
                f"{name} (overlap {overlap}): demo pair output differs from plain")
            lengths = _accept_lengths(spec[name])
            mean = sum(lengths) / len(lengths)
            assert mean > 3.0, f"{name}: demo pair mean spec_accept_length {mean:.2f} <= 3.0"


def test_paged_context_and_static_draft_greedy_identical_to_plain(engines, prompts):
    """The drafter reading its context in place (the path the Triton kernel takes on
    CUDA, forced here through its torch twin), first directly, then through the
    draft step on static batch-size buckets (the path a CUDA graph replays,
    eager here; a shrinking batch runs padded to its bucket): identical output,
    and the same drafts as the gathered path (acceptance within float noise)."""
    gathered, paged_env = engines["drafter-trained"], {"SGLANG_DFLASH_PAGED_CONTEXT": "1"}
    # Batches of 4 and 16 only (CI time): both shrink to one request as theirs finish.
    runs = _runs(prompts, (4, 16))
    paged, (static, state) = run_engines([
        Job(dflash_args("drafter-trained"), runs, env=paged_env),
        Job(dflash_args("drafter-trained"), runs, True, {**paged_env, "SGLANG_DFLASH_STATIC_DRAFT": "1"})])
    assert state["static_draft"]["steps"] > 0 and not state["static_draft"]["captured"], state
    for spec in (paged, static):
        _check_identical(engines["plain"], spec)
        for name in spec:
            a, b = _accept_lengths(spec[name]), _accept_lengths(gathered[name])
            assert abs(sum(a) - sum(b)) <= 0.02 * sum(b), f"{name}: {sum(a):.2f} vs {sum(b):.2f}"


def test_fp8_drafter_greedy_identical_and_accepts_as_unquantized(engines, prompts, tmp_path):
    """The trained drafter as an FP8 checkpoint (transformers' layout, block
    scales with blocks cut at the matrices' edges), dequantized at load:
    identical output, and drafts accepted as the unquantized drafter's are
    (within FP8 rounding of its weights; without the scales applied none would be)."""
    from harness import PATHS

    from sglang_dflash.quantized import write_fp8_copy

    fp8 = write_fp8_copy(PATHS["drafter-trained"], tmp_path / "fp8", "fp8", block=(24, 40))
    runs = _runs(prompts, (16,))
    [spec] = run_engines([Job({"speculative_algorithm": "DFLASH", "speculative_draft_model_path": fp8}, runs)])
    _check_identical(engines["plain"], spec)
    got, want = sum(_accept_lengths(spec["bs16"])), sum(_accept_lengths(engines["drafter-trained"]["bs16"]))
    assert abs(got - want) <= 0.1 * want, f"FP8 drafter accepts {got:.1f} against {want:.1f} unquantized"
