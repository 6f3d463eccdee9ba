"""Sampling is lossless on the real engine: the distribution of generated tokens
2 to 4 with DFLASH (a trained v1 drafter, one-hot q; the trained DFlash 2 demo
drafter, whose selector samples q at the request's temperature; speculation
off) is indistinguishable from the same engine without speculation.

The DFlash 2 sampled walk (dense q, accept tests and residual draws against
it) runs with the trained demo drafter below, which is accepted often enough
to exercise both outcomes; a random DFlash 2 drafter adds only rejections.

Test: 20 000 samples per engine of one chat prompt at temperature 0.9, top-p
0.95, top-k 16 (T != 1 and both filters, where a wrong q or a lossy fallback
would show). For each of tokens 2, 3, 4, and for the pair (token 2, token 3),
a chi-square test of homogeneity between the two samples (categories with
fewer than 10 pooled observations merged into one); a p-value below 1e-4 fails
(with 4 tests per drafter the false-alarm rate is < 1e-3). Power: the same test
must reject plain decoding at temperature 0.9 against plain decoding at 1.0.
"""

import os
from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from harness import chat_prompts, dflash_args, run_engine

# About 8 minutes on a 2-core host (80 000 four-token requests over four
# engines, plus the demo pair's two); SGLANG_DFLASH_SKIP_SLOW_TESTS=1 skips it for a quick local run.
pytestmark = pytest.mark.skipif(
    os.environ.get("SGLANG_DFLASH_SKIP_SLOW_TESTS") == "1",
    reason="slow (20 000 sampled requests per engine); SGLANG_DFLASH_SKIP_SLOW_TESTS=1 is set",
)
N = int(os.environ.get("SGLANG_DFLASH_SAMPLING_N", "20000"))  # smaller for a quick look only
SAMPLING = {"max_new_tokens": 4, "temperature": 0.9, "top_p": 0.95, "top_k": 16}
P_MIN = 1e-4
ENGINE = dict(max_running_requests=256, max_total_tokens=65536, random_seed=1)


def _runs(prompt, sampling=SAMPLING, name="s"):
    return [{"name": name, "prompts": [prompt] * N, "batch_size": N, "sampling_params": sampling}]


@pytest.fixture(scope="module")
def prompt():
    return chat_prompts(1)[0]


@pytest.fixture(scope="module")
def plain(prompt):
    runs = _runs(prompt) + _runs(prompt, {**SAMPLING, "temperature": 1.0}, name="t1")
    return run_engine(ENGINE, runs)


def _features(run):
    outs = [r["output_ids"] for r in run["results"] if len(r["output_ids"]) >= 4]
    assert len(outs) > 0.95 * N
    return {
        "token2": [o[1] for o in outs],
        "token3": [o[2] for o in outs],
        "token4": [o[3] for o in outs],
        "pair23": [(o[1], o[2]) for o in outs],
    }


def _homogeneity_p(a, b, min_count=10):
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda k: -(ca[k] + cb[k]))
    big = [k for k in keys if ca[k] + cb[k] >= min_count]
    rest_a = sum(ca[k] for k in keys if k not in set(big))
    rest_b = sum(cb[k] for k in keys if k not in set(big))
    table = [[ca[k] for k in big] + [rest_a], [cb[k] for k in big] + [rest_b]]
    if rest_a + rest_b == 0:
        table = [row[:-1] for row in table]
    if len(table[0]) < 2:
        return 1.0
    return chi2_contingency(table)[1]


def test_test_has_power(plain):
    """A temperature change of 0.1 is detected by the same statistic."""
    base, other = _features(plain["s"]), _features(plain["t1"])
    assert min(_homogeneity_p(base[k], other[k]) for k in base) < P_MIN


@pytest.mark.parametrize("drafter", ["drafter-trained"])
def test_sampled_distribution_matches_plain(plain, prompt, drafter):
    spec = run_engine({**ENGINE, **dflash_args(drafter)}, _runs(prompt))
    base, got = _features(plain["s"]), _features(spec["s"])
    for key in base:
        p = _homogeneity_p(base[key], got[key])
        assert p >= P_MIN, f"{drafter}: {key} differs from plain sampling (chi-square p = {p:.2e})"
    verify_ct = sum(r["meta_info"]["spec_verify_ct"] or 0 for r in spec["s"]["results"])
    assert verify_ct > 0


def test_off_path_sampled_distribution_matches_plain(plain, prompt, monkeypatch):
    """Speculation off (W = 0, what the adaptive policy runs under load): every
    token after the prefill's is sampled by our verify step from the target's p
    alone (no drafts, no walk draws); same test and tolerance as above."""
    monkeypatch.setenv("SGLANG_DFLASH_POLICY", '{"mode": "off"}')
    spec, state = run_engine({**ENGINE, **dflash_args("drafter-trained")}, _runs(prompt), with_state=True)
    base, got = _features(plain["s"]), _features(spec["s"])
    for key in base:
        p = _homogeneity_p(base[key], got[key])
        assert p >= P_MIN, f"off path: {key} differs from plain sampling (chi-square p = {p:.2e})"
    by_width = state["steps_by_width"]
    assert by_width[0] == state["steps"] > 0, by_width  # every decode step ran W = 0


@pytest.fixture(scope="module")
def demo():
    """The demo pair's paths, one chat prompt for it, and its plain samples."""
    from transformers import AutoTokenizer

    from sglang_dflash.demo import demo_pair
    from sglang_dflash.tools.prompts import mixed_prompts

    target, drafter = demo_pair()
    tok = AutoTokenizer.from_pretrained(target)
    text = tok.apply_chat_template([{"role": "user", "content": mixed_prompts(1)[0]}],
                                   tokenize=False, add_generation_prompt=True)
    engine = {**ENGINE, "model_path": target}
    return {"engine": engine, "drafter": drafter, "text": text, "plain": run_engine(engine, _runs(text))}


def _demo_spec(demo, with_state=False):
    return run_engine({**demo["engine"], "speculative_algorithm": "DFLASH",
                       "speculative_draft_model_path": demo["drafter"]}, _runs(demo["text"]),
                      with_state=with_state)


def _check_demo(demo, spec, label):
    base, got = _features(demo["plain"]["s"]), _features(spec["s"])
    for key in base:
        p = _homogeneity_p(base[key], got[key])
        assert p >= P_MIN, f"{label}: {key} differs from plain sampling (chi-square p = {p:.2e})"
    lengths = [r["meta_info"]["spec_accept_length"] for r in spec["s"]["results"]]
    mean = sum(lengths) / len(lengths)
    # Only 3 tokens follow the prefill's first, so a verify commits at most 3:
    # 1.36 was measured here (adaptive policy); 1.0 would mean no draft accepted.
    assert mean > 1.2, f"{label}: the drafter accepts too little under sampling to test it ({mean:.2f})"


def test_demo_pair_sampled_distribution_matches_plain(demo):
    """The trained DFlash 2 demo drafter: its selector's sampled walk proposes
    drafts that the target often accepts under sampling, so this exercises the
    accept test min(1, p/q) and the residual draws with the real q, not just
    rejections of random drafts."""
    _check_demo(demo, _demo_spec(demo), "demo pair")
