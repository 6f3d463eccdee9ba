"""The routed-experts host record on a CPU engine (adapter/cpu_host_pools.py):
its buffer skips the CUDA registration only while a record is built on a host
where nothing can pin; other allocations (HiCache's pools) are unchanged."""

from sglang_dflash.adapter import cpu_host_pools


def _alloc(calls):
    def alloc(dims, dtype, device, pin_memory, allocator=None, registration_granularity_bytes=None):
        calls.append((dims, device, pin_memory, allocator, registration_granularity_bytes))
        return "buffer"

    return alloc


def _allocate(calls, pin_memory=True):
    return cpu_host_pools.unregistered_while_building(_alloc(calls), (4, 2), "int32", "cpu", pin_memory,
                                                      allocator="alloc", registration_granularity_bytes=64)


def test_registration_skipped_only_for_a_record_where_nothing_can_pin(monkeypatch):
    for can_pin, registered in [(False, False), (True, True)]:
        monkeypatch.setattr(cpu_host_pools, "can_pin", lambda: can_pin)
        calls = []
        assert cpu_host_pools.building_record(lambda: _allocate(calls)) == "buffer"
        _allocate(calls)  # outside a record: as asked
        _allocate(calls, pin_memory=False)
        assert [c[2] for c in calls] == [registered, True, False], can_pin
        assert calls[0] == ((4, 2), "cpu", registered, "alloc", 64)


def test_the_scope_ends_when_the_record_fails(monkeypatch):
    monkeypatch.setattr(cpu_host_pools, "can_pin", lambda: False)

    def failing():
        raise MemoryError

    try:
        cpu_host_pools.building_record(failing)
    except MemoryError:
        pass
    calls = []
    _allocate(calls)
    assert calls[0][2] is True
