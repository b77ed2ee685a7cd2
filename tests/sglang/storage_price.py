"""The storage price both sides of the scheduler harness use (the engine in this process, SGLang's
threads in the worker: sglang0523_storage.TIMING): the engine's cost model, its `storage_ns` for
a disk `slowdown` times slower (bytes / (DISK_BYTES_PER_S / slowdown) + the call's latency), so
that reads outlast passes and the `timeout` policy cuts them short at CI sizes. slowdown 1: the
engine's own price."""

from __future__ import annotations

import dataclasses


def priced(cost, slowdown: float):
    """`cost` (a CostModel, compiled or not) with storage `slowdown` times slower: a subclass (the
    compiled model's instances take no attribute)."""
    if slowdown == 1:
        return cost
    base = type(cost)

    def storage_ns(self, num_bytes: int) -> int:
        return base.storage_ns(self, int(num_bytes * slowdown))

    slow = type("SlowStorage", (base,), {"storage_ns": storage_ns})
    return slow(**{f.name: getattr(cost, f.name) for f in dataclasses.fields(cost) if f.init})
