"""Sampling is lossless on the real engine: tokens 2 to 4 sampled with DFLASH
are distributed as plain decoding's on the same engine, on each sampled path:

* DFlash 2 (the demo drafter): the selector's sampled walk, a dense q at the
  request's temperature, accept tests min(1, p/q) and residual draws against it;
* DFlash v1: argmax drafts, a one-hot q. The drafter is a v1 checkpoint made
  from the demo drafter by dropping its convolutions and selector, so its
  drafts are accepted often (a random one's rarely are);
* speculation off (W = 0, what the adaptive policy runs under load): every
  token after the prefill's sampled by our verify step from p alone, p from
  the target's DECODE forward or from a one-row verify (one_row_verify.py).

All on the demo pair: a trained target, whose next-token distributions are
peaked enough for the test to see a change of temperature. (On the tiny random
target the same test at 20 000 samples rejects temperature 1.0 against 0.9 in
about 1 run of 10: `python benchmark/sampling_power.py --target tiny`.)

Test: N samples per engine of one chat prompt (`sampling_power.PROMPT_INDEX`:
the one whose continuations move most with the temperature, so the test reaches
its power at the fewest samples) at temperature 0.9, top-p 0.95,
top-k 16 (T != 1 and both filters, where a wrong q or a lossy fallback would
show), 4 tokens each, speculation always on with a block of 4. On tokens 2, 3,
4 and the pair (2, 3) (`benchmark/sampling_power.py`), two chi-square tests:
homogeneity with plain decoding's samples (the oracle), and goodness of fit to
the target's exact distribution (every continuation the sampler can produce,
computed with transformers), which has no second sample's noise and so twice
the homogeneity test's noncentrality at the same N; any p-value below 1e-4 fails (false alarms below 1e-3 per
engine). Power: the homogeneity test at N must reject temperature 1.0 in at
least 95% of runs simulated from the exact distributions, and plain decoding's
own samples must fit the exact distribution (so the simulation and the fit
describe this engine).

With min_p and frequency / presence penalties (`FILTERED`), DFlash 2 is tested
the same way at N_FILTERED: the penalties of a draft row count the drafts
before it in the block, and min_p cuts p before the accept test. The oracle
is plain decoding without the overlap scheduler (with it, SGLang's penalties
skip a token). Power there: against temperature 1.0, against the penalties
dropped and against min_p dropped. The same engines sample once more with the
repetition penalty alone (`REPETITION`, 0.5: a drawn token's logit halved if
negative, doubled if positive), power against it dropped; beside the additive
penalties plain SGLang applies the two in no fixed order, so no exact model.
"""

import json
import os

import pytest
from safetensors.torch import load_file, save_file

from harness import Job, run_engines
from sampling_power import (FILTERED, P_MIN, REPETITION, SAMPLING, exact_distributions, feature_probs, mean_accept,
                            min_fit_p, min_p, sampled_features, sampling_prompt, simulated_power)

# Several minutes on a 2-core host (six engines of N or N_FILTERED four-token
# requests); SGLANG_DFLASH_SKIP_SLOW_TESTS=1 skips it for a quick local run.
pytestmark = pytest.mark.skipif(
    os.environ.get("SGLANG_DFLASH_SKIP_SLOW_TESTS") == "1",
    reason="slow (thousands of sampled requests per engine); SGLANG_DFLASH_SKIP_SLOW_TESTS=1 is set",
)
# At 5 000 the simulated power against T = 1.0 is about 1 (0.96 at 3 000);
# the power test below fails an N that lacks it.
N = int(os.environ.get("SGLANG_DFLASH_SAMPLING_N", "5000"))
N_FILTERED = 2000  # simulated power about 1 against each alternative
# The penalized settings, each run on the FILTERED engines: min_p with the
# additive penalties, and the repetition (scaling) penalty alone.
PENALIZED = {"penalties": FILTERED, "repetition": REPETITION}
ENGINE = dict(max_running_requests=256, max_total_tokens=65536, random_seed=1)
V2_ONLY = ("conv", "selector")  # DFlash 2 tensor names a v1 checkpoint lacks
# A block of 4 (anchor + 3 drafts) covers the 3 tokens after the prefill's;
# the drafters' own 8 would verify 4 more positions per step that no request keeps.
BLOCK = 4


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo pair, its chat prompt, the exact distributions at the test's
    params and at T = 1.0, and a v1 drafter."""
    from sglang_dflash.demo import demo_pair

    target, drafter = demo_pair()
    text = sampling_prompt(target)
    engine = {**ENGINE, "model_path": target}
    exact, hot = exact_distributions(target, text, SAMPLING, {**SAMPLING, "temperature": 1.0})
    return {"engine": engine, "text": text, "dflash2": drafter, "exact": exact, "hot": hot,
            "probs": feature_probs(exact),
            "dflash1": _v1_from_v2(drafter, tmp_path_factory.mktemp("dflash1"))}


@pytest.fixture(scope="module")
def engines(demo):
    """Every engine's runs: {name: (runs, dflash state)}, the engines started
    together and run one at a time (harness.run_engines).

    The FILTERED oracle runs without the overlap scheduler, as in
    test_request_features.py: with it, plain SGLang's penalties never count the
    first decode step's token (its samples fit the exact distribution only with
    token 2 left out)."""
    text = demo["text"]
    filtered_runs = [run for name, sampling in PENALIZED.items() for run in _runs(text, N_FILTERED, sampling, name)]
    jobs = {
        "plain": Job(demo["engine"], _runs(text), True),
        "dflash2": Job(_dflash(demo, demo["dflash2"]), _runs(text), True),
        "dflash1": Job(_dflash(demo, demo["dflash1"]), _runs(text), True),
        "off": Job(_dflash(demo, demo["dflash2"]), _runs(text), True, {"SGLANG_DFLASH_POLICY": '{"mode": "off"}'}),
        "off one-row": Job(_dflash(demo, demo["dflash2"]), _runs(text), True,
                           {"SGLANG_DFLASH_POLICY": '{"mode": "off"}', "SGLANG_DFLASH_ONE_ROW_OFF": "1"}),
        "filtered plain": Job({**demo["engine"], "disable_overlap_schedule": True}, filtered_runs, True),
        "filtered dflash2": Job(_dflash(demo, demo["dflash2"]), filtered_runs, True),
    }
    return dict(zip(jobs, run_engines(list(jobs.values()))))


@pytest.fixture(scope="module")
def filtered(demo, engines):
    """Per PENALIZED setting: its exact distribution, the alternatives to it
    the test must reject, and plain decoding's samples."""
    no_penalties = {k: v for k, v in FILTERED.items() if not k.endswith("_penalty")}
    no_min_p = {k: v for k, v in FILTERED.items() if k != "min_p"}
    alternatives = {"penalties": {"temperature 1.0": {**FILTERED, "temperature": 1.0},
                                  "no penalties": no_penalties, "no min_p": no_min_p},
                    "repetition": {"no repetition penalty": SAMPLING}}
    out = {}
    for name, sampling in PENALIZED.items():
        exact, *others = exact_distributions(demo["engine"]["model_path"], demo["text"], sampling,
                                             *alternatives[name].values())
        out[name] = {"exact": exact, "probs": feature_probs(exact),
                     "alternatives": dict(zip(alternatives[name], others)),
                     "plain": sampled_features(_samples(engines["filtered plain"][0], N_FILTERED, name))}
    return out


def _v1_from_v2(drafter: str, out) -> str:
    """A DFlash v1 checkpoint (published layout) with the DFlash 2 drafter's shared weights."""
    with open(os.path.join(drafter, "config.json")) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["DFlashDraftModel"]
    cfg["dflash_config"] = {k: v for k, v in cfg["dflash_config"].items() if not k.startswith(V2_ONLY)}
    weights = load_file(os.path.join(drafter, "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not any(s in k for s in V2_ONLY)},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f)
    return str(out)


def _runs(text, n=N, sampling=SAMPLING, name="s"):
    return [{"name": name, "prompts": [text] * n, "batch_size": n, "sampling_params": sampling}]


def _samples(run, n, name="s"):
    outputs = [r["output_ids"] for r in run[name]["results"]]
    assert sum(len(o) >= 4 for o in outputs) > 0.95 * n
    return outputs


def _dflash(demo, drafter):
    return {**demo["engine"], "speculative_algorithm": "DFLASH", "speculative_draft_model_path": drafter,
            "speculative_num_draft_tokens": BLOCK}


def test_test_has_power(demo, engines):
    """Against temperature 1.0 the test at N rejects in >= 95% of simulated runs,
    and the exact distribution those runs draw from is the plain engine's."""
    power = simulated_power(demo["exact"], demo["hot"], N, reps=40)
    assert power >= 0.95, f"the test at N = {N} rejects T = 1.0 in only {power:.0%} of simulated runs"
    plain = sampled_features(_samples(engines["plain"][0], N))
    key, p = min_fit_p(plain, demo["probs"])
    assert p >= P_MIN, f"plain engine samples do not fit the exact distribution: {key} p = {p:.2e}"


@pytest.mark.parametrize("path", ["dflash2", "dflash1", "off", "off one-row"])
def test_sampled_distribution_matches_plain(demo, engines, path):
    spec, state = engines[path]
    got = sampled_features(_samples(spec, N))
    key, p = min_p(sampled_features(_samples(engines["plain"][0], N)), got)
    assert p >= P_MIN, f"{path}: {key} differs from plain sampling (chi-square p = {p:.2e})"
    key, p = min_fit_p(got, demo["probs"])
    assert p >= P_MIN, f"{path}: {key} does not fit the target's exact distribution (p = {p:.2e})"
    if path.startswith("off"):
        assert state["steps_by_width"][0] == state["steps"] > 0, state["steps_by_width"]
        one_row = state.get("one_row_verify")
        assert (one_row is None) if path == "off" else (one_row["steps"] == state["steps"]), state
        return
    # Only 3 tokens follow the prefill's first, so a verify commits at most 3;
    # 1.0 would mean no draft accepted (the accept test and residual untested).
    assert mean_accept(spec["s"]["results"]) > 1.2, f"{path}: drafts too rarely accepted to test sampling"


@pytest.mark.parametrize("setting", list(PENALIZED))
def test_filtered_test_has_power(filtered, setting):
    """At N_FILTERED the homogeneity test rejects each alternative in >= 95% of
    simulated runs, and plain decoding fits the exact distribution (the
    penalties and min_p are modelled as SGLang applies them)."""
    case = filtered[setting]
    for name, alternative in case["alternatives"].items():
        power = simulated_power(case["exact"], alternative, N_FILTERED, reps=40)
        assert power >= 0.95, f"at N = {N_FILTERED} the test rejects {name} in only {power:.0%} of runs"
    key, p = min_fit_p(case["plain"], case["probs"])
    assert p >= P_MIN, f"plain samples with {setting} do not fit: {key} p = {p:.2e}"


@pytest.mark.parametrize("setting", list(PENALIZED))
def test_sampled_with_penalties_matches_plain(engines, filtered, setting):
    spec, case = engines["filtered dflash2"][0], filtered[setting]
    got = sampled_features(_samples(spec, N_FILTERED, setting))
    key, p = min_p(case["plain"], got)
    assert p >= P_MIN, f"{key} differs from plain sampling with {setting} (p = {p:.2e})"
    key, p = min_fit_p(got, case["probs"])
    assert p >= P_MIN, f"{key} does not fit the exact distribution with {setting} (p = {p:.2e})"
    assert mean_accept(spec[setting]["results"]) > 1.2, "drafts too rarely accepted to test sampling"
