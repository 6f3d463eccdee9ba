"""one_row_verify.py: when speculation-off steps run as a one-row verify (with
their own captured graphs on CUDA), and that the runner's attention backend and
graph runner are this path's only inside `active` (restored on an error too).
That such a server is lossless is checked on the real engine in
test/integration (test_request_features, test_sampling); the capture itself
needs a GPU (benchmark/gpu_kit)."""

from types import SimpleNamespace

import pytest

from sglang_dflash.adapter.one_row_verify import OneRowVerify, wanted

EVERY = tuple(range(8))
CUDA = dict(cuda_graphs=True, any_width=True, widths=EVERY, mode="adaptive", linear_state=False,
            lora=False, two_batch_overlap=False, env="")


def test_cuda_graphs_on_an_any_width_backend_take_it():
    assert wanted(**CUDA) == ("graphs", "CUDA graphs")
    assert wanted(**{**CUDA, "widths": (0, 7), "mode": "off"})[0] == "graphs"


@pytest.mark.parametrize("change", [
    dict(cuda_graphs=False),  # eager either way: the DECODE forward stays
    dict(any_width=False),  # fa3 & co. size a verify from the block: one row would be wrong
    dict(widths=(7,)), dict(mode="on"),  # no W = 0 step to run
    dict(linear_state=True), dict(lora=True), dict(two_batch_overlap=True),
    dict(prefill_server=True), dict(env="0"),
])
def test_otherwise_the_decode_forward(change):
    way, why = wanted(**{**CUDA, **change})
    assert way is None and why


def test_forced_on_any_device_but_never_where_it_would_be_wrong():
    assert wanted(**{**CUDA, "cuda_graphs": False, "env": "1"}) == ("eager", "SGLANG_DFLASH_ONE_ROW_OFF=1")
    assert wanted(**{**CUDA, "env": "1"})[0] == "eager"  # forced: no capture, even with graphs
    for change in (dict(any_width=False), dict(linear_state=True), dict(mode="on")):
        assert wanted(**{**CUDA, "env": "1", **change})[0] is None, change


def _runner():
    return SimpleNamespace(attn_backend="full-block backend", decode_cuda_graph_runner="full-block graphs")


def test_active_swaps_the_backend_and_graphs_in_and_back():
    runner = _runner()
    graphs = SimpleNamespace(capture_bs=[1, 2, 4, 8])
    one_row = OneRowVerify(runner, "one-row backend", graphs)
    with one_row.active():
        assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("one-row backend", graphs)
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("full-block backend", "full-block graphs")
    with pytest.raises(RuntimeError), one_row.active():
        raise RuntimeError("a failed forward")
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("full-block backend", "full-block graphs")
    assert one_row.snapshot() == {"graphs": [1, 2, 4, 8], "steps": 2}


def test_takes_the_batches_its_graphs_cover_or_every_batch_eagerly():
    captured = OneRowVerify(_runner(), "b", SimpleNamespace(capture_bs=[1, 2, 4, 8]))
    assert captured.takes(1) and captured.takes(8) and not captured.takes(9)
    eager = OneRowVerify(_runner(), "b", None)
    assert eager.takes(1) and eager.takes(4096)
    with eager.active():  # no graphs: the forward runs eagerly on the one-row backend
        assert eager.model_runner.decode_cuda_graph_runner is None
