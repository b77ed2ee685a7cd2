"""The storage price the scheduler harness gives both sides (storage_price.priced): the engine's
cost model with a slower disk, the same numbers in the engine and in SGLang's worker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.sglang.storage_price import priced
from tierdiag.engine.engine import Engine


@settings(max_examples=40, deadline=None)
@given(slowdown=st.one_of(st.integers(min_value=1, max_value=10_000), st.floats(min_value=1.0, max_value=1e4)),
       num_bytes=st.integers(min_value=0, max_value=1 << 40), pages=st.integers(min_value=0, max_value=1000))
def test_a_slower_disk_prices_every_storage_call_alike(slowdown, num_bytes, pages):
    base = Engine(helpers.small_config(verify="off")).cost
    slow = priced(base, slowdown)
    assert slow.storage_ns(num_bytes) == base.storage_ns(int(num_bytes * slowdown)) >= base.storage_ns(num_bytes)
    # the batch helpers call the slowed storage_ns (the compiled model dispatches to the subclass)
    ends = slow.storage_batch_ends(pages, 1 << 17)
    assert ends[0] == slow.storage_ns(min(pages, 128) * (1 << 17))
    assert slow.copy_ns(1 << 20, 4, to_device=True) == base.copy_ns(1 << 20, 4, to_device=True)
    assert priced(base, 1) is base
