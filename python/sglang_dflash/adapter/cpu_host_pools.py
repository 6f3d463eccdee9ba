"""The host record of `--enable-return-routed-experts` on SGLang's CPU engine.

SGLang 0.5.23 keeps each token slot's routed experts (and a DSA indexer's
top-k) in a host buffer (`state_capturer.base.BaseHostCache`), allocated
through `alloc_with_host_register` with `pin_memory=True`, which registers the
pages with the CUDA runtime; on a host without CUDA that raises at start-up
("Cannot re-initialize CUDA"), with or without speculation. Registration only
speeds copies from a device, which a CPU engine never makes, so while such a
record is built on a host where nothing can pin, its buffer is allocated the
same way unregistered. Only there: HiCache's host pools go through the same
allocator, and HiCache on a CPU would fail later, mid-request (device
streams), so it keeps failing at start-up. Hosts that can pin are left alone.
"""

from __future__ import annotations

import threading

from sglang_dflash.adapter.cpu_lora import can_pin

RECORD_INIT_TARGET = "sglang.srt.state_capturer.base.BaseHostCache.__init__"
HOST_REGISTER_TARGET = "sglang.srt.mem_cache.pool_host.common.alloc_with_host_register"

_building = threading.local()


def building_record(original, *args, **kwargs):
    """AROUND `BaseHostCache.__init__`: where nothing can pin, its allocation
    (`unregistered_while_building`) skips the registration."""
    if can_pin():
        return original(*args, **kwargs)
    _building.active = True
    try:
        return original(*args, **kwargs)
    finally:
        _building.active = False


def unregistered_while_building(original, dims, dtype, device, pin_memory, *args, **kwargs):
    """AROUND `alloc_with_host_register`: no registration for a record's buffer
    built where nothing can pin; every other caller unchanged."""
    if pin_memory and getattr(_building, "active", False):
        pin_memory = False
    return original(dims, dtype, device, pin_memory, *args, **kwargs)
