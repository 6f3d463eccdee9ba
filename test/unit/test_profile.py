"""The start-up cost profile (adapter/profile.py) on the tiny pair, no SGLang."""

import sys
import time
from pathlib import Path

import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.adapter.profile import _best_times, profile_costs  # noqa: E402
from sglang_dflash.checkpoint import load_drafter  # noqa: E402
from sglang_dflash.policy import CostModel  # noqa: E402
from sglang_dflash.train.cli import load_target  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "python" / "sglang_dflash" / "assets" / "tiny"


def _sleeper(calls: list, slow_calls: set):
    """A maker whose calls take 2 ms, 60 ms on the calls numbered in `slow_calls`."""
    def make():
        def fn():
            calls.append(None)
            time.sleep(0.06 if len(calls) in slow_calls else 0.002)
        return fn
    return make


def test_a_burst_during_one_pass_is_dropped():
    """A busy host during one pass (call 2 of sample 0, its timed call in
    pass 0, after the warm-up) costs that pass only; with one pass (the
    control) the burst is the sample's time."""
    calls, other = [], []
    best = _best_times([_sleeper(calls, {2}), _sleeper(other, set())], passes=3)
    assert len(calls) == 4 and len(other) == 4  # one warm-up and three timed calls each
    assert best[0] < 0.03 and best[1] < 0.03
    calls = []
    assert _best_times([_sleeper(calls, {2})], passes=1)[0] > 0.05  # the burst, when it is all there is


def test_profile_of_the_tiny_pair_fits_a_cost_model():
    target, _ = load_target(TINY / "target")
    c = target.config
    drafter = load_drafter(TINY / "dflash2-random", target_hidden_size=c.hidden_size,
                           target_vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers)
    with torch.no_grad():
        samples = profile_costs(target, drafter, 8, batch_sizes=(1, 4), context_len=16)
    assert len(samples) == 2 * (8 + 1)  # every width's verify, and one drafted step, per batch size
    for bs in (1, 4):
        plain = {q: sec for b, q, drafted, sec in samples if b == bs and not drafted}
        drafted = [sec for b, q, d, sec in samples if b == bs and d]
        assert sorted(plain) == list(range(1, 9)) and len(drafted) == 1
        assert drafted[0] > plain[1] > 0  # a drafted step is the plain one plus the drafter
    model = CostModel.from_profile(samples)
    assert model.base(4, 7) > model.base(4, 0) > 0


def test_profile_inputs_use_the_activation_dtype_not_a_quantized_weights():
    """A target whose first decoder weight is stored as int8 (as quantized
    layers store theirs) still profiles: inputs are built in the activation
    dtype and the int8 weight is timed through a same-shape stand-in."""
    target, _ = load_target(TINY / "target")
    c = target.config
    drafter = load_drafter(TINY / "dflash2-random", target_hidden_size=c.hidden_size,
                           target_vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers)
    module, name = next((m, n) for m in target.model.layers.modules()
                        for n, p in m.named_parameters(recurse=False) if p.dim() == 2)
    stored = getattr(module, name)
    setattr(module, name, torch.nn.Parameter(stored.data.to(torch.int8), requires_grad=False))
    with torch.no_grad():
        samples = profile_costs(target, drafter, 8, dtype=torch.float32, batch_sizes=(1,),
                                widths=[0, 7], context_len=16)
    assert len(samples) == 3 and all(sec > 0 for *_, sec in samples)
