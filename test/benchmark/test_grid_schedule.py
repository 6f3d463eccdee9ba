"""benchmark/grid.py's interleaved schedule: which server process measures which
repetition, with and without --restart-each-rep (servers and cells faked; the
real servers are exercised by test/integration/test_benchmark_harness.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmark"))
import grid  # noqa: E402


class FakeServer:
    def __init__(self, name, launch):
        self.name, self.launch, self.stopped = name, launch, 0

    def stop(self):
        self.stopped += 1


@pytest.fixture
def faked(monkeypatch):
    launches = []

    def start_servers(names, opts, log_dir, on_cuda, launched):
        servers = {n: FakeServer(n, len(launches)) for n in names}
        launched.extend(servers.values())
        launches.append(servers)
        return servers, {n: {"state": "ok", "startup_s": 10.0 + len(launches)} for n in names}

    def run_cell(bench, srv, name, w, c, rep, *rest):
        assert srv.stopped == 0, "a cell ran on a stopped server"
        return {"config": name, "workload": w, "concurrency": c, "rep": rep, "launch": srv.launch}

    monkeypatch.setattr(grid, "start_servers", start_servers)
    monkeypatch.setattr(grid, "run_cell", run_cell)
    return launches


def _opts(restart):
    args = ["--configs", "plain,dflash-on", "--workloads", "math,chat", "--concurrency", "1,8",
            "--repeats", "3", "--out", "/tmp/unused"]
    return grid.parse_args(args + (["--restart-each-rep"] if restart else []))


@pytest.mark.parametrize("restart", [False, True])
def test_each_repetition_runs_on_its_own_launch_only_when_asked(faked, restart):
    cells, statuses = grid.run_grid(_opts(restart), None, {}, "/tmp", on_cuda=False)
    assert len(cells) == 3 * 2 * 2 * 2  # reps x workloads x concurrency x configs
    launch_of = {(c["rep"], c["config"]): set() for c in cells}
    for c in cells:
        launch_of[(c["rep"], c["config"])].add(c["launch"])
    if restart:
        assert len(faked) == 3
        assert all(launches == {rep} for (rep, _), launches in launch_of.items())
        assert statuses["dflash-on"]["startup_s_each"] == [11.0, 12.0, 13.0]
    else:
        assert len(faked) == 1
        assert all(launches == {0} for launches in launch_of.values())
    # every server of every launch is stopped by the end
    assert all(srv.stopped >= 1 for servers in faked for srv in servers.values())


def test_a_later_failed_launch_is_what_the_status_reports():
    statuses = {}
    grid._merge_status(statuses, {"dflash-on": {"state": "ok", "startup_s": 40.0}})
    grid._merge_status(statuses, {"dflash-on": {"state": "failed", "reason": "boom"}})
    grid._merge_status(statuses, {"dflash-on": {"state": "ok", "startup_s": 41.0}})
    assert statuses["dflash-on"]["state"] == "failed"
    assert statuses["dflash-on"]["startup_s_each"] == [40.0, 41.0]
