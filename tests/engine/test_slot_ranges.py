"""The data plane's slot range check (native/csrc/module.c `all_in_range`, one unsigned compare a
slot since session 29): a page move, a content write and a pool's free take a slot list only when
every slot is inside the pool, for any int64 a list can carry (negatives, INT64_MIN, the pool's
size and one below it, huge values); a list it refuses changes nothing and goes to the reference
(numpy), which raises its IndexError."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import rows
from tierdiag.engine.dataplane import DataPlane
from tierdiag.engine.pagepool import PagePool
from tierdiag.native import cplane

_MOVE = cplane.compiled("move")
_WRITE = cplane.compiled("write_content")
pytestmark = pytest.mark.skipif(_MOVE is None or _WRITE is None, reason="the compiled data plane is not built")

INT64 = st.integers(-(2**63), 2**63 - 1)


def _pool(pages: int, layout: str) -> PagePool:
    return PagePool("host", pages, DataPlane(2, 4, "cpu", False, 1 << 20, layout=layout), on_device=False)


def _slots(pages: int):
    """Slot lists of 0-12 int64s: inside the pool, at and around its bounds, anywhere in int64."""
    edge = st.sampled_from([0, pages - 1, pages, pages + 1, -1, -(2**63), 2**63 - 1, -pages, 2**32, 2**32 + pages - 1])
    inside = st.integers(0, pages - 1)
    return st.lists(st.one_of(inside, inside, edge, INT64), max_size=12)


@settings(max_examples=300, deadline=None)
@given(pages=st.integers(1, 9), data=st.data(), layout=st.sampled_from(["layer_first", "page_first"]),
       kind=st.sampled_from(["list", "run", "numpy"]))
def test_a_slot_list_is_taken_exactly_when_every_slot_is_inside_the_pool(pages, data, layout, kind):
    slots = data.draw(_slots(pages))
    inside = all(0 <= s < pages for s in slots)
    given_slots = (array("q", slots) if kind == "run" else np.array(slots, dtype=np.int64) if kind == "numpy"
                   else slots)
    src, dst = _pool(pages, layout), _pool(pages, layout)
    src.array[...] = np.arange(src.array.size, dtype=np.int64).reshape(src.array.shape) + 1
    before = dst.array.copy()
    runs = _MOVE(src.rows, given_slots, dst.rows, given_slots)
    if not inside:
        assert runs == -1 and np.array_equal(dst.array, before), "an out-of-range list was taken or wrote"
        with pytest.raises(IndexError, match="out of range"):  # the reference refuses it too
            rows.copy_rows_numpy(src.rows, slots, dst.rows, slots)
        assert np.array_equal(dst.array, before)
        return
    assert runs >= 0
    if slots:
        assert np.array_equal(dst.array[:, slots], src.array[:, slots])
    written = _WRITE(dst.rows, given_slots, array("q", [7] * len(slots)), 2, 4)
    assert written >= 0


@settings(max_examples=200, deadline=None)
@given(pages=st.integers(1, 9), bad=st.one_of(st.integers(-(2**63), -1), st.integers(9, 2**63 - 1)),
       at=st.integers(0, 11))
def test_one_bad_slot_anywhere_in_a_long_list_is_found(pages, bad, at):
    """The check reads every slot (no early answer from the first ones): a single slot outside
    the pool, at any place of a list of 12, refuses the whole list."""
    slots = [i % pages for i in range(12)]
    slots[at] = bad if bad < 0 else pages + (bad % (2**62))
    src, dst = _pool(pages, "layer_first"), _pool(pages, "layer_first")
    assert _MOVE(src.rows, slots, dst.rows, slots) == -1
    assert _MOVE(src.rows, array("q", slots), dst.rows, array("q", slots)) == -1
