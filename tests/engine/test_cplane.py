"""The CPU data plane's backends on the same cases: the compiled kernel (_cplane.c) and numpy
(beside each owner: rows.py, content.py, pagepool.py, pagemap.py, recorder.py: the reference)
behind native/cplane.py's one choice. Page moves, page content, its verification and a pool's
slot bookkeeping give the same bytes, the same slots in the same order, and the same errors,
for both pool layouts; and the compiled kernel is really there unless TIERDIAG_CPLANE=numpy."""

from __future__ import annotations

import json
from array import array
import operator
import os
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import content, decode, deployment, miss, pagemap, prefetch, rows, schedule_common, storage, tree
from tierdiag.engine.routing import router_tree
from tierdiag.native import cplane
from tierdiag.trace import chain as trace_chain
from tierdiag.engine.content import page_content_np
from tierdiag.engine.dataplane import DataPlane
from tierdiag.engine.pagepool import PagePool
from tierdiag.probes import recorder
from tierdiag.probes.recorder import columns_of
from tierdiag.trace import pages


@dataclass(frozen=True)
class Backend:
    name: str
    copy_rows: Callable
    write_content: Callable
    verify_content: Callable
    alloc: Callable
    free: Callable


NUMPY = Backend("numpy", rows.copy_rows_numpy, content.write_content_numpy, content.verify_content_numpy,
                PagePool._alloc_numpy, PagePool._free_numpy)
C = Backend("c", rows.copy_rows_c, content.write_content_c, content.verify_content_c, PagePool._alloc_c,
            PagePool._free_c)
BACKENDS = [pytest.param(NUMPY, id="numpy"),
            pytest.param(C, id="c", marks=pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}"))]
LAYOUTS = ("layer_first", "page_first")
# (layers, elems): the engine's 4 x 8, and odd ones (one layer: both layouts are the same memory)
GEOMETRIES = [(4, 8), (2, 4), (1, 1), (3, 5)]


def test_the_compiled_kernel_is_built_and_chosen():
    """CI notices a build that silently failed (setup.py's extension is optional): only an
    explicit TIERDIAG_CPLANE=numpy may leave it out."""
    if os.environ.get(cplane.ENV, "").strip().lower() == "numpy":
        assert cplane.C is None and cplane.CPU_KERNEL == "numpy"
        pytest.skip("TIERDIAG_CPLANE=numpy: the numpy data plane by request")
    assert cplane.C is not None, f"the compiled CPU data plane is not usable: {cplane.WHY_NOT}"
    assert cplane.CPU_KERNEL == "c" and cplane.C.API == cplane.API
    assert rows.copy_rows is rows.copy_rows_c
    assert (content.write_content, content.verify_content) == (content.write_content_c, content.verify_content_c)
    assert (PagePool.alloc, PagePool.free) == (PagePool._alloc_c, PagePool._free_c)
    plane = DataPlane(4, 8, "cpu", False, 1 << 20, layout="page_first")
    assert plane.to_json()["cpu_kernel"] == "c"


def test_every_pair_takes_the_side_the_facade_chose():
    """native/cplane.py decides once for the process: every numpy<->C pair the owners declared
    is bound, where it is used, to the compiled side on the compiled data plane and to the
    reference on numpy, and no pair is left out of the registry."""
    bound = {
        "rows.copy_rows": rows.copy_rows,
        "pagepool.PagePool.alloc": PagePool.alloc, "pagepool.PagePool.free": PagePool.free,
        "content.write_content": content.write_content, "content.verify_content": content.verify_content,
        "pagemap.blame": pagemap.blame, "pagemap.PageMap.set_many": pagemap.PageMap.set_many,
        "pages.block_page_keys": pages.block_page_keys,
        "pages.extend_output_keys": pages.extend_output_keys, "pages.keys_list": pages.keys_list,
        "decode.append_output_keys": schedule_common.append_output_keys,
        "storage.index": storage.new_index,
        "recorder.row_buffer": recorder.new_row_buffer,
        "recorder.tick": recorder.new_ticker,
        "miss.batch_pages": miss.new_batch_pages,
        "tree.common_pages": tree.common_pages,
        "deployment.ranks_json": deployment.ranks_json,
        "decode.decode_steps": decode.decode_steps,
        "routing.approx_tree": router_tree.new_tree,
        "reader.link_chain": trace_chain.link_chain,
        "prefetch.requeries": prefetch.new_requeries,
    }
    pairs = cplane.pairs()
    assert set(pairs) == set(bound)
    for name, used in bound.items():
        compiled, reference = pairs[name]
        assert used is (reference if cplane.C is None else compiled), name


def test_only_the_facade_reaches_the_compiled_module():
    """No module but native/cplane.py imports _cplane or reads cplane.C: the backend is chosen
    in one place (a call site asks `cplane.compiled(name)` and `cplane.choose(...)`)."""
    import pathlib

    import tierdiag

    root = pathlib.Path(tierdiag.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p != root / "native" / "cplane.py"
                 and re.search(r"\bimport _cplane\b|\bcplane\.C\b|native\._cplane\b", p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("env", ["numpy", "auto", "c", "bogus"])
def test_the_switch_reads_the_environment(env):
    built = cplane._load("auto")[0] is not None  # whatever this process was told
    code = ("import json\nfrom tierdiag.engine import pagepool, rows\nfrom tierdiag.native import cplane\n"
            "print(json.dumps([cplane.CPU_KERNEL, rows.copy_rows.__name__, pagepool.PagePool.free.__name__]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, cplane.ENV: env})
    if env == "bogus" or (env == "c" and not built):
        assert proc.returncode != 0
        assert ("TIERDIAG_CPLANE='bogus' must be auto, c or numpy" if env == "bogus"
                else "TIERDIAG_CPLANE=c but the compiled CPU data plane is unusable") in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    kernel = "numpy" if env == "numpy" or not built else "c"
    assert json.loads(proc.stdout) == [kernel, f"copy_rows_{kernel}", f"_free_{kernel}"]


def _pool(layout: str, pages: int, layers: int = 2, elems: int = 4, name: str = "host") -> PagePool:
    plane = DataPlane(layers, elems, "cpu", False, 1 << 20, layout=layout)
    return PagePool(name, pages, plane, on_device=False)


def _random_fill(pool: PagePool, seed: int) -> None:
    pool.array[...] = np.random.default_rng(seed).integers(-(2**63), 2**63 - 1, pool.array.shape, dtype=np.int64,
                                                           endpoint=True)


def _as_kind(pages: list[int], kind: str):
    if kind == "array":
        return np.array(pages, dtype=np.int64)
    if kind == "intp":
        return np.array(pages, dtype=np.intp)
    if kind == "tuple":
        return tuple(pages)
    if kind == "range" and pages and pages == list(range(pages[0], pages[0] + len(pages))):
        return range(pages[0], pages[0] + len(pages))
    return pages


# --- page moves ----------------------------------------------------------------------------------
@st.composite
def _moves(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    layers, elems = draw(st.sampled_from(GEOMETRIES))
    src_pages, dst_pages = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    n = draw(st.integers(0, min(src_pages, dst_pages)))
    shape = draw(st.sampled_from(["scattered", "runs", "consecutive"]))
    if shape == "scattered":
        s = draw(st.lists(st.integers(0, src_pages - 1), min_size=n, max_size=n))  # repeats allowed
        d = draw(st.permutations(range(dst_pages)))[:n]
    elif shape == "runs":
        s0, d0 = draw(st.integers(0, src_pages - n)), draw(st.integers(0, dst_pages - n))
        cut = draw(st.integers(0, n))
        s = list(range(s0, s0 + n))
        d = list(range(d0 + cut, d0 + n)) + list(range(d0, d0 + cut))  # two runs, swapped
    else:
        s0, d0 = draw(st.integers(0, src_pages - n)), draw(st.integers(0, dst_pages - n))
        s, d = list(range(s0, s0 + n)), list(range(d0, d0 + n))
    kind = draw(st.sampled_from(["list", "array", "intp", "tuple", "range"]))
    return layout, layers, elems, src_pages, dst_pages, s, d, kind, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=120, deadline=None)
@given(case=_moves())
def test_a_move_is_the_page_at_a_time_copy(backend, case):
    layout, layers, elems, sp, dp, s, d, kind, seed = case
    src, dst = _pool(layout, sp, layers, elems), _pool(layout, dp, layers, elems)
    _random_fill(src, seed)
    _random_fill(dst, seed + 1)
    expected, src_before = dst.array.copy(), src.array.copy()
    for a, b in zip(s, d):
        expected[:, b] = src.array[:, a]
    wall_ns, runs = backend.copy_rows(src.rows, _as_kind(s, kind), dst.rows, _as_kind(d, kind))
    assert isinstance(wall_ns, int) and wall_ns >= 0
    assert runs == rows.count_runs(s)
    assert np.array_equal(dst.array, expected), "pages differ from the page-at-a-time copy"
    assert np.array_equal(src.array, src_before), "the source pool changed"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_move_inside_one_pool_reads_every_page_before_writing(backend, layout):
    """Overlapping pages in one pool: the result of copying from a snapshot (numpy's two-pass)."""
    pool = _pool(layout, 8)
    _random_fill(pool, 3)
    before = pool.array.copy()
    backend.copy_rows(pool.rows, [0, 1, 2, 5], pool.rows, [1, 2, 3, 0])
    expected = before.copy()
    expected[:, [1, 2, 3, 0]] = before[:, [0, 1, 2, 5]]
    assert np.array_equal(pool.array, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("s", "d", "error", "message"), [
    ([0, 1], [3, 4], IndexError, "destination page 4 out of range: the pool has 4 pages"),
    ([0, 4], [0, 1], IndexError, "source page 4 out of range: the pool has 4 pages"),
    ([-1], [0], IndexError, "source page -1 out of range"),
    ([0, 1], [2, -3], IndexError, "destination page -3 out of range"),
    ([1 << 70], [0], IndexError, f"source page {1 << 70} out of range"),
    (list(range(40)), list(range(40)), IndexError, "source page 4 out of range"),  # numpy's long path
    ([0, 1], [0], ValueError, "copy of 2 source pages into 1 destination pages"),
    (np.array([0, 7]), np.array([1, 2]), IndexError, "source page 7 out of range"),
])
def test_a_bad_move_is_refused_with_the_numpy_message_before_a_byte_moves(backend, layout, s, d, error, message):
    src, dst = _pool(layout, 4), _pool(layout, 4)
    _random_fill(src, 1)
    with pytest.raises(error, match=re.escape(message)):
        backend.copy_rows(src.rows, s, dst.rows, d)
    assert not dst.array.any(), "a refused move wrote into the destination"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pools_of_different_geometry_are_refused(backend):
    src, dst = _pool("layer_first", 4, 2, 4), _pool("layer_first", 4, 2, 8)
    with pytest.raises(ValueError, match="pool geometries differ"):
        backend.copy_rows(src.rows, [0], dst.rows, [0])
    with pytest.raises(ValueError, match="pool geometries differ"):  # a layout mix-up as well
        backend.copy_rows(_pool("layer_first", 4).rows, [0], _pool("page_first", 4).rows, [0])
    assert backend.copy_rows(src.rows, [], dst.rows, [])[1] == 0  # nothing to move: nothing checked


# --- page content ------------------------------------------------------------------------------
KEYS = [0, 1, -1, 2**63 - 1, -(2**63), 2**62 + 12345, -(2**40) - 7, 0x9E3779B97F4A7C15 - 2**64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("layers", "elems"), GEOMETRIES)
@pytest.mark.parametrize("kind", ["list", "array"])
def test_content_is_page_content_np_in_those_slots_only(backend, layout, layers, elems, kind):
    pool = _pool(layout, 12, layers, elems)
    slots = [9, 2, 3, 4, 11, 0, 7, 5]
    backend.write_content(pool, _as_kind(slots, kind), _as_kind(KEYS, kind))
    assert np.array_equal(pool.array[:, slots], page_content_np(KEYS, layers, elems))
    assert not pool.array[:, [1, 6, 8, 10]].any()
    assert backend.verify_content(pool, slots, KEYS)
    assert backend.verify_content(pool, _as_kind(slots, kind), _as_kind(KEYS, kind))
    other = PagePool("device", 12, pool_plane(pool), on_device=True)
    NUMPY.write_content(other, slots, KEYS)  # the reference, into a fresh pool: the same bytes
    assert pool.array.tobytes() == other.array.tobytes()


def pool_plane(pool: PagePool) -> DataPlane:
    return DataPlane(pool.num_layers, pool.page_elems, "cpu", False, 1 << 20,
                     layout="page_first" if pool.page_major else "layer_first")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_verification_finds_any_flipped_byte_and_a_slot_mix_up(backend, layout):
    pool = _pool(layout, 6, 3, 2)
    slots, keys = [4, 1, 2], [71, -72, 2**63 - 1]
    backend.write_content(pool, slots, keys)
    assert backend.verify_content(pool, slots, keys)
    assert not backend.verify_content(pool, [1, 4, 2], keys)
    raw = pool.array.view(np.uint8)  # [layers, pages, elems * 8] bytes, whatever the layout
    for layer in range(3):
        for byte in range(2 * 8):
            for slot in slots:
                raw[layer, slot, byte] ^= 0x40
                assert not backend.verify_content(pool, slots, keys), (layer, slot, byte)
                raw[layer, slot, byte] ^= 0x40
    assert backend.verify_content(pool, slots, keys)
    raw[0, 0, 0] ^= 1  # a page nobody asked about
    assert backend.verify_content(pool, slots, keys)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_content_arguments_fail_as_numpy_fails(backend):
    pool = _pool("page_first", 4)
    with pytest.raises(IndexError, match="destination page 4 out of range"):
        backend.write_content(pool, [0, 4], [1, 2])
    with pytest.raises(IndexError, match="source page -1 out of range"):
        backend.verify_content(pool, [-1], [1])
    with pytest.raises(OverflowError):
        backend.write_content(pool, [0], [2**63])  # not an int64 page key
    assert not pool.array.any()
    backend.write_content(pool, [], [])
    assert backend.verify_content(pool, [], [])


# --- slot bookkeeping ------------------------------------------------------------------------------
def _bookkeeping(backend: Backend, pages: int = 8) -> PagePool:
    """A pool whose alloc and free are the backend's."""
    cls = type(f"PagePool_{backend.name}", (PagePool,), {"alloc": backend.alloc, "free": backend.free})
    return cls("host", pages, DataPlane(2, 4, "cpu", False, 1 << 20), on_device=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_freed_list_comes_back_out_as_it_was_freed(backend):
    pool = _bookkeeping(backend, 40)
    assert list(pool.alloc(3)) == [0, 1, 2] and list(pool.alloc(2)) == [3, 4]
    pool.free([1, 0, 2])
    assert list(pool.alloc(3)) == [1, 0, 2]
    long = pool.alloc(20)
    assert type(long) is array and long.typecode == "q"  # a slot run, on either backend
    assert list(long) == list(range(5, 25))
    pool.free(long[::-1])
    assert list(pool.alloc(20)) == list(long[::-1])
    assert list(pool.alloc(0)) == [] and pool.alloc(16) is None and pool.free_pages == 15
    with pytest.raises(ValueError, match="alloc of -1"):
        pool.alloc(-1)
    pool.check()


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_the_compiled_alloc_lends_the_pools_own_ints():
    """alloc's `ints`: the list holds the pool's int objects for its slots (no int made a page,
    none freed when the list goes), the same values as without; anything but a tuple of the
    pool's slot numbers is refused before a slot is marked."""
    alloc = cplane.compiled("alloc")
    pool = _bookkeeping(C, 40)
    top = pool.free_pages
    ints = tuple(range(40))  # (the pool itself hands out array('q') runs: SlotCore's template)
    lent = alloc(pool._stack, pool._owned_bytes, top, 5, ints)
    assert lent == [0, 1, 2, 3, 4] and all(a is b for a, b in zip(lent, ints))
    made = alloc(pool._stack, pool._owned_bytes, top - 5, 3)
    assert made == [5, 6, 7]
    marked = bytes(pool._owned_bytes)
    for bad in (list(range(40)), tuple(range(39)), None, 7):
        with pytest.raises(TypeError, match="ints must be a tuple"):
            alloc(pool._stack, pool._owned_bytes, top - 8, 2, bad)
    assert bytes(pool._owned_bytes) == marked
    with pytest.raises(TypeError, match="takes 4 or 5 arguments"):
        alloc(pool._stack, pool._owned_bytes, top - 8, 2, ints, None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("slots", "message"), [
    ([3, 1], "host slot 1 freed but not owned (double free?)"),  # 1 was freed before
    ([2, 3, 2], "host: slot 2 freed twice in one call"),
    ([0, -1], "host slot -1 freed but not owned"),
    ([0, 40], "host slot 40 freed but not owned"),
    ([0, 1 << 70], "freed but not owned"),
    ([0, 2, 3, 4, 5, 6, 7, 8, 9, 3], "host: slot 3 freed twice in one call"),  # past the small path
    ([0, 2, 3, 4, 5, 6, 7, 8, 9, 1], "host slot 1 freed but not owned"),
    (list(range(2, 12)) * 30, "freed twice in one call"),  # the long path's sort
])
def test_a_wrong_free_names_the_slot_and_changes_nothing(backend, slots, message):
    pool = _bookkeeping(backend, 40)
    held = pool.alloc(12)
    pool.free([1])
    before = (pool.free_pages, pool._stack.copy(), bytes(pool._owned_bytes))
    with pytest.raises(AssertionError, match=re.escape(message)):
        pool.free(slots)
    assert (pool.free_pages, pool._stack.tolist(), bytes(pool._owned_bytes)) == \
        (before[0], before[1].tolist(), before[2])
    pool.check()
    pool.free([s for s in held if s != 1])
    assert pool.used_pages == 0


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(1, 60), data=st.data())
def test_every_backend_hands_out_the_same_slots_and_refuses_the_same_frees(pages, data):
    """Any sequence of allocs and frees, some wrong: every backend the same slots in the same
    order, the same refusals with the same messages, and exact accounting."""
    backends = [NUMPY] + ([C] if cplane.C is not None else [])
    pools_ = [_bookkeeping(b, pages) for b in backends]
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 25))):
        if data.draw(st.booleans()):
            n = data.draw(st.integers(0, pages + 1))
            got = [p.alloc(n) for p in pools_]
            assert all(g == got[0] for g in got)
            held.extend(got[0] or [])
            continue
        slots = data.draw(st.lists(st.sampled_from(held), max_size=len(held), unique=True)) if held else []
        if data.draw(st.integers(0, 3)) == 0:
            slots = slots + [data.draw(st.sampled_from(slots)) if slots else data.draw(st.integers(-2, pages + 2))]
        outcomes = []
        for p in pools_:
            try:
                p.free(slots)
                outcomes.append(None)
            except AssertionError as exc:
                outcomes.append(str(exc))
        assert all(o == outcomes[0] for o in outcomes), outcomes
        if outcomes[0] is None:
            held = [s for s in held if s not in set(slots)]
        for p in pools_:
            assert p.used_pages == len(held)
            p.check()
        assert all(p._stack[:p.free_pages].tolist() == pools_[0]._stack[:pools_[0].free_pages].tolist() for p in pools_)


def _page_maps(values: dict[int, int], demotions: dict[int, int]):
    from tierdiag.engine.pagemap import PageMap

    cached, demoted = PageMap(), PageMap()
    for k, v in values.items():
        cached.set_many([k], v)
    for k, v in demotions.items():
        demoted.set_many([k], v)
    return cached, demoted


def _raw(pm) -> tuple[bytes, bytes, int]:
    """A page map's two-level array as it lies (session 37): its top, its leaves, the leaves made."""
    return bytes(pm._top), bytes(pm._leaves), pm._nleaves


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 120), as_array=st.booleans(), attribute=st.booleans(),
       prior=st.dictionaries(st.integers(1, 6), st.integers(1, 64), max_size=3))
def test_the_compiled_blame_is_the_python_one(data, n, as_array, attribute, prior):
    """pagemap.blame (which evictions took a request's once-cached pages) by the compiled data
    plane and by its Python reference, on both sides of SMALL_BLAME (lists loop, arrays go to
    numpy there): the same count and the same `lost` dict, insertion order included (the order
    of request_evictions rows). Values: -1 never cached, 0 cached and never evicted, > 0 the
    eviction that took the page; runs of equal ids as a node's pages have them; keys past the
    end of either map's array read as never set."""
    from tierdiag.engine.pagemap import blame, blame_py

    space = 5000
    eid = st.integers(0, 6)  # a key absent is one never cached (-1)
    values = data.draw(st.dictionaries(st.integers(0, space), eid, max_size=200))
    demotions = data.draw(st.dictionaries(st.integers(0, space), eid, max_size=100))
    cached, demoted = _page_maps(values, demotions)
    run_starts = data.draw(st.lists(st.integers(0, space), min_size=1, max_size=8))
    keys = [(run_starts[i % len(run_starts)] + i) for i in range(n)] + data.draw(
        st.lists(st.integers(0, 1 << 14), max_size=4))  # some past both arrays
    arg = np.array(keys, dtype=np.int64) if as_array else keys
    lost_c = dict(prior) if attribute else None
    lost_py = dict(prior) if attribute else None
    assert cplane.C.blame(cached, demoted, arg, lost_c, 16) == blame_py(cached, demoted, arg, lost_py, 16)
    if attribute:
        assert list(lost_c.items()) == list(lost_py.items())
    assert blame(cached, demoted, arg, None, 16) == blame_py(cached, demoted, arg, None, 16)


def test_the_compiled_blame_declines_what_it_does_not_take():
    """A negative key (an output page), a map that is not a PageMap of the compiled plane (an
    array of its slots included), `lost` not a dict: -1 and nothing changed; pagemap.blame then takes its Python path, which also covers keys
    held in a map's dict (past DENSE_LIMIT)."""
    from tierdiag.engine.pagemap import DENSE_LIMIT, blame, blame_py

    cached, demoted = _page_maps({1: 3, 2: 3, 5: 0}, {1: 2})
    if cplane.C is not None:
        lost = {}
        for args in ((cached, demoted, [1, -2], lost, 16),
                     (np.zeros(8, dtype=np.int64), demoted, [1], lost, 16),
                     (cached._flat(), demoted, [1], lost, 16), (cached, demoted._flat(), [1], lost, 16),
                     (cached, demoted, [1], [], 16),
                     (cached, demoted, ["1"], lost, 16)):
            assert cplane.C.blame(*args) == -1
        assert lost == {}
    big = DENSE_LIMIT + 7
    cached.set_many([big], 4)
    assert cached._sparse  # the dict, so the Python path
    lost = {}
    assert blame(cached, demoted, [1, 2, 5, big, 9], lost, 16) == 4
    assert lost == {3: 32, 4: 16, 2: 16}
    assert blame_py(cached, demoted, [1, 2, 5, big, 9], None, 16) == 4


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=200, deadline=None)
@given(data=st.data(), attribute=st.booleans())
def test_the_compiled_blame_declines_a_negative_key_anywhere_and_changes_nothing(data, attribute):
    """The negative key's test sits inside blame's one pass (session 38: no pass of its own
    first): wherever the key is (first, last, after keys past both maps, after once-cached keys
    whose evictions it would add), with `lost` a dict or None, the call declines (-1) and `lost`
    is as it was; the same keys without it are counted as the reference counts them."""
    cached, demoted = _page_maps({k: k % 4 for k in range(0, 300, 3)}, {k: 1 + k % 2 for k in range(0, 300, 5)})
    keys = data.draw(st.lists(st.one_of(st.integers(0, 320), st.integers(1 << 20, (1 << 63) - 1)), max_size=60))
    at = data.draw(st.integers(0, len(keys)))
    bad = data.draw(st.sampled_from([-1, -2, -64, -65, -(1 << 63)]))
    prior = {7: 3}
    lost = dict(prior) if attribute else None
    assert cplane.C.blame(cached, demoted, keys[:at] + [bad] + keys[at:], lost, 16) == -1
    assert lost == (prior if attribute else None)
    lost_py = dict(prior) if attribute else None
    assert cplane.C.blame(cached, demoted, keys, lost, 16) == pagemap.blame_py(cached, demoted, keys, lost_py, 16)
    assert lost == lost_py and (lost is None or list(lost.items()) == list(lost_py.items()))


_HOSTILE_KEYS = st.one_of(st.integers(0, 1 << 14), st.integers(1 << 20, 3 << 20),
                          st.integers(pagemap.DENSE_LIMIT - 3, pagemap.DENSE_LIMIT + 3),
                          st.integers(pagemap.DENSE_LIMIT, (1 << 63) - 1), st.integers(-(1 << 63), -1))


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.lists(_HOSTILE_KEYS, max_size=40),
                              st.sampled_from([0, 1, 2, 2**31 - 2, 2**31 - 1]) | st.integers(0, 2**31 - 1),
                              st.booleans()), max_size=10),
       asked=st.lists(_HOSTILE_KEYS, max_size=60))
def test_page_maps_of_hostile_keys_answer_alike_by_c_and_by_python(ops, asked):
    """A slot holds ~value, zero bytes MISSING (session 36), in the leaf its range's top entry
    names (session 37): the compiled store and the Python twin leave the same bytes (the same
    leaves made in the same order), and every reader (get_list, get_many, get, len, blame by C and by
    Python, a pickled copy) answers as a dict would, for keys negative (output pages, never
    kept), past DENSE_LIMIT (the dict part), the largest int64 and values at both ends of
    [0, 2**31)."""
    from tierdiag.engine.pagemap import MISSING, PageMap, blame_py

    maps = {"c": (PageMap(), PageMap()), "py": (PageMap(), PageMap())}
    model: dict[int, int] = {}
    demoted_model: dict[int, int] = {}
    for i, (keys, value, as_array) in enumerate(ops):
        arg = np.array(keys, dtype=np.int64) if as_array else keys
        for name, (cached, demoted) in maps.items():
            set_many = PageMap._set_many_c if name == "c" else PageMap._set_many_py
            set_many(cached if i % 3 else demoted, arg, value)
        (model if i % 3 else demoted_model).update(dict.fromkeys((k for k in keys if k >= 0), value))
    (c_cached, c_demoted), (py_cached, py_demoted) = maps["c"], maps["py"]
    assert _raw(c_cached) == _raw(py_cached) and c_cached._sparse == py_cached._sparse
    assert _raw(c_demoted) == _raw(py_demoted)
    probe = asked + [k for keys, _, _ in ops for k in keys]
    expected = [model.get(k, MISSING) for k in probe]
    for pm in (c_cached, py_cached, pickle.loads(pickle.dumps(c_cached))):
        assert pm.get_list(probe) == expected
        assert pm.get_many(probe).tolist() == expected
        assert len(pm) == len(model)
    inputs = [k for k in probe if k >= 0]
    lost_py: dict[int, int] = {}
    want = blame_py(py_cached, py_demoted, inputs, lost_py, 16)
    assert want == sum(1 for k in inputs if k in model)
    if not c_cached._sparse and not c_demoted._sparse:
        lost_c: dict[int, int] = {}
        assert cplane.C.blame(c_cached, c_demoted, inputs, lost_c, 16) == want
        assert list(lost_c.items()) == list(lost_py.items())


_RUN_START = st.one_of(st.integers(0, 1 << 14), st.sampled_from([0, 63, 64, 65, 127, 128, 4095, 4096]),
                       st.integers(-3, 2))


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(_RUN_START, st.integers(0, 300), st.lists(st.integers(-(1 << 63), -1), max_size=3),
                              st.one_of(st.none(), st.tuples(st.integers(0, 299), st.integers(-(1 << 63), (1 << 14)))),
                              st.integers(0, 2**31 - 1), st.booleans()), max_size=12))
def test_runs_of_keys_are_stored_leaf_by_leaf_as_python_stores_them(ops):
    """map_set's run path (session 37): keys k0, k0 + 1, ... then output pages (a tree node's), stored
    leaf by leaf; a run starting below 0, one key of it changed (a run no more, or a key anywhere,
    negative or past the array), none at all: the general path. Either way the same bytes as the
    Python twin's (the same leaves in the same order) and the answers of a dict."""
    from tierdiag.engine.pagemap import MISSING, PageMap

    with_c, python, model = PageMap(), PageMap(), {}
    for start, length, outputs, change, value, as_array in ops:
        keys = list(range(start, start + length))
        if change is not None and change[0] < len(keys):
            keys[change[0]] = change[1]
        keys += outputs
        arg = np.array(keys, dtype=np.int64) if as_array else keys
        PageMap._set_many_c(with_c, arg, value)
        PageMap._set_many_py(python, arg, value)
        model.update(dict.fromkeys((k for k in keys if k >= 0), value))
    assert _raw(with_c) == _raw(python) and with_c._sparse == python._sparse
    probe = sorted(model) + list(range(-2, 300)) + [(1 << 14) + 400]
    assert with_c.get_list(probe) == [model.get(k, MISSING) for k in probe] == python.get_list(probe)


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.lists(st.integers(-50, 1 << 14), max_size=60), st.integers(0, 2**31 - 1),
                              st.booleans()), max_size=12))
def test_page_map_stores_by_the_compiled_data_plane_as_by_python(ops):
    """PageMap.set_many by the compiled map_set (keys inside the array) and by the Python path
    alone (lists, numpy arrays, growing the array, output pages skipped): the same map after
    the same calls; and map_set changes nothing where it declines (a key past the end)."""
    from tierdiag.engine.pagemap import PageMap

    def apply(m, set_many):
        for keys, value, as_array in ops:
            keys = sorted(keys, key=lambda k: k < 0)  # outputs_last: output pages come last
            set_many(m, np.array(keys, dtype=np.int64) if as_array else keys, value, outputs_last=True)
        return m

    with_c, python = apply(PageMap(), PageMap._set_many_c), apply(PageMap(), PageMap._set_many_py)
    probe = list(range(-3, (1 << 14) + 3))
    assert with_c.get_many(probe).tolist() == python.get_many(probe).tolist()
    assert len(with_c) == len(python)
    assert _raw(with_c) == _raw(python)  # grown alike, the same leaves in the same order
    before = _raw(with_c)
    for args in ((with_c, [0, with_c._n], 5), (with_c, [with_c._n - 1, 1 << 40], 5), (with_c, [0], 2**31),
                 (with_c, [0], -1), (with_c, [0], True), (with_c, [0, "1"], 5),
                 (with_c._flat(), [0], 5), (np.zeros(8, dtype=np.int64), [0], 5), (bytes(8), [0], 5)):
        assert cplane.C.map_set(*args) == -1
    assert _raw(with_c) == before
    made = with_c._nleaves
    for bad in (-1, with_c._n // pagemap.LEAF + 1):  # a leaf count the arrays cannot hold: declined
        with_c._nleaves = bad
        assert cplane.C.map_set(with_c, [0], 5) == -1 and cplane.C.blame(with_c, python, [0], None, 16) == -1
    with_c._nleaves = made
    assert _raw(with_c) == before
    with pytest.raises(OverflowError):  # what it declines, the Python path refuses
        PageMap._set_many_c(with_c, [0], 2**31)


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=300, deadline=None)
@given(data=st.data(), per_block=st.sampled_from([1, 2, 4, 32, 64]), as_list=st.booleans())
def test_the_compiled_hash_id_keys_are_the_numpy_ones(data, per_block, as_list):
    """trace/pages.py's page keys of a hash_ids request by the compiled block_page_keys and by
    numpy: the same int64s (num_pages past the blocks clipped as numpy's slice clips), a
    writable array of the call's own; ids whose keys would overflow int64 are declined and
    numpy raises as it raises."""
    big = 2**63 // per_block  # ids from here on make keys past int64
    ids = data.draw(st.lists(st.one_of(st.integers(0, 1 << 20), st.integers(big - 2, big + 2)), max_size=12))
    ids = list(ids) if as_list else tuple(ids)
    num_pages = data.draw(st.integers(0, len(ids) * per_block + 3))
    used = ids[:-(-num_pages // per_block)]
    got = cplane.C.block_page_keys(ids, num_pages, per_block)
    if got == -1:
        assert any(i >= 2**63 for i in ids) or any(i * per_block + per_block - 1 >= 2**63 for i in used)
    try:
        want = pages._block_page_keys_numpy(ids, num_pages, per_block)
    except OverflowError:  # an id past int64: numpy refuses it, and so does the compiled side's fallback
        with pytest.raises(OverflowError):
            pages._block_page_keys_c(ids, num_pages, per_block)
        return
    if got != -1:
        assert bytes(got) == want.tobytes()
    keys = pages._block_page_keys_c(ids, num_pages, per_block)
    assert keys.dtype == np.int64 and keys.tolist() == want.tolist()
    keys ^= 1  # the engine salts its arrays in place (extra_key)


def test_the_compiled_hash_id_keys_decline_what_is_not_theirs():
    if cplane.C is None:
        pytest.skip(f"_cplane: {cplane.WHY_NOT}")
    c = cplane.C
    assert bytes(c.block_page_keys((3, 5), 16, 8)) == np.array([3 * 8 + j for j in range(8)] + [5 * 8 + j for j in range(8)],
                                                               dtype=np.int64).tobytes()
    assert bytes(c.block_page_keys((3,), 99, 8)) == np.arange(24, 32, dtype=np.int64).tobytes()  # clipped, as a slice
    for args in (((2**62,), 8, 8), ((1, "2"), 2, 1), ((1,), -1, 8), ((1,), 1, 0), ((2**64,), 1, 1)):
        assert c.block_page_keys(*args) == -1


def _decode(data, rows, objects, width):
    """RowBuffer.take()'s rows back as the values appended, a tuple a column."""
    return tuple(values for _, values in cplane.C.decode_arrow(data, rows, objects, b"o" * width))


class _Str(str):
    """A str subclass (as the engine's StrEnum members Tier, EvictionAction, TransferKind): its
    text encoded as a str's ('S'), so it comes back a plain str of that text (what a VARCHAR
    column stores); one with lone surrogates, no UTF-8, comes back as the object itself."""


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.integers(-2**80, 2**80),
    # the edges of the encoder's one- and two-digit fast path (30-bit digits) and of int64
    st.sampled_from([0, 1, -1, 2**30 - 1, 2**30, -(2**30), 2**60 - 1, 2**60, -(2**60) + 1, -(2**60), 2**63 - 1,
                     -(2**63), 2**63]).flatmap(lambda v: st.sampled_from([v, v + 1, v - 1])),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["\\ud800 lone", "\x1b[31mred", ""]).map(lambda t: t.encode().decode("unicode_escape")),
    st.integers(-5, 5).map(np.int64), st.floats(-1, 1, width=32).map(np.float32), st.text(max_size=3).map(_Str))


def _exactly(rows):
    """Values with their types (nan == nan, -0.0 != 0.0)."""
    return [[(type(v), repr(v)) for v in row] for row in rows]


def _as_encoded(v):
    """What RowBuffer gives back for `v`: a str subclass with valid UTF-8 as a plain str of its
    text, anything else as it is."""
    if isinstance(v, str) and type(v) is not str:
        try:
            v.encode()
        except UnicodeEncodeError:
            return v
        return str.__str__(v)
    return v


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=300, deadline=None)
@given(width=st.integers(1, 6), data=st.data(), takes=st.integers(1, 3))
def test_a_row_buffer_gives_back_every_value_as_it_was_appended(width, data, takes):
    """_cplane.RowBuffer (the recorder's buffer a table, for the writer process) and
    recorder.columns_of (decode_arrow, every column kind 'o'): every value comes back with its
    type and value, take after take; the odd ones
    (big ints, numpy scalars, lone surrogates) as the objects themselves; a str subclass's text
    as a plain str (`_as_encoded`)."""
    buf = cplane.C.RowBuffer(width)
    for _ in range(takes):
        rows = data.draw(st.lists(st.tuples(*[_VALUES] * width), max_size=20))
        for row in rows:
            buf.append(row)
        assert len(buf) == len(rows)
        payload = buf.take()
        assert len(buf) == 0
        columns = columns_of(tuple(f"c{i}" for i in range(width)), payload)
        cols = tuple(columns.values())
        assert (_exactly(zip(*cols)) == _exactly([tuple(map(_as_encoded, row)) for row in rows]) if rows
                else cols == ((),) * width)


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 70_000), min_size=1, max_size=6), ints=st.lists(_VALUES, min_size=3, max_size=3))
def test_a_row_buffer_grows_inside_a_row_and_keeps_every_value(sizes, ints):
    """RowBuffer.append reserves a row's room for ints and None once (9 bytes a value) and again
    after any other value (issue 41 session 22): a str that makes the buffer grow in the middle
    of a row (past its first 64 KiB) leaves the row's later values whole, row after row."""
    buf = cplane.C.RowBuffer(5)
    rows = [(ints[0], "é" * n if n % 2 else "x" * n, ints[1], n, ints[2]) for n in sizes]
    for row in rows:
        buf.append(row)
    cols = tuple(columns_of(tuple(f"c{i}" for i in range(5)), buf.take()).values())
    assert _exactly(zip(*cols)) == _exactly([tuple(map(_as_encoded, row)) for row in rows])


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=200, deadline=None)
@given(data=st.data(), calls=st.integers(1, 4))
def test_append_pairs_is_a_row_a_pair_as_append_makes_them(data, calls):
    """RowBuffer.append_pairs(first, d) (a request's request_evictions rows from its `lost` dict,
    session 38): the same bytes, rows and odd objects as append((first, key, value)) for each
    item in the dict's order, whatever the values (hostile ints past int64, numpy scalars, lone
    surrogates, str subclasses, floats, None); mixed with plain appends, take after take; an
    empty dict adds nothing."""
    pairs_buf, rows_buf = cplane.C.RowBuffer(3), cplane.C.RowBuffer(3)
    keys = st.one_of(st.integers(-2**70, 2**70), st.text(max_size=4), st.none(), st.floats(allow_nan=False),
                     st.booleans())
    for _ in range(calls):
        for _ in range(data.draw(st.integers(0, 3))):
            first = data.draw(_VALUES)
            d = data.draw(st.dictionaries(keys, _VALUES, max_size=8))
            pairs_buf.append_pairs(first, d)
            for k, v in d.items():
                rows_buf.append((first, k, v))
            row = data.draw(st.tuples(_VALUES, _VALUES, _VALUES))
            pairs_buf.append(row)
            rows_buf.append(row)
        assert len(pairs_buf) == len(rows_buf)
        got, want = pairs_buf.take(), rows_buf.take()
        assert got[0] == want[0] and got[1] == want[1]
        assert _exactly([got[2] or []]) == _exactly([want[2] or []])


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_append_pairs_refuses_what_it_does_not_take_and_keeps_nothing_of_it():
    """Not a dict (a list of pairs, a dict subclass, a mapping proxy), the wrong arity, a buffer
    of another width: a TypeError, and the buffer as it was."""
    import types
    from collections import OrderedDict

    buf = cplane.C.RowBuffer(3)
    buf.append_pairs("r", {1: 2})
    for args in (("r", [(1, 2)]), ("r", OrderedDict({1: 2})), ("r", types.MappingProxyType({1: 2})), ("r",),
                 ("r", {1: 2}, 3), ()):
        with pytest.raises(TypeError):
            buf.append_pairs(*args)
    for width in (1, 2, 4):
        with pytest.raises(TypeError, match="3 values"):
            cplane.C.RowBuffer(width).append_pairs("r", {1: 2})
    data, rows, objects = buf.take()
    assert rows == 1 and _decode(data, rows, objects, 3) == (("r",), (1,), (2,))


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_a_row_buffer_refuses_a_row_of_another_width_and_decode_refuses_damaged_data():
    buf = cplane.C.RowBuffer(2)
    buf.append((1, "a"))
    for bad in ((1,), (1, 2, 3), [1, 2], "ab"):
        with pytest.raises(TypeError):
            buf.append(bad)
    assert len(buf) == 1
    data, rows, objects = buf.take()
    assert _decode(data, rows, objects, 2) == ((1,), ("a",))
    for args, message in (((data[:-1], rows, objects, 2), "ends inside a row"),
                          ((data + b"N", rows, objects, 2), "data left"),
                          ((b"X" + data[1:], rows, objects, 2), "bad tag"),
                          ((b"O\0\0\0\0N", 1, None, 2), "object index")):
        with pytest.raises(ValueError, match=message):
            _decode(*args)
    with pytest.raises(ValueError):
        cplane.C.RowBuffer(0)


_TICKERS = pytest.mark.parametrize("side", ["compiled", "reference"])


def _ticker_side(side):
    compiled, reference = cplane.pairs()["recorder.tick"]
    if side == "compiled" and cplane.C is None:
        pytest.skip(f"_cplane: {cplane.WHY_NOT}")
    return compiled if side == "compiled" else reference


@settings(max_examples=60, deadline=None)
@given(limit=st.one_of(st.integers(min_value=-3, max_value=12), st.just(2**62)),
       steps=st.lists(st.tuples(st.integers(min_value=0, max_value=2), st.integers(min_value=0, max_value=5),
                                st.booleans()), max_size=30),
       encoded=st.booleans())
def test_the_compiled_tick_flushes_exactly_when_the_python_one_does(limit, steps, encoded):
    """_cplane.FlushTicker and recorder._python_ticker (the recorder's tick, once a batch): each
    step appends rows to one of three buffers (row buffers or lists) and maybe ticks; both call
    flush() at the same ticks, whenever the buffers hold `limit` rows or more in all (a limit of
    0 or below: every tick), and flush here empties the buffers as the recorder's does."""
    if encoded and cplane.C is None:
        encoded = False
    compiled, reference = cplane.pairs()["recorder.tick"]
    sides = [reference] + ([compiled] if cplane.C is not None else [])
    logs = []
    for make in sides:
        buffers = tuple(cplane.C.RowBuffer(1) if encoded else [] for _ in range(3))
        log = []

        def flush(buffers=buffers, log=log):
            log.append(sum(map(len, buffers)))
            for b in buffers:
                b.clear() if isinstance(b, list) else b.take()

        tick = make(buffers, limit, flush)
        for which, count, do_tick in steps:
            for i in range(count):
                buffers[which].append((i,))
            if do_tick:
                log.append("tick")
                tick()
        logs.append(log)
    assert all(log == logs[0] for log in logs)
    held = 0  # the rows buffered since the last flush, as the steps appended them
    flushes = iter(logs[0])
    for _, count, do_tick in steps:
        held += count
        if do_tick:
            assert next(flushes) == "tick"
            if held >= limit:  # flushed at this tick, holding every row since the last flush
                assert next(flushes) == held
                held = 0
    assert next(flushes, None) is None


@_TICKERS
def test_a_tick_passes_on_what_a_length_or_flush_raises(side):
    """An error counting a buffer or flushing reaches the engine, as from the Python tick."""
    make = _ticker_side(side)

    class Broken:
        def __len__(self):
            raise RuntimeError("length broken")

    with pytest.raises(RuntimeError, match="length broken"):
        make((Broken(),), 1, lambda: None)()

    def failing():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        make(([1, 2],), 2, failing)()
    assert make(([1],), 2, failing)() is None  # below the limit: flush is not called


def test_the_compiled_ticker_refuses_what_the_recorder_never_passes():
    if cplane.C is None:
        pytest.skip(f"_cplane: {cplane.WHY_NOT}")
    make = cplane.C.FlushTicker
    for args in (([],), ([], 1, print), ((), "1", print), ((), 1, 5), ((), 2**70, print)):
        with pytest.raises((TypeError, OverflowError)):
            make(*args)
    with pytest.raises(TypeError):
        make((), 1, print)(1)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 30), lo=st.integers(-40, 40), hi=st.integers(-40, 40))
def test_span_reads_bounds_as_a_slice_does(n, lo, hi):
    """miss._span: (lo, hi) with 0 <= lo <= hi <= n, the same items as seq[lo:hi]."""
    seq = list(range(n))
    a, b = miss._span(n, lo, hi)
    assert 0 <= a <= b <= n and seq[a:b] == seq[lo:hi]


@pytest.mark.skipif(cplane.compiled("move") is None, reason="the C data plane is not built")
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), geometry=st.sampled_from([(4, 4096, 1024), (2, 64, 16384), (3, 192, 4096)]),
       extra=st.integers(0, 7), shape=st.sampled_from(["consecutive", "scattered", "repeats", "runs"]),
       aligned=st.booleans())
def test_a_move_past_the_streaming_size_moves_what_numpy_moves(seed, geometry, extra, shape, aligned):
    """A move of 1 MiB or more goes layer by layer, four rows at a time, with streaming stores
    (pages.c STREAM_MIN_BYTES, stream_rows): the same rows land as numpy's fancy-indexed store
    puts them, whatever the count of rows left over past the last four, runs (pages consecutive
    on both sides), scattered pages and a source page read twice alike, rows of 64 bytes to
    4 KiB; a destination not 16-byte aligned goes a memcpy a row, the same bytes; nothing else
    is written."""
    rng = np.random.default_rng(seed)
    layers, row, pages = geometry
    n = -(-(1 << 20) // (layers * row)) + extra  # just past the streaming size, any remainder mod 4
    assert n * layers * row >= 1 << 20 and n <= pages
    src = rng.integers(0, 255, size=(layers, pages, row), dtype=np.uint8).view(np.dtype((np.void, row)))
    src = src.reshape(layers, pages)
    raw = np.zeros(layers * pages * row + 8, dtype=np.uint8)
    base = raw.ctypes.data % 16
    at = (16 - base) % 16 if aligned else (16 - base) % 16 + 8  # 16-byte aligned, or 8 bytes off
    dst = raw[at:at + layers * pages * row].view(np.dtype((np.void, row))).reshape(layers, pages)
    assert (dst.ctypes.data % 16 == 0) == aligned
    if shape == "consecutive":
        s0, d0 = (int(x) for x in rng.integers(0, pages - n + 1, 2))
        sp, dp = list(range(s0, s0 + n)), list(range(d0, d0 + n))
    elif shape == "runs":  # two runs, swapped on the destination
        cut = int(rng.integers(0, n + 1))
        sp, dp = list(range(n)), list(range(cut, n)) + list(range(cut))
    else:
        sp, dp = rng.permutation(pages)[:n].tolist(), rng.permutation(pages)[:n].tolist()
        if shape == "repeats":
            sp = rng.integers(0, 9, size=n).tolist()  # a few source pages, each read many times
    want = dst.copy()
    want[:, dp] = src[:, sp]
    src_before = src.copy()
    runs = cplane.compiled("move")(src, sp, dst, dp)
    assert runs == sum(1 for i in range(n) if i == 0 or sp[i] != sp[i - 1] + 1)
    assert np.array_equal(dst.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(src.view(np.uint8), src_before.view(np.uint8)), "the source changed"
    assert not raw[:at].any() and not raw[at + layers * pages * row:].any(), "bytes around the pool were written"


class _Int(int):
    """An int subclass: its value is held as an exact int's is (the page lists read it in place)."""


# cplane.h's cp_small_int (the in-place read all three callers share: module.c's page lists,
# rows.c's row values, batch_pages.c's keys) on the edges of each layout's fast path: one 30-bit digit
# (3.12's compact ints), two, three with the top digit < 8 (|v| < 2^63), -2^63 (the call's), past
# int64; bools and int subclasses; each with its neighbours.
_EDGE_INTS = sorted({s * m + d for m in (0, 1, 2**30, 2**60, 2**62, 2**63, 2**64) for s in (1, -1)
                     for d in (-1, 0, 1)})
_HOSTILE_INTS = [*_EDGE_INTS, True, False, _Int(0), _Int(5), _Int(-(2**30) - 1), _Int(2**63 - 1), _Int(-(2**63)),
                 _Int(2**63)]


def _in_int64(v: int) -> bool:
    return -(2**63) <= v < 2**63


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@pytest.mark.parametrize("v", _HOSTILE_INTS, ids=repr)
def test_a_page_list_reads_every_int_at_its_value(v):
    """module.c's ints_load (every page list: moves, content, maps, page keys) through
    block_page_keys(list, n, 1), which hands back the values loaded as int64 bytes: an int within
    int64 (a bool, an int subclass too) comes back at its value, in a list and a tuple, alone
    and among small ones; one past int64 declines the list (-1: numpy's path decides)."""
    for seq in ([v], (v,), [7, v, -3], (v, 2**40, v)):
        got = cplane.C.block_page_keys(seq, len(seq), 1)
        if _in_int64(v):
            assert bytes(got) == np.array([int(x) for x in seq], dtype=np.int64).tobytes()
        else:
            assert got == -1


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_a_row_buffer_gives_back_every_hostile_int_with_its_type():
    """rows.c's rb_put (a row value) on the same ints: each comes back from the writer's decode
    with its type and value (an exact int in int64 encoded, a bool, an int subclass and an int
    past int64 as the object itself)."""
    rows = [(v, -v, v) for v in _HOSTILE_INTS]
    buf = cplane.C.RowBuffer(3)
    for row in rows:
        buf.append(row)
    cols = tuple(columns_of(("a", "b", "c"), buf.take()).values())
    assert _exactly(zip(*cols)) == _exactly(rows)


# --- session 19 (issue 41): the pools' and the page map's C bases, the output keys, the key list --
@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_the_pool_and_the_page_map_are_their_compiled_bases_on_the_compiled_plane():
    """On the compiled data plane PagePool's alloc / free and PageMap's set_many are the C bases'
    methods (SlotCore, MapCore: one call into C, no interpreted frame between), and free_pages
    is the base's count, kept by the C calls and by the numpy ones alike."""
    from tierdiag.engine.pagemap import PageMap

    assert PagePool.__mro__[1] is cplane.compiled("SlotCore") and PageMap.__mro__[1] is cplane.compiled("MapCore")
    assert PagePool.alloc is cplane.compiled("SlotCore").__dict__["_alloc_c"]
    assert PageMap.set_many is cplane.compiled("MapCore").__dict__["_set_many_c"]
    pool = _pool("page_first", 10)
    assert list(pool.alloc(4)) == [0, 1, 2, 3] and pool.free_pages == 6
    assert list(PagePool._alloc_numpy(pool, 2)) == [4, 5] and pool.free_pages == 4  # the numpy side moves the same count
    pool.free([5, 4])
    assert pool.free_pages == 6 and list(pool.alloc(2)) == [5, 4]  # back out as it was freed
    PagePool._free_numpy(pool, [0, 1, 2, 3, 4, 5])
    assert pool.free_pages == 10 and pool.used_pages == 0
    pool.check()


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=80, deadline=None)
@given(value=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=3), st.none(),
                       st.booleans(), st.just(np.int64(3)), st.just(b"\x00")))
def test_the_compiled_pool_takes_what_numpy_takes_and_refuses_the_rest_unchanged(value):
    """Hostile values through SlotCore: an alloc of anything but an int in (0, free_pages] goes to
    the numpy method (None, [], ValueError, TypeError as before), a free of anything but a list or
    tuple of owned ints goes there too; free_pages takes an int (an index) only. Nothing changes
    where either side refuses, and both sides answer alike."""
    c, py = _bookkeeping(C, 8), _bookkeeping(NUMPY, 8)
    c.alloc(3), py.alloc(3)
    for op in ("alloc", "free"):
        arg = [value] if op == "free" else value
        answers = []
        for pool in (c, py):
            before = (pool.free_pages, pool._stack.tolist(), bytes(pool._owned_bytes))
            try:
                answers.append(("ok", getattr(pool, op)(arg)))
            except (ValueError, TypeError, AssertionError, OverflowError, IndexError) as exc:
                answers.append((type(exc).__name__, None))
                assert (pool.free_pages, pool._stack.tolist(), bytes(pool._owned_bytes)) == before
            pool.check()
        assert answers[0] == answers[1], (op, value, answers)
    spare = _bookkeeping(C, 8)
    try:
        index = operator.index(value)
    except TypeError:
        with pytest.raises(TypeError):
            spare.free_pages = value
    else:
        if -(2**63) <= index < 2**63:
            spare.free_pages = value
            assert spare.free_pages == index and type(spare.free_pages) is int
        else:
            with pytest.raises(OverflowError):
                spare.free_pages = value
    with pytest.raises(AttributeError):
        del c.free_pages
    with pytest.raises(TypeError, match="_bind"):
        c._bind(c._stack[:4], c._owned_bytes, c._ints)
    with pytest.raises(TypeError, match="_bind"):
        c._bind(c._stack, bytes(8), c._ints)
    # the runs' template: an int64 array('q') of one item up to the pool's length, nothing else
    # (a wrong one is refused, the binding as it was)
    for bad in (array("i", [0] * 4), array("d", [0.0]), array("q"), array("q", [0] * (len(c._owned_bytes) + 1)),
                bytes(8), [0], "q", None):
        with pytest.raises(TypeError, match="_bind"):
            c._bind(c._stack, c._owned_bytes, bad)
    run = c.alloc(1)
    assert run is None or type(run) is array  # the template it had


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_the_compiled_set_many_hands_what_it_declines_to_python_with_the_same_arguments():
    """MapCore._set_many_c: keywords and odd calls go to _set_many_py as called (its answer, its
    TypeError); a key past the array grows it there."""
    from tierdiag.engine.pagemap import PageMap

    m = PageMap()
    m.set_many([1, 2, -5], 7, outputs_last=True)
    m.set_many(np.array([3, (1 << 12) + 5], dtype=np.int64), 9)  # past the first 4096: the Python path grows it
    assert m.get_many([1, 2, 3, (1 << 12) + 5, -5]).tolist() == [7, 7, 9, 9, -1]
    with pytest.raises(TypeError):
        m.set_many([1])
    with pytest.raises(TypeError):
        m.set_many([1], 2, bogus=True)
    with pytest.raises(OverflowError):
        m.set_many([1], -1)
    assert m.get_list([1]) == [7]


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=200, deadline=None)
@given(data=st.data(), req_id=st.text(max_size=8), base=st.sampled_from([0, 2**40, 2**62]))
def test_the_compiled_output_keys_are_the_numpy_ones(data, req_id, base):
    """pages.extend_output_keys by the compiled output_keys and by numpy (output_page_keys,
    np.concatenate): the same list and array after the same calls, again after a retraction
    grew them once already (skip > 0), across the numpy switch of output_page_keys."""
    n_in = data.draw(st.integers(0, 6))
    keys = [base + k for k in range(n_in)]
    a, b = list(keys), list(keys)
    arr_a, arr_b = np.array(keys, dtype=np.int64), np.array(keys, dtype=np.int64)
    for _ in range(data.draw(st.integers(1, 3))):
        total = len(a) + data.draw(st.integers(0, 40))
        arr_a = pages.extend_output_keys_c(req_id, a, arr_a, n_in, total)
        arr_b = pages.extend_output_keys_numpy(req_id, b, arr_b, n_in, total)
        assert a == b and arr_a.tolist() == arr_b.tolist() == a and arr_a.dtype == np.int64
        assert all(k < 0 for k in a[n_in:])
    assert a[n_in:] == pages.output_page_keys(req_id, keys[-1:], len(a) - n_in)


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_the_compiled_output_keys_decline_what_is_not_theirs_and_change_nothing():
    c = cplane.C
    keys, arr = [1, 2], np.array([1, 2], dtype=np.int64)
    for args in (((1, 2), arr, 5, 0, 3), (keys, arr[:1], 5, 0, 3), (keys, arr.astype(np.int32), 5, 0, 3),
                 (keys, arr, -1, 0, 3), (keys, arr, 2**63, 0, 3), (keys, arr, 5, 2, 1), (keys, arr, 5, -1, 3),
                 (keys, arr, "5", 0, 3), (keys, [1, 2], 5, 0, 3), (keys, arr[::-1][::2], 5, 0, 3)):
        assert c.output_keys(*args) == -1
        assert keys == [1, 2]
    with pytest.raises(TypeError):
        c.output_keys(keys, arr, 5, 0)
    got = pages.extend_output_keys_c("r", [1, 2], np.array([1, 2], dtype=np.int32), 2, 4)  # numpy's path
    assert got.tolist()[:2] == [1, 2] and len(got) == 4


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@settings(max_examples=300, deadline=None)
@given(req_id=st.one_of(st.text(max_size=300), st.text(alphabet="\x00\\\n'\"é漢😀", max_size=140)),
       last=st.integers(-(2**63), 2**63 - 1))
def test_the_compiled_output_seed_is_hashlibs_blake2b(req_id, last):
    """page_keys.c's BLAKE2b (RFC 7693) against hashlib's on the seed's message: any request id
    (unicode, escapes, NUL, one to three 128-byte blocks) and any int64 last key."""
    assert cplane.C.output_seed(req_id, last) == pages._output_seed(req_id, last)


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
def test_the_compiled_output_seed_declines_what_python_answers_or_refuses():
    c = cplane.C
    for args in (("r", 2**63), ("r", -(2**63) - 1), ("r", 1.0), (b"r", 1), ("\ud800", 1), ("r", True)):
        assert c.output_seed(*args) == -1
    with pytest.raises(UnicodeEncodeError):  # what the C side declined, Python refuses
        pages.extend_output_keys_c("\ud800", [1], np.array([1], dtype=np.int64), 1, 3)
    with pytest.raises(TypeError):
        c.output_seed("r")


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
       shape=st.sampled_from(["flat", "strided", "int32", "2d", "empty"]))
def test_the_compiled_key_list_is_tolist(values, shape):
    """pages.keys_list (compiled: one C loop over the int64s; anything else through the array's
    own tolist) gives what numpy's tolist gives: the same ints, exact ints, the same nesting."""
    arr = np.array(values, dtype=np.int64)
    if shape == "strided":
        arr = arr[::2]
    elif shape == "int32":
        arr = (arr & 0xFFFF).astype(np.int32)
    elif shape == "2d":
        arr = np.resize(arr, (2, 2)) if arr.size else arr.reshape(0, 2)
    elif shape == "empty":
        arr = arr[:0]
    for side in (pages.keys_list, pages.keys_list_numpy):
        got = side(arr)
        assert got == arr.tolist() and type(got) is list
        assert all(type(v) is int for v in (got if arr.ndim == 1 else [w for row in got for w in row]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_pool_and_page_map_are_equal_and_their_own(backend, how):
    """copy.deepcopy / pickle keep what the C bases hold outside __dict__ (the free count, the
    map's array) and remake the views over the copy's memory: the copy hands out the same slots
    and answers the same, and changing it leaves the original alone. (Pickled: the process's own
    PagePool, a class pickle can name.)"""
    import copy
    import pickle

    from tierdiag.engine.pagemap import PageMap

    clone = copy.deepcopy if how == "deepcopy" else (lambda o: pickle.loads(pickle.dumps(o)))
    pool = _bookkeeping(backend, 16) if how == "deepcopy" else _pool("page_first", 16)
    held = pool.alloc(5)
    pool.free(held[:2])
    m = PageMap()
    m.set_many([1, 2, 9], 4)
    m.set_many([1 << 40], 6)  # the dict part
    p2, m2 = clone(pool), clone(m)
    assert p2.free_pages == pool.free_pages == 13
    got = pool.alloc(4)
    assert p2.alloc(4) == got
    pool.free(got)  # back as it was
    p2.free(held[2:])
    assert pool.free_pages == 13 and p2.free_pages == 12
    p2.check(), pool.check()
    p2.array[...] = 7  # the copy's bytes are its own
    assert not pool.array.any() and (p2.rows.view(np.int64) == 7).all()
    assert m2.get_many([1, 2, 9, 3]).tolist() == [4, 4, 4, -1] and m2.get(1 << 40) == 6
    m2.set_many([3], 7)
    assert m.get(3) is None and m2.get(3) == 7
