"""Page keys as int64 runs (issue 41, session 22): a request's keys and a tree node's are
array('q') runs (engine/tree_node.py's KeyRun), read in place by the C data plane. Each C reader
of a run against its Python reference, hostile values included, and the runs' bookkeeping."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import miss, tree
from tierdiag.engine.tree_node import key_list, key_run
from tierdiag.native import cplane
from tierdiag.trace import pages

needs_c = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _runs(draw):
    """keys, start, node_keys with node_keys[0] == keys[start] (the tree's precondition):
    chained runs sharing a prefix then parting, or any int64s (not monotone: the search must
    still probe what the reference probes)."""
    keys = draw(st.lists(_INT64, min_size=1, max_size=60))
    start = draw(st.integers(0, len(keys) - 1))
    shared = draw(st.integers(1, len(keys) - start))
    node = keys[start:start + shared] + draw(st.lists(_INT64, max_size=30))
    if draw(st.booleans()):  # a different tail anywhere after the first
        at = draw(st.integers(1, len(node)))
        node = node[:at] + draw(st.lists(_INT64, max_size=5))
    return keys, start, node


@needs_c
@settings(max_examples=400, deadline=None)
@given(case=_runs())
def test_common_pages_in_c_is_the_reference(case):
    """tree.common_pages_c on two key runs (array('q'), numpy int64) gives what
    common_pages_py gives on the lists and on the runs, for any int64 keys."""
    keys, start, node = case
    want = tree.common_pages_py(keys, start, node)
    assert tree.common_pages_py(array("q", keys), start, array("q", node)) == want
    assert cplane.C.common_pages(array("q", keys), start, array("q", node)) == want
    assert cplane.C.common_pages(np.array(keys, dtype=np.int64), start, array("q", node)) == want
    assert tree.common_pages_c(array("q", keys), start, array("q", node)) == want
    assert tree.common_pages_c(keys, start, array("q", node)) == want  # a list: the reference


@needs_c
def test_common_pages_in_c_declines_what_is_the_references():
    """Lists, tuples, other item types (array('i'), bytes, float64, 2-D), a start that is not an
    int in [0, len(keys)) (negative, past the end, huge, a bool, a float, NaN, a str), an empty
    node: -1, and the wrapper answers as the reference does (or raises what it raises)."""
    c = cplane.C.common_pages
    run = array("q", [5, 6, 7])
    for args in (([5, 6, 7], 0, run), (run, 0, (5, 6)), (array("i", [5, 6, 7]), 0, run), (run, 0, b"\x05" * 8),
                 (np.array([5.0, 6.0]), 0, run), (np.array([[5, 6]], dtype=np.int64), 0, run),
                 (run, -1, run), (run, 3, run), (run, 2**70, run), (run, True, run), (run, 1.0, run),
                 (run, float("nan"), run), (run, "0", run), (run, 0, array("q"))):
        assert c(*args) == -1, args
    with pytest.raises(TypeError):
        c(run, 0)
    assert tree.common_pages_c([5, 6, 7], 0, run) == tree.common_pages_py([5, 6, 7], 0, run) == 3
    assert tree.common_pages_c(run, 1, array("q", [6, 9])) == 1
    with pytest.raises(TypeError):
        tree.common_pages_c(run, "0", run)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_INT64, max_size=80), cut=st.integers(0, 80))
def test_a_key_run_is_its_keys(values, cut):
    """key_run: the int64s of a numpy key array as array('q') (a copy: the request's keys grow
    by frombytes later while tree nodes hold views of keys_np); key_list: back to ints."""
    arr = np.array(values, dtype=np.int64)
    run = key_run(arr)
    assert type(run) is array and run.typecode == "q" and run.tolist() == values
    assert key_list(run) == values and key_list(values) == values and key_list(values) is not values
    assert run[:cut].tolist() == values[:cut]
    run.frombytes(np.array([1], dtype=np.int64).tobytes())  # not a view of arr: it may grow
    assert arr.tolist() == values
    if len(values) > 1:
        assert key_run(arr[::2]).tolist() == values[::2]  # strided: tobytes lays it out


@needs_c
@settings(max_examples=150, deadline=None)
@given(data=st.data(), req_id=st.text(alphabet="ab\x00\\é漢😀", max_size=12), base=st.sampled_from([0, 2**40, 2**62]))
def test_output_keys_grow_a_key_run_as_they_grow_a_list(data, req_id, base):
    """pages.extend_output_keys_c on a key run appends the same output keys (frombytes, in C)
    and returns the same array as on a list, and as the numpy reference on a list; again after
    a retraction grew them once already."""
    n_in = data.draw(st.integers(0, 6))
    keys = [base + k for k in range(n_in)]
    run, lst, ref = array("q", keys), list(keys), list(keys)
    arr_r = arr_l = arr_n = np.array(keys, dtype=np.int64)
    for _ in range(data.draw(st.integers(1, 3))):
        total = len(lst) + data.draw(st.integers(0, 40))
        arr_r = pages.extend_output_keys_c(req_id, run, arr_r, n_in, total)
        arr_l = pages.extend_output_keys_c(req_id, lst, arr_l, n_in, total)
        arr_n = pages.extend_output_keys_numpy(req_id, ref, arr_n, n_in, total)
        assert run.tolist() == lst == ref == arr_r.tolist() == arr_l.tolist() == arr_n.tolist()


@needs_c
def test_output_keys_decline_runs_that_are_not_int64_arrays():
    """A numpy array, an array('i'), an array('d') as `keys`: -1, nothing appended; a key run
    whose buffer is exported cannot grow: BufferError, the run unchanged."""
    c = cplane.C.output_keys
    arr = np.array([1, 2], dtype=np.int64)
    for keys in (np.array([1, 2], dtype=np.int64), array("i", [1, 2]), array("d", [1.0, 2.0]), b"12345678" * 2):
        assert c(keys, arr, 5, 0, 3) == -1
    run = array("q", [1, 2])
    view = memoryview(run)
    with pytest.raises(BufferError):
        c(run, arr, 5, 0, 3)
    view.release()
    assert run.tolist() == [1, 2]
    assert len(c(run, arr, 5, 0, 3)) == 8 * 5 and len(run) == 5


@needs_c
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "count", "clear"]), st.lists(_INT64, max_size=40),
                              st.integers(-5, 45), st.integers(-5, 45)), max_size=25))
def test_the_page_key_set_reads_a_key_run_as_its_list(ops):
    """_cplane.PageKeySet on key runs (read in place) counts what it counts on the same keys as
    a list, and what miss._KeySetPy counts on the run."""
    compiled, reference = cplane.pairs()["miss.key_set"]
    on_run, on_list, py = compiled(), compiled(), reference()
    for op, keys, lo, hi in ops:
        lo, hi = miss._span(len(keys), lo, hi)
        run = array("q", keys)
        if op == "add":
            on_run.add(run, lo, hi), on_list.add(keys, lo, hi), py.add(run, lo, hi)
        elif op == "count":
            assert on_run.count(run, lo, hi) == on_list.count(keys, lo, hi) == py.count(run, lo, hi)
        else:
            on_run.clear(), on_list.clear(), py.clear()
        assert len(on_run) == len(on_list) == len(py)


@needs_c
def test_the_page_key_set_refuses_runs_of_other_items():
    """array('i'), array('d'), bytes, a 2-D int64 array, a float64 array: TypeError naming the
    call; bounds outside the run: ValueError; the set unchanged. A set switched to Python's
    equality by an odd key still counts a run's keys."""
    ks = cplane.C.PageKeySet()
    ks.add(array("q", [1, 2, 3]), 0, 3)
    for keys in (array("i", [1]), array("d", [1.0]), b"\x01" * 8, np.ones((1, 1), dtype=np.int64),
                 np.ones(1, dtype=np.float64)):
        with pytest.raises(TypeError, match="PageKeySet.add"):
            ks.add(keys, 0, 1)
        with pytest.raises(TypeError, match="PageKeySet.count"):
            ks.count(keys, 0, 1)
    for lo, hi in ((-1, 1), (0, 4), (0, 2**70)):
        with pytest.raises((ValueError, OverflowError)):
            ks.count(array("q", [1, 2, 3]), lo, hi)
    assert len(ks) == 3 and ks.count(array("q", [1, 2, 3, 4]), 0, 4) == 3
    ks.add([2**64], 0, 1)  # an odd key: the set is Python's from now on
    ks.add(array("q", [9]), 0, 1)
    assert ks.count(array("q", [1, 9, 10]), 0, 3) == 2 and len(ks) == 5


@needs_c
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["count_add", "add", "clear"]),
                              st.lists(st.one_of(_INT64, st.integers(0, 6)), max_size=40),
                              st.integers(-5, 45), st.integers(-5, 45), st.integers(-5, 45), st.booleans()),
                    max_size=25))
def test_the_page_key_set_counts_then_adds_in_one_call(ops):
    """PageKeySet.count_add(keys, lo, count_hi, add_hi) (MissTracker.scheduled's one call): on a
    key run (one probe a key, this call's own keys marked) and on a list, the count and the set
    after are count(keys, lo, count_hi) then add(keys, lo, add_hi) on a plain set, keys repeated
    within a call (small ints) included, count_hi below, at or past add_hi; miss._KeySetPy's too."""
    compiled, reference = cplane.pairs()["miss.key_set"]
    on_run, on_list, py, plain = compiled(), compiled(), reference(), set()
    for op, keys, lo, count_hi, add_hi, as_run in ops:
        n = len(keys)
        lo, count_hi = miss._span(n, lo, count_hi)
        add_hi = miss._span(n, lo, add_hi)[1]
        run = array("q", keys)
        if op == "count_add":
            want = sum(k in plain for k in keys[lo:count_hi])
            plain.update(keys[lo:add_hi])
            assert on_run.count_add(run, lo, count_hi, add_hi) == want
            assert on_list.count_add(keys, lo, count_hi, add_hi) == want
            assert py.count_add(run if as_run else keys, lo, count_hi, add_hi) == want
        elif op == "add":
            plain.update(keys[lo:add_hi])
            on_run.add(run, lo, add_hi), on_list.add(keys, lo, add_hi), py.add(keys, lo, add_hi)
        else:
            on_run.clear(), on_list.clear(), py.clear()
            plain.clear()
        assert len(on_run) == len(on_list) == len(py) == len(plain)
        assert on_run.count(array("q", sorted(plain)), 0, len(plain)) == len(plain)


@needs_c
def test_the_page_key_set_count_add_grows_and_refuses_bad_bounds():
    """count_add past the first table (the room reserved before the pass, marks rehashed with
    their keys) stays exact; bounds outside the run, a non-int bound or the wrong arity: an error
    naming the call, the set unchanged."""
    ks = cplane.C.PageKeySet()
    keys = array("q", [k * 7919 - 2**62 for k in range(5000)])
    assert ks.count_add(keys, 0, 5000, 2500) == 0 and len(ks) == 2500
    assert ks.count_add(keys, 0, 5000, 5000) == 2500 and len(ks) == 5000
    for _ in range(3):  # many calls: the marks of older calls never look like this one's
        assert ks.count_add(keys, 0, 5000, 5000) == 5000
    for args, exc in (((keys, 0, 1, 5001), ValueError), ((keys, 0, 5001, 1), ValueError), ((keys, -1, 1, 1), ValueError),
                      ((keys, 0, 1, "1"), TypeError), ((keys, 0, 1, 2**70), OverflowError), ((keys, 0, 1), TypeError),
                      ((array("i", [1]), 0, 1, 1), TypeError)):
        with pytest.raises(exc, match="count_add|PageKeySet|int|too large"):
            ks.count_add(*args)
    assert len(ks) == 5000
