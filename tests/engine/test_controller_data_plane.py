"""The controller's own calls into the compiled data plane (issue 41, session 23): a backup, a
load-back and a prefill's write call `_cplane.move` / `_cplane.write_content` straight from the
compiled controller where this process runs the compiled data plane, instead of through the
interpreted wrappers `rows.copy_rows_c` / `content.write_content_c`. They must move and write the
bytes the wrappers (and numpy, their reference) do, count the same runs, and hand what the C
declines to the wrappers, which raise numpy's errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.engine import helpers
from tierdiag.engine import content, controller, rows
from tierdiag.engine.content import page_content_np, verify_content
from tierdiag.engine.engine import Engine
from tierdiag.native import cplane


def test_the_direct_calls_are_bound_as_the_wrappers_were_chosen():
    """On the compiled data plane the controller holds the C move and content write the
    wrappers call; on numpy none, and the chosen (numpy) functions run as before."""
    if cplane.C is None:
        assert controller._C_MOVE is None and controller._C_WRITE_CONTENT is None
    else:
        assert rows.copy_rows is rows.copy_rows_c and controller._C_MOVE is rows.compiled_move
        assert content.write_content is content.write_content_c
        assert controller._C_WRITE_CONTENT is content._c_write_content


def _engine() -> Engine:
    return Engine(helpers.small_config(), probe=None)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 24))
def test_a_write_and_its_backup_and_load_back_are_the_wrappers_bytes(data, n):
    """write_computed, _to_host and _to_device against content.write_content and rows.copy_rows
    on a second engine's pools: the same bytes in every slot of both pools, the same runs."""
    mine, ref = _engine(), _engine()
    cap = min(mine.ctrl.device.free_pages, mine.ctrl.host.free_pages)
    n = min(n, cap)
    dev = data.draw(st.permutations(range(mine.ctrl.device.free_pages)))[:n]
    host = data.draw(st.permutations(range(mine.ctrl.host.free_pages)))[:n]
    back = data.draw(st.permutations(range(mine.ctrl.device.free_pages)))[:n]
    keys = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
    mine.ctrl.write_computed(dev, keys)
    content.write_content(ref.ctrl.device, dev, keys)
    assert verify_content(mine.ctrl.device, dev, keys)
    wall, runs = mine.ctrl._to_host(dev, host)
    _, ref_runs = rows.copy_rows(ref.ctrl.device.rows, dev, ref.ctrl.host.rows, host)
    assert isinstance(wall, int) and wall >= 0 and runs == ref_runs == rows.count_runs(dev)
    wall, runs = mine.ctrl._to_device(host, back)
    _, ref_runs = rows.copy_rows(ref.ctrl.host.rows, host, ref.ctrl.device.rows, back)
    assert isinstance(wall, int) and wall >= 0 and runs == ref_runs == rows.count_runs(host)
    for a, b in ((mine.ctrl.device, ref.ctrl.device), (mine.ctrl.host, ref.ctrl.host)):
        assert a.array.tobytes() == b.array.tobytes()
    got = mine.ctrl.device.array[:, back]
    assert np.array_equal(got, page_content_np(keys, mine.ctrl.device.num_layers, mine.ctrl.device.page_elems))


@pytest.mark.parametrize("bad", [-1, 10**9, 2**63, "3", 1.5])
def test_what_the_c_declines_goes_to_the_wrappers_and_raises_their_error(bad):
    """A slot outside the pool (or not an int): the C moves and writes nothing, the wrapper's
    numpy path raises, and no page changed."""
    e = _engine()
    ctrl = e.ctrl
    ctrl.write_computed([0, 1], [5, 6])
    before = (ctrl.device.array.tobytes(), ctrl.host.array.tobytes())
    with pytest.raises((IndexError, ValueError, TypeError, OverflowError)):
        ctrl._to_host([0, bad], [0, 1])
    with pytest.raises((IndexError, ValueError, TypeError, OverflowError)):
        ctrl._to_device([0, 1], [0, bad])
    with pytest.raises((IndexError, ValueError, TypeError, OverflowError)):
        ctrl.write_computed([2, bad], [7, 8])
    assert (ctrl.device.array.tobytes(), ctrl.host.array.tobytes()) == before


def test_nothing_to_write_writes_nothing():
    e = _engine()
    before = e.ctrl.device.array.tobytes()
    e.ctrl.write_computed([], [])
    assert e.ctrl.device.array.tobytes() == before
