"""The sampled-losslessness test's statistic, and its power computed from the
target's exact distribution instead of trusted from one engine sample.

The test (test/integration/test_sampling.py; the --tp 2 one in
test_tensor_parallel.py) samples N 4-token continuations of one chat prompt
from an engine with speculation and N from plain decoding, and runs a
chi-square test of homogeneity on token 2, token 3, token 4 and the pair
(2, 3); any p-value below P_MIN fails it.

Its power against a stated alternative (plain decoding at temperature 1.0
instead of 0.9) is computed here, not read off one run with a fixed seed
(one such run can pass where the test has almost no power):

1. `continuation_distribution`: every continuation SGLang's torch sampler
   can produce (softmax of logits / T, then top-k and top-p), with its exact
   probability; paths with a stop token before token 4 are dropped, as the
   test drops short outputs. The prompt's KV cache is shared by all paths.
2. `simulated_power`: the test itself (the same features, the same
   `homogeneity_p`) on independent draws of N from each distribution, over
   many simulated runs: the fraction rejected is the power. The tests also
   check each sample's fit to the exact distribution (`goodness_of_fit_p`),
   whose power is simulated the same way (`fit=True`).

    python benchmark/sampling_power.py                    # the demo pair's prompt, alternative T = 1.0
    python benchmark/sampling_power.py --target tiny --n 20000
    python benchmark/sampling_power.py --filtered --n 6000   # with min_p and penalties (FILTERED)
"""

from __future__ import annotations

import argparse
import copy
from collections import Counter

import numpy as np
import torch
from scipy.stats import chi2, chi2_contingency

SAMPLING = {"max_new_tokens": 4, "temperature": 0.9, "top_p": 0.95, "top_k": 16}
# The same with min_p and SGLang's additive penalties. Negative penalties (the
# range is [-2, 2]) favour repeats: positive ones barely move the first four
# tokens of the demo target, which seldom repeat a token so early, so no test
# at a feasible N would notice them dropped.
FILTERED = {**SAMPLING, "min_p": 0.05, "frequency_penalty": -1.5, "presence_penalty": -1.0}
# The same with SGLang's scaling penalty alone (beside the additive ones plain
# decoding applies the two in a set's iteration order, so no fixed model).
# Below 1 it favours repeats, for the reason the additive ones are negative.
REPETITION = {**SAMPLING, "repetition_penalty": 0.5}
P_MIN = 1e-4
# The tests sample mixed_chat_prompts' fifth prompt (a HumanEval stub). Of the
# first twelve, the four code prompts' continuations move most with the
# temperature, so the test reaches its power at about a third of the samples
# the first (a GSM8K question) needs: `--prompt I` compares them.
PROMPT_INDEX = 4
FEATURES = ("token2", "token3", "token4", "pair23")


# ---------------------------------------------------------------------------
# The test's statistic
# ---------------------------------------------------------------------------


def sampled_features(outputs: list[list[int]]) -> dict[str, list]:
    """Output token ids of 4-token requests -> the four features the test compares
    (outputs shorter than 4, ended by a stop token, are dropped)."""
    outs = [o for o in outputs if len(o) >= 4]
    return {"token2": [o[1] for o in outs], "token3": [o[2] for o in outs],
            "token4": [o[3] for o in outs], "pair23": [(o[1], o[2]) for o in outs]}


def mean_accept(results: list[dict]) -> float:
    """Mean spec_accept_length over the requests the features use (4+ tokens): a
    request whose first token stops it never verifies."""
    lengths = [r["meta_info"]["spec_accept_length"] for r in results if len(r["output_ids"]) >= 4]
    return sum(lengths) / len(lengths)


def homogeneity_p(a: list, b: list, min_count: int = 10) -> float:
    """Chi-square test of homogeneity of two samples of categories; the
    categories with fewer than `min_count` pooled observations are merged into
    one, so the chi-square approximation holds."""
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda k: -(ca[k] + cb[k]))
    big = [k for k in keys if ca[k] + cb[k] >= min_count]
    rest = [sum(c[k] for k in keys if ca[k] + cb[k] < min_count) for c in (ca, cb)]
    table = [[c[k] for k in big] + [r] for c, r in zip((ca, cb), rest)]
    if sum(rest) == 0:
        table = [row[:-1] for row in table]
    return 1.0 if len(table[0]) < 2 else float(chi2_contingency(table)[1])


def goodness_of_fit_p(sample: list, probs: dict, min_expected: float = 10.0) -> float:
    """Chi-square goodness of fit of a sample to exact category probabilities
    (`feature_probs`). Categories expected fewer than `min_expected` times are
    merged into one, with every observed category the exact distribution lacks."""
    n = len(sample)
    counts = Counter(sample)
    big = [k for k, q in probs.items() if n * q >= min_expected]
    observed = [counts[k] for k in big]
    expected = [n * probs[k] for k in big]
    rest_obs, rest_exp = n - sum(observed), n - sum(expected)
    if rest_exp > 1e-9 * n:
        observed.append(rest_obs)
        expected.append(rest_exp)
    elif rest_obs > 0:  # outside the exact support, where nothing was expected
        return 0.0
    if len(observed) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return float(chi2.sf(stat, len(observed) - 1))


def min_p(a: dict[str, list], b: dict[str, list]) -> tuple[str, float]:
    """The feature with the smallest homogeneity p-value, and that p-value."""
    return min(((k, homogeneity_p(a[k], b[k])) for k in FEATURES), key=lambda kp: kp[1])


# ---------------------------------------------------------------------------
# The target's exact distribution of continuations
# ---------------------------------------------------------------------------


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                   min_p: float = 0.0) -> torch.Tensor:
    """[n, V] logits -> [n, V] next-token probabilities as SGLang's torch sampler
    draws them: softmax(logits / T); ranks >= top_k and the tail after top_p cut,
    then those below min_p times the top probability."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    sort, idx = probs.sort(dim=-1, descending=True)
    before = torch.cumsum(sort, dim=-1) - sort
    sort[:, top_k:] = 0.0
    sort[before > top_p] = 0.0
    sort[sort < sort[:, :1] * min_p] = 0.0
    sort = sort / sort.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, idx, sort)


def penalized(logits: torch.Tensor, history: torch.Tensor, frequency: float, presence: float) -> torch.Tensor:
    """[n, V] logits less SGLang's additive penalties for each row's output so
    far (history [n, j] token ids): frequency x count and presence x (count > 0)."""
    if history.shape[1] == 0 or (frequency == 0.0 and presence == 0.0):
        return logits
    counts = torch.zeros_like(logits).scatter_add_(1, history, torch.ones(history.shape, dtype=logits.dtype))
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def scaled(logits: torch.Tensor, history: torch.Tensor, repetition: float) -> torch.Tensor:
    """[n, V] logits with SGLang's repetition penalty for each row's output so
    far (history [n, j]): a token that occurred has its logit divided by r if
    positive, multiplied by r if negative."""
    if history.shape[1] == 0 or repetition == 1.0:
        return logits
    seen = torch.zeros(logits.shape, dtype=torch.bool).scatter_(1, history, True)
    return torch.where(seen, torch.where(logits < 0, logits * repetition, logits / repetition), logits)


def _next_probs(logits: torch.Tensor, history: torch.Tensor, sampling: dict) -> torch.Tensor:
    """The distribution a request with `sampling` draws its next token from."""
    logits = penalized(logits, history, sampling.get("frequency_penalty", 0.0), sampling.get("presence_penalty", 0.0))
    logits = scaled(logits, history, sampling.get("repetition_penalty", 1.0))
    return filtered_probs(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"],
                          sampling.get("min_p", 0.0))


def _path_logits(model, prompt, prompt_ids: list[int], ids: torch.Tensor) -> torch.Tensor:
    """[n, V] next-token logits after the prompt and each path of ids [n, d]: over
    copies of the prompt's KV cache, or, for a hybrid target whose linear-attention
    cache transformers cannot replicate, over the whole sequence."""
    cache = prompt.past_key_values
    if all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(cache, "layers", [])):
        cache = copy.deepcopy(cache)
        cache.batch_repeat_interleave(len(ids))
        return model(ids, past_key_values=cache).logits[:, -1]
    full = torch.cat([torch.tensor([prompt_ids]).expand(len(ids), -1), ids], dim=1)
    return model(full).logits[:, -1]


@torch.no_grad()
def continuation_distribution(model, prompt_ids: list[int], stop_ids: set[int], sampling: dict,
                              chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Every continuation of the prompt of sampling["max_new_tokens"] tokens and
    its probability under `sampling` (SGLang's sampling params: temperature,
    top_k, top_p, optional min_p, frequency_penalty, presence_penalty, or
    repetition_penalty alone): ([n, depth] int64 ids, [n] float64 masses summing to 1)."""
    additive = sampling.get("frequency_penalty", 0.0) != 0.0 or sampling.get("presence_penalty", 0.0) != 0.0
    if additive and sampling.get("repetition_penalty", 1.0) != 1.0:
        # SGLang applies its penalizers in the order of a set of classes, so a
        # scaling penalty beside the additive ones has no fixed distribution.
        raise ValueError("repetition_penalty beside frequency / presence penalties is not modelled")
    depth = sampling["max_new_tokens"]
    prompt = model(torch.tensor([prompt_ids]), use_cache=True)
    first = _next_probs(prompt.logits[:, -1], torch.empty(1, 0, dtype=torch.int64), sampling)[0]
    paths = first.nonzero()  # [n, 1]
    mass = first[paths[:, 0]]
    stops = torch.tensor(sorted(stop_ids), dtype=torch.int64)
    for _ in range(1, depth):
        keep = ~torch.isin(paths[:, -1], stops)  # ended before token `depth`: dropped
        paths, mass = paths[keep], mass[keep]
        grown_paths, grown_mass = [], []
        for start in range(0, len(paths), chunk):
            ids = paths[start:start + chunk]
            # The path so far (also the output history the penalties count).
            probs = _next_probs(_path_logits(model, prompt, prompt_ids, ids), ids, sampling)
            row, tok = probs.nonzero(as_tuple=True)
            grown_paths.append(torch.cat([ids[row], tok[:, None]], dim=1))
            grown_mass.append(mass[start:start + chunk][row] * probs[row, tok])
        paths, mass = torch.cat(grown_paths), torch.cat(grown_mass)
    return paths, mass / mass.sum()


def feature_probs(dist: tuple[torch.Tensor, torch.Tensor]) -> dict[str, dict]:
    """An exact distribution of continuations -> each feature's {value: probability}."""
    paths, mass = dist
    out: dict[str, dict] = {k: {} for k in FEATURES}
    for path, m in zip(paths.tolist(), mass.tolist()):
        for key, value in zip(FEATURES, (path[1], path[2], path[3], (path[1], path[2]))):
            out[key][value] = out[key].get(value, 0.0) + m
    return out


def min_fit_p(sample: dict[str, list], probs: dict[str, dict]) -> tuple[str, float]:
    """The feature whose sample fits its exact probabilities worst, and its p-value."""
    return min(((k, goodness_of_fit_p(sample[k], probs[k])) for k in FEATURES), key=lambda kp: kp[1])


def sampling_prompt(target: str, index: int = PROMPT_INDEX) -> str:
    """The sampling tests' prompt in the target's chat template."""
    from sglang_dflash.tools.prompts import mixed_chat_prompts

    return mixed_chat_prompts(target, index + 1)[index]


def load_target(path: str):
    """(model, tokenizer, stop ids) of an HF target directory, float32, eval."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    stops = {model.config.eos_token_id, tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    return model, tok, {s for s in stops if s is not None}


def exact_distributions(target: str, text: str, *samplings: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`continuation_distribution` of a chat text under each of `samplings`;
    the target is loaded once."""
    model, tok, stops = load_target(target)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return [continuation_distribution(model, ids, stops, sampling) for sampling in samplings]


# ---------------------------------------------------------------------------
# Power by simulation
# ---------------------------------------------------------------------------


def draw(dist: tuple[torch.Tensor, torch.Tensor], n: int, rng: np.random.Generator) -> list[list[int]]:
    """n independent continuations from an exact distribution."""
    paths, mass = dist
    p = mass.numpy()
    return paths[rng.choice(len(p), size=n, p=p / p.sum())].tolist()


def simulated_power(base, alternative, n: int, reps: int, seed: int = 0, p_min: float = P_MIN,
                    fit: bool = False) -> float:
    """Fraction of `reps` simulated tests that reject: the power against
    `alternative` (the false-alarm rate, with base twice). Homogeneity: n draws
    from each distribution; `fit`: n draws from `alternative` against base's
    exact probabilities."""
    rng = np.random.default_rng(seed)
    probs = feature_probs(base) if fit else None

    def rejects() -> bool:
        alt = sampled_features(draw(alternative, n, rng))
        if fit:
            return min_fit_p(alt, probs)[1] < p_min
        return min_p(sampled_features(draw(base, n, rng)), alt)[1] < p_min

    return sum(rejects() for _ in range(reps)) / reps


TINY_TARGETS = {"tiny": "target", "hybrid": "hybrid-target", "lfm2": "lfm2-target"}  # --target -> asset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["demo", *TINY_TARGETS], default="demo",
                    help="demo pair's target, or a tiny test target (same prompt): the random "
                         "one, the Qwen3.5 hybrid, the LFM2 hybrid")
    ap.add_argument("--alt", type=float, default=1.0, help="alternative temperature (the test's: 1.0)")
    ap.add_argument("--n", type=int, nargs="+", default=[6000, 8000, 10000, 12000, 20000])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--filtered", action="store_true", help="FILTERED's params (min_p, penalties), not SAMPLING's")
    ap.add_argument("--prompt", type=int, default=PROMPT_INDEX, help="index in mixed_chat_prompts (the tests' one)")
    args = ap.parse_args()
    sampling = FILTERED if args.filtered else SAMPLING

    from sglang_dflash.demo import demo_pair, tiny_paths

    target = demo_pair()[0] if args.target == "demo" else tiny_paths()[TINY_TARGETS[args.target]]
    text = sampling_prompt(target, args.prompt)
    base, alt = exact_distributions(target, text, sampling, {**sampling, "temperature": args.alt})
    params = ", ".join(f"{k} {v}" for k, v in sampling.items() if k not in ("temperature", "max_new_tokens"))
    print(f"{args.target} target: T={sampling['temperature']} vs T={args.alt}, {params}; {len(base[0])} "
          f"continuations of prompt {args.prompt}; fail at p < {P_MIN:g}; {args.reps} runs each")
    print("  (power / false alarms of the homogeneity test against plain samples, then of the fit to exact)")
    for n in args.n:
        row = [simulated_power(base, alt, n, args.reps), simulated_power(base, base, n, args.reps, seed=1),
               simulated_power(base, alt, n, args.reps, fit=True),
               simulated_power(base, base, n, args.reps, seed=1, fit=True)]
        print(f"  N = {n:6d}: homogeneity {row[0]:.3f} / {row[1]:.3f}   fit {row[2]:.3f} / {row[3]:.3f}", flush=True)


if __name__ == "__main__":
    main()
