"""CostModel.storage_io_ns in closed form is storage_batch_ends' last item, the rule it prices
(SGLang 0.5.23 `HiCacheController._page_transfer` / `_page_backup`: one backend call a batch of
STORAGE_BATCH_SIZE pages, one after another). The closed form sums the whole batches as one
call times their count: these tests hold it to the batch-by-batch walk on hostile sizes and on
storage priced at hostile rates (a subclass's storage_ns, as tests/engine/helpers.price_at_zero
makes one), and to the same error where the price itself fails."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tierdiag.engine.costmodel import STORAGE_BATCH_PAGES
from tierdiag.engine.engine import Engine

# sizes the batch walk can enumerate: negative, zero, around the batch edges, large
PAGES = st.one_of(st.integers(min_value=-(1 << 40), max_value=0),
                  st.sampled_from([1, STORAGE_BATCH_PAGES - 1, STORAGE_BATCH_PAGES, STORAGE_BATCH_PAGES + 1,
                                   2 * STORAGE_BATCH_PAGES, 100 * STORAGE_BATCH_PAGES + 7]),
                  st.integers(min_value=1, max_value=200_000))
PAGE_BYTES = st.one_of(st.integers(min_value=-(1 << 62), max_value=1 << 62), st.sampled_from([0, 1, 1 << 17]))


def _cost():
    return Engine(helpers.small_config(verify="off")).cost


def _walk(cost, pages: int, page_bytes: int) -> int:
    """The old storage_io_ns: the batch-end list's last item."""
    return cost.storage_batch_ends(pages, page_bytes)[-1]


def _priced(cost, latency: int, rate: float):
    """`cost` with storage priced `latency + bytes / rate` seconds in ns (a subclass, as the
    compiled model's instances take no attribute)."""
    def storage_ns(self, num_bytes: int) -> int:
        return latency + int(num_bytes / rate * 1e9)
    kind = type("Priced", (type(cost),), {"storage_ns": storage_ns})
    return kind(**{f.name: getattr(cost, f.name) for f in dataclasses.fields(cost) if f.init})


@settings(max_examples=150, deadline=None)
@given(pages=PAGES, page_bytes=PAGE_BYTES)
def test_the_closed_form_is_the_batch_walks_last_end(pages, page_bytes):
    cost = _cost()
    assert cost.storage_io_ns(pages, page_bytes) == _walk(cost, pages, page_bytes)


@settings(max_examples=150, deadline=None)
@given(pages=PAGES, page_bytes=PAGE_BYTES,
       latency=st.integers(min_value=-(1 << 40), max_value=1 << 40),
       rate=st.one_of(st.floats(min_value=1e-3, max_value=1e15), st.floats(max_value=-1e-3, min_value=-1e15),
                      st.sampled_from([math.inf, -math.inf, 5e-324, 1e308])))
def test_the_closed_form_holds_at_any_storage_rate(pages, page_bytes, latency, rate):
    """A subclass's storage_ns (hostile latency, rates down to denormal, negative, infinite):
    the same price either way, or the same error where the price overflows."""
    cost = _priced(_cost(), latency, rate)
    try:
        want = _walk(cost, pages, page_bytes)
    except (OverflowError, ValueError) as err:
        try:
            cost.storage_io_ns(pages, page_bytes)
        except type(err):
            return
        raise AssertionError(f"the walk raised {err!r}, the closed form did not")
    assert cost.storage_io_ns(pages, page_bytes) == want


@settings(max_examples=40, deadline=None)
@given(pages=PAGES, page_bytes=PAGE_BYTES)
def test_storage_priced_at_zero_prices_every_operation_at_zero(pages, page_bytes):
    """helpers.price_at_zero's subclass (the scheduler harness's storage at 0 ns)."""
    cost = _priced(_cost(), 0, math.inf)
    assert cost.storage_io_ns(pages, page_bytes) == 0 == _walk(cost, pages, page_bytes)


def test_nan_rate_fails_as_the_walk_does():
    cost = _priced(_cost(), 0, math.nan)
    for fn in (lambda: _walk(cost, 300, 1 << 17), lambda: cost.storage_io_ns(300, 1 << 17)):
        try:
            fn()
        except ValueError as err:
            assert "NaN" in str(err)
        else:
            raise AssertionError("a NaN rate priced an operation")


def _storage_ns_reference(num_bytes: int) -> int:
    """storage_ns as written before its rate was a typed field: the module constants, in Python."""
    from tierdiag.config.constants import DISK_BYTES_PER_S
    from tierdiag.engine.costmodel import DISK_LATENCY_NS
    return DISK_LATENCY_NS + int(num_bytes / DISK_BYTES_PER_S * 1e9)


@settings(max_examples=200, deadline=None)
@given(num_bytes=st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70),
                           st.sampled_from([0, 1, -1, (1 << 62) - 1, 1 << 62, -(1 << 62), 1 << 63, (1 << 64) + 1]),
                           st.integers(min_value=1 << 1000, max_value=1 << 1100)))
def test_storage_ns_is_its_formula_with_the_module_rate(num_bytes):
    """The compiled storage_ns (its rate a typed float field) against the formula in Python:
    the same ns at any size (negative, zero, past int64), the same error past a float's range."""
    cost = _cost()
    try:
        want = _storage_ns_reference(num_bytes)
    except OverflowError:
        try:
            cost.storage_ns(num_bytes)
        except OverflowError:
            return
        raise AssertionError("the formula overflowed, storage_ns did not")
    assert cost.storage_ns(num_bytes) == want
