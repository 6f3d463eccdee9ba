"""SGLang's own n-gram speculation (`--speculative-algorithm NGRAM`, the peer in
the benchmark grid) on the CPU engine: it runs on the stand-in's tree ops and
our tree-masked TARGET_VERIFY attention, and its greedy output equals plain
decoding. (Upstream verifies NGRAM greedily on CPU: sampled requests get the
target's argmax there, so only greedy output is compared.)

The n-gram corpus is SGLang's C++ module, JIT-built with the host's C++
compiler on first use (cached under ~/.cache/sglang/jit).
"""

from harness import Job, chat_prompts, run_engines

PROMPTS = 12
GREEDY = {"max_new_tokens": 48, "temperature": 0.0}
NGRAM = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)


def _runs(prompts):
    # A repeated prompt: its earlier output feeds the corpus, so drafts match.
    return [{"name": f"bs{bs}", "prompts": prompts + prompts[:2], "batch_size": bs,
             "sampling_params": GREEDY} for bs in (1, 4)]


def test_ngram_greedy_identical_to_plain():
    prompts = chat_prompts(PROMPTS)
    plain, ngram = run_engines([Job({}, _runs(prompts)), Job(NGRAM, _runs(prompts))], timeout=3000)
    accepted = []
    for name, run in plain.items():
        want = [r["output_ids"] for r in run["results"]]
        got = [r["output_ids"] for r in ngram[name]["results"]]
        assert got == want, f"{name}: NGRAM output differs from plain decoding"
        accepted += [r["meta_info"]["spec_accept_length"] or 0.0 for r in ngram[name]["results"]]
    # Tree verification really accepted drafts (not only one token per verify).
    assert max(accepted) > 1.2, accepted
