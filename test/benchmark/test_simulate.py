"""Unit tests of the serving simulator (benchmark/simulate.py) itself: its
roofline against hand-computed step times, its acceptance model against the
tau it is built for, and its closed loop against trivial policies whose
outcome is known in closed form. Not its results."""

import math
import os
import random
import sys
from collections import deque
from dataclasses import replace
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import simulate as sim  # noqa: E402

# A toy device and model with round numbers, so every step time below can be
# computed by hand: 1 TB/s, 100 TFLOP/s, 1e9 layer params, a 1e5-param head,
# 400 bytes of KV per token (2 layers x K,V x 1 head x 50 dims x 2 bytes).
TOY_DEVICE = sim.Device(bandwidth=1e12, matmul_flops=1e14, step_noise=0.0)
TOY_TARGET = sim.Target("toy", layers=2, hidden=100, q_heads=1, kv_heads=1, head_dim=50,
                        vocab=1000, layer_params=1e9, source="test")
TOY_DRAFTER = sim.Drafter(layers=1, hidden=100, ffn=400, q_heads=1, kv_heads=1, head_dim=50, vocab=1000)


def toy(overhead=0.0):
    return sim.DeviceModel(TOY_TARGET, TOY_DRAFTER, TOY_DEVICE, block_size=8, fixed_overhead=overhead)


# -- roofline ---------------------------------------------------------------


def test_toy_plain_step_is_weight_bound_at_batch_one():
    # layers: max(2e9 B / 1e12, 2e9 FLOP / 1e14) = 2 ms; head: 2e5 B / 1e12 = 0.2 us;
    # attention: no context, one row written: 400 B / 1e12 = 0.4 ns.
    assert TOY_TARGET.kv_bytes_per_token == 400
    expected = 2e-3 + 2e-7 + 4e-10
    assert toy().decode_seconds(1, 0, 0, 0, plugin=False) == pytest.approx(expected, rel=1e-12)


def test_toy_verify_is_compute_bound_at_512_tokens():
    # bs 64 x q 8 = 512 rows: layers max(2 ms, 2e9 * 512 / 1e14 = 10.24 ms);
    # head max(0.2 us, 2e5 * 512 / 1e14 = 1.024 us); attention 400 B x 512 rows.
    expected = 10.24e-3 + 1.024e-6 + 400 * 512 / 1e12
    assert toy().target_forward(64, 8, 0) == pytest.approx(expected, rel=1e-12)


def test_toy_attention_reads_the_kv_cache_once_per_request():
    # 4 requests of 1e6 context tokens: 400 B x (4e6 + 4 written) / 1e12 = 1.6 ms
    # (FLOPs 4 x 2 layers x 50 x (4e6 + 4) = 1.6e9 -> 16 us: memory bound).
    rows = 4
    layers_and_head = max(2e-3, 2e9 * rows / 1e14) + max(2e5 / 1e12, 2e5 * rows / 1e14)
    expected = layers_and_head + 400 * (4e6 + rows) / 1e12
    assert toy().target_forward(4, 1, 4e6) == pytest.approx(expected, rel=1e-12)


def test_speculative_step_is_verify_plus_drafter_plus_projection_plus_overhead():
    dm = toy(overhead=0.004)
    parts = (dm.target_forward(16, 6, 1000) + dm.drafter_forward(16, 900)
             + dm.context_projection(16 * 6) + 0.004)
    assert dm.decode_seconds(16, 5, 1000, 900) == pytest.approx(parts, rel=1e-12)
    # The overhead is a speculative step's only: plain and off steps do not pay it.
    assert dm.decode_seconds(16, 0, 1000, 900, plugin=False) == dm.target_forward(16, 1, 1000)


def test_h200_plain_step_at_batch_one_is_the_weights_over_bandwidth():
    target, drafter = sim.MODELS["qwen3.8-27b"]
    dm = sim.DeviceModel(target, drafter)
    weights = 2 * (27.0e9 - 248320 * 5120)  # layers + head, bf16: 51.46 GB
    assert dm.decode_seconds(1, 0, 0, 0, plugin=False) == pytest.approx(weights / 4.3e12, rel=1e-4)
    assert weights / 4.3e12 == pytest.approx(11.967e-3, rel=1e-3)


def test_published_drafter_parameter_count():
    # docs/design.md §11.1: 1,924,404,480 parameters for the Qwen3.8-27B DFlash2 drafter.
    assert sim.MODELS["qwen3.8-27b"][1].total_params() == 1_924_404_480


def test_deferred_projection_shares_one_weight_read():
    dm = toy()
    row_bytes = TOY_DRAFTER.taps * TOY_TARGET.hidden * 2
    rows = 10
    share = rows * row_bytes / sim.DEFER_BYTES
    params = TOY_DRAFTER.context_params()
    expected = max(2 * params * share / 1e12, 2 * params * rows / 1e14)
    assert dm.context_projection(rows, deferred=True) == pytest.approx(expected, rel=1e-12)
    assert dm.context_projection(rows, deferred=True) < dm.context_projection(rows)


def test_profile_mimics_the_workers_start_up_profile():
    dm = toy()
    samples = dm.profile_samples(random.Random(0))
    assert len(samples) == len(sim.PROFILE_BATCH_SIZES) * (dm.block_size + 1)
    plain = {(bs, q): t for bs, q, drafted, t in samples if not drafted}
    assert set(q for _, q in plain) == set(range(1, dm.block_size + 1))
    for bs, q, drafted, t in samples:
        if drafted:  # a plain dense step plus the drafter's block
            assert q == 1 and t > plain[bs, 1]
        else:  # dense weights only: no attention, no overhead
            assert t == pytest.approx(dm.dense_only(bs, q))


# -- acceptance -------------------------------------------------------------


@pytest.mark.parametrize("tau", [5.46, 4.39, 3.58])
def test_acceptance_model_reproduces_tau(tau):
    model = sim.AcceptanceModel.from_tau(tau)
    assert model.expected_length(sim.BLOCK_SIZE - 1) == pytest.approx(tau, abs=1e-9)
    ratios = [b / a for a, b in zip(model.rates, model.rates[1:])]
    assert ratios == pytest.approx([sim.ACCEPT_DECAY] * len(ratios))
    rng = random.Random(1)
    draws = [model.draw(sim.BLOCK_SIZE - 1, rng) + 1 for _ in range(40000)]
    assert sum(draws) / len(draws) == pytest.approx(tau, abs=0.03)


def test_acceptance_model_rejects_impossible_tau():
    with pytest.raises(ValueError):
        sim.AcceptanceModel.from_tau(8.5)


# -- closed loop --------------------------------------------------------------


class ConstantDevice:
    """Every decode step takes `step` seconds, prefill is free, KV unlimited."""

    block_size = 8
    device = SimpleNamespace(step_noise=0.0)
    drafter = SimpleNamespace(window=2048)

    def __init__(self, step):
        self.step = step

    def decode_seconds(self, bs, width, context, window_context, plugin=True):
        return self.step

    def prefill_seconds(self, prompts, plugin=True):
        return 0.0

    def kv_capacity_tokens(self):
        return 10**9


NEVER = sim.AcceptanceModel((0.0,) * 7)
ALWAYS = sim.AcceptanceModel((1.0,) * 7)


def run(device, acceptance, requests, clients, policy, **kw):
    sched = sim.Scheduler(max_running=64, kv_capacity=10**9)
    return sim.simulate(device, acceptance, requests, clients, policy, scheduler=sched, **kw)


def test_plain_loop_decodes_batch_over_step_time():
    clients, n, length, step = 4, 12, 50, 0.01
    res = run(ConstantDevice(step), NEVER, [(10, length)] * n, clients, sim.FixedWidth(0))
    # Prefill emits each request's first token; then length - 1 steps, three waves of 4.
    assert res.tokens == n * length
    assert res.steps == (n // clients) * (length - 1)
    assert res.decode_tokens / res.decode_seconds == pytest.approx(clients / step)
    assert res.seconds == pytest.approx(res.steps * step)
    assert res.finished == n
    # Little's law: with no think time and free prefill every client always has
    # one request in the system, so mean requests in system = sum of latencies / time = c.
    assert res.latency_sum / res.seconds == pytest.approx(clients)


def test_full_acceptance_commits_whole_blocks_and_no_token_past_the_end():
    length, width = 50, 7
    res = run(ConstantDevice(0.02), ALWAYS, [(10, length)] * 3, 1, sim.FixedWidth(width))
    assert res.tokens == 3 * length  # the last block's overshoot is not counted
    assert res.steps == 3 * math.ceil((length - 1) / (width + 1))
    assert res.steps_by_width == {width: res.steps}


def test_tokens_are_conserved_under_the_real_adaptive_policy():
    target, drafter = sim.MODELS["qwen3.8-27b"]
    dm = sim.DeviceModel(target, drafter, fixed_overhead=0.005)
    requests = sim.make_requests([50, 120, 300], replace(sim.WORKLOADS["code"], output_median=150),
                                 24, random.Random(2))
    policy = sim.make_policy("adaptive", dm, seed=3)
    res = sim.simulate(dm, sim.AcceptanceModel.from_tau(4.39), requests, 6, policy, seed=3)
    assert res.tokens == sum(out for _, out in requests)
    assert res.finished == len(requests)
    assert res.steps == policy.steps
    assert sum(res.steps_by_width.values()) == res.steps
    assert res.seconds == pytest.approx(res.decode_seconds + res.prefill_seconds)


def test_loop_is_deterministic_for_a_seed():
    target, drafter = sim.MODELS["qwen3.8-27b"]
    dm = sim.DeviceModel(target, drafter, fixed_overhead=0.005)
    requests = [(80, 200)] * 8
    runs = [sim.simulate(dm, sim.AcceptanceModel.from_tau(5.46), requests, 4,
                         sim.make_policy("adaptive", dm, seed=5), seed=5).seconds for _ in range(2)]
    assert runs[0] == runs[1]


def test_kv_pool_limits_admission():
    sched = sim.Scheduler(max_running=64, kv_capacity=250)
    pending = deque(sim._Request(10, 100, c, 0.0) for c in range(4))
    batch = sched.admit(pending, [], reserved=0)
    assert len(batch) == 2 and len(pending) == 2  # each needs 110 of 250 tokens


def test_min_free_slots_delayer_holds_dflash_admissions():
    assert sim.Scheduler.sglang(64, 10**6, dflash=True).min_free_slots == 4
    assert sim.Scheduler.sglang(64, 10**6, dflash=False).min_free_slots is None
    sched = sim.Scheduler.sglang(64, 10**6, dflash=True)
    running = [sim._Request(10, 100, c, 0.0) for c in range(61)]
    pending = deque([sim._Request(10, 100, 99, 0.0)])
    assert sched.admit(pending, running, reserved=0) == []  # 3 free slots < 4
    assert len(sched.admit(pending, running[:60], reserved=0)) == 1


def test_calibration_hits_its_target_speedup():
    dm = toy()
    requests = [(20, 120)] * 4
    acceptance = sim.AcceptanceModel.from_tau(4.0)
    overhead = sim.calibrate(dm, acceptance, requests, 1, target=2.0, seed=0)
    plain = sim.simulate(dm, acceptance, requests, 1, sim.FixedWidth(0), plugin=False, seed=0)
    on = sim.simulate(replace(dm, fixed_overhead=overhead), acceptance, requests, 1,
                      sim.FixedWidth(7), seed=0)
    assert overhead > 0
    assert on.throughput / plain.throughput == pytest.approx(2.0, rel=1e-3)
