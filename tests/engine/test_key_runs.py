"""Page keys as int64 runs (issue 41, session 22): a request's keys and a tree node's are
array('q') runs (engine/tree_node.py's KeyRun), read in place by the C data plane. Each C reader
of a run against its Python reference, hostile values included, and the runs' bookkeeping."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import miss, schedule_common, tree
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
@pytest.mark.parametrize("with_array", [True, False])
def test_output_keys_decline_runs_that_are_not_int64_arrays(with_array):
    """A numpy array, an array('i'), an array('d'), bytes, a tuple as `keys`: -1, nothing
    appended; a key run whose buffer is exported cannot grow: BufferError, the run unchanged.
    Both forms: keys_np an array (the bytearray of both back), or None (the keys alone, None back)."""
    c = cplane.C.output_keys
    arr = np.array([1, 2], dtype=np.int64) if with_array else None
    for keys in (np.array([1, 2], dtype=np.int64), array("i", [1, 2]), array("d", [1.0, 2.0]), b"12345678" * 2,
                 (1, 2)):
        assert c(keys, arr, 5, 0, 3) == -1
    run = array("q", [1, 2])
    view = memoryview(run)
    with pytest.raises(BufferError):
        c(run, arr, 5, 0, 3)
    view.release()
    assert run.tolist() == [1, 2]
    got = c(run, arr, 5, 0, 3)
    assert (len(got) == 8 * 5 if with_array else got is None) and len(run) == 5


@settings(max_examples=150, deadline=None)
@given(data=st.data(), req_id=st.text(alphabet="ab\x00\\é漢😀\n", max_size=12),
       base=st.sampled_from([0, 1, 2**40, 2**62, 2**63 - 1]), as_run=st.booleans())
def test_output_keys_appended_alone_are_the_extended_ones(data, req_id, base, as_run):
    """A finish's output keys (the keys alone, no array made) append to a list or a key run
    exactly the keys extend_output_keys_numpy appends, the engine's C side
    (schedule_common.append_output_keys_c) and its Python reference (pages.append_output_keys_py)
    alike; again after a retraction grew them once already, and a count at or below
    what the keys hold appends nothing."""
    n_in = data.draw(st.integers(0, 6))
    keys = [base - k if base else k for k in range(n_in)]
    ref = list(keys)
    arr = np.array(keys, dtype=np.int64)
    got_py, got_engine = (array("q", keys), array("q", keys)) if as_run else (list(keys), list(keys))
    for _ in range(data.draw(st.integers(1, 3))):
        total = len(ref) + data.draw(st.integers(-2, 40))
        if total < len(ref):
            total = len(ref)  # extend's contract too: never fewer than the keys it has
        arr = pages.extend_output_keys_numpy(req_id, ref, arr, n_in, total)
        assert pages.append_output_keys_py(req_id, got_py, n_in, total) is None
        # the engine's own (schedule_common, a finish's: the two C calls from compiled code)
        assert schedule_common.append_output_keys_c(req_id, got_engine, n_in, total) is None
        assert list(got_py) == list(got_engine) == ref == arr.tolist()
        assert all(k < 0 for k in ref[n_in:])  # output pages: negative, never an input key


@needs_c
@settings(max_examples=200, deadline=None)
@given(seed=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=3), st.booleans(),
                      st.none()),
       skip=st.one_of(st.integers(-5, 100), st.sampled_from([2**61, 2**63 - 1, 2**63, 2**70]),
                      st.floats(allow_nan=True), st.none()),
       count=st.one_of(st.integers(-5, 100), st.sampled_from([2**61, 2**62, 2**63 - 1, 2**63, 2**70]),
                       st.floats(allow_nan=True), st.none()))
def test_output_keys_without_an_array_append_or_change_nothing(seed, skip, count):
    """_cplane.output_keys handed None for keys_np: None and the keys appended (count - skip of
    them, as the array form would have), or -1 with the keys untouched for anything outside its
    case (a seed outside [0, 2**63) or not an int, bounds out of range, odd types); a count too
    large to allocate raises MemoryError, nothing appended."""
    c = cplane.C.output_keys
    run, lst = array("q", [7, 8]), [7, 8]
    ok = (type(seed) is int and 0 <= seed < 2**63 and type(skip) is int and type(count) is int
          and 0 <= skip <= count < 2**63)
    for keys in (run, lst):
        before = list(keys)
        try:
            got = c(keys, None, seed, skip, count)
        except MemoryError:
            assert ok and count - skip > 2**40
            assert list(keys) == before
            continue
        if not ok:
            assert got == -1 and list(keys) == before
            continue
        assert got is None
        with_array = c(array("q", before), np.array(before, dtype=np.int64), seed, skip, count)
        assert list(keys) == np.frombuffer(with_array, dtype=np.int64).tolist()


@settings(max_examples=120, deadline=None)
@given(hash_ids=st.one_of(st.none(), st.lists(st.integers(0, 2**40), max_size=12)),
       per_block=st.sampled_from([1, 2, 4, 8]), page_size=st.sampled_from([1, 16, 64]),
       spare=st.integers(0, 63), extra_key=st.one_of(st.none(), st.text(alphabet="a\x00é😀\\", max_size=5)))
def test_the_arrivals_page_keys_are_page_keys_array_and_its_run(hash_ids, per_block, page_size, spare, extra_key):
    """Scheduler._page_keys (an arrival's keys: one C call on a hash_ids request without an
    extra_key, page_keys_array otherwise) gives page_keys_array's keys, as an int64 array and
    as a key run of its own (growing the run leaves the array as it was)."""
    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.engine import Engine
    from tierdiag.trace.reader import TraceRequest

    block = page_size * per_block
    if hash_ids is None:
        tokens = tuple(range(3 * page_size + spare))
        input_len = len(tokens)
    else:
        tokens = None
        input_len = max(0, len(hash_ids) * block - min(spare, block - 1)) if hash_ids else 0
    t = TraceRequest("r", 0, 1, 0, input_len, 4, tuple(hash_ids) if hash_ids is not None else None, tokens,
                     0, extra_key)
    cfg = EngineConfig(model="tiny", gpu="h100", device_tokens=64 * page_size, host_tokens=64 * page_size,
                       page_size=page_size, block_size=block, data_plane_mib=4)
    sched = Engine(cfg, probe=None).scheduler
    keys_np, run = sched._page_keys(t)
    want = pages.page_keys_array(t, page_size=page_size, block_size=block)
    assert keys_np.dtype == np.int64 and keys_np.tolist() == want.tolist()
    assert type(run) is array and run.typecode == "q" and run.tolist() == want.tolist()
    run.append(-1)
    assert keys_np.tolist() == want.tolist()


@needs_c
@settings(max_examples=200, deadline=None)
@given(req_id=st.text(max_size=20), keys=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8),
       n_in=st.integers(-3, 12), total=st.integers(-3, 60), as_run=st.booleans())
def test_the_engines_output_keys_agree_with_the_reference_on_hostile_values(req_id, keys, n_in, total, as_run):
    """schedule_common.append_output_keys_c (a finish's output keys: two C calls from the compiled
    engine) against trace.pages.append_output_keys_py on any request id (lone surrogates, NULs),
    any int64 keys (an input key of either sign), n_in outside [0, len(keys)], totals below what
    the keys hold: the same keys after, or the same error with the keys left alone."""
    def outcome(fn):
        got = array("q", keys) if as_run else list(keys)
        try:
            fn(req_id, got, n_in, total)
        except Exception as exc:  # noqa: BLE001 - the error's type is what is compared
            return type(exc).__name__, list(got)
        return None, list(got)

    assert outcome(schedule_common.append_output_keys_c) == outcome(pages.append_output_keys_py)
