"""The engine core's fields and calls typed for the compiled build (issue 41, session 26): a
request's lengths as ints, the copy's constants, the arrival's blame straight into the C data
plane, a node's parent typed, the controller's pool geometry read once. Each must leave what
the engine computes as it was: checked here against the reference each replaced."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tierdiag.config.constants import RUN_OVERHEAD_NS, SEGMENT_OVERHEAD_NS
from tierdiag.engine import admission
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.engine import Engine
from tierdiag.engine.pagemap import PageMap, blame_py
from tierdiag.engine.request import Req
from tierdiag.engine.tree import RadixTree, _parent
from tierdiag.trace.reader import TraceRequest

HOSTILE_INTS = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([0, -1, 2**62 - 1, 2**62, 2**63, -2**63 - 1]))


def _map(pairs: list[tuple[int, int]]) -> PageMap:
    m = PageMap()
    for key, value in pairs:
        m.set_many([key], value)
    return m


# keys of the dense array and far past it (the map's dict part), values of eviction ids
_PAIRS = st.lists(st.tuples(st.one_of(st.integers(0, 5000), st.integers(2**40, 2**40 + 50)), st.integers(0, 40)),
                  max_size=60)


@settings(max_examples=150, deadline=None)
@given(cached=_PAIRS, demoted=_PAIRS,
       keys=st.lists(st.one_of(st.integers(0, 5100), st.integers(2**40, 2**40 + 60), st.integers(-5, -1)),
                     max_size=120),
       with_lost=st.booleans(), ps=st.integers(1, 64))
def test_the_arrival_blame_counts_what_the_reference_counts_on_the_array(cached, demoted, keys, with_lost, ps):
    """`blame_keys` on a key run (the C straight from the compiled core where both maps are
    arrays only) against the reference on the numpy keys `_count_recomputed` handed it before:
    the same count and the same evictions, maps with and without a dict part, negative keys
    (which the C declines) and runs past the 48-page list path included."""
    cm, dm = _map(cached), _map(demoted)
    run = array("q", keys)
    lost_new: dict[int, int] | None = {} if with_lost else None
    lost_ref: dict[int, int] | None = {} if with_lost else None
    got = admission.blame_keys(cm, dm, run, lost_new, ps)
    want = blame_py(cm, dm, np.asarray(keys, dtype=np.int64), lost_ref, ps)
    assert got == want
    assert lost_new == lost_ref


@settings(max_examples=100, deadline=None)
@given(input_len=HOSTILE_INTS, output_len=HOSTILE_INTS)
def test_a_request_keeps_the_trace_lengths_as_they_are(input_len, output_len):
    """Req's lengths are declared ints (native fields compiled): any int the trace holds, beyond
    64 bits and negative included, reads back as it was, and the prefill length starts at the
    input's."""
    t = TraceRequest(req_id="r", seq=0, line=1, arrival_ns=0, input_len=input_len, output_len=output_len,
                     hash_ids=None, tokens=None)
    r = Req(t, 5)
    assert (r.input_len, r.output_len, r.fill_len) == (input_len, output_len, input_len)
    r.fill_len = input_len + 3
    assert r.fill_len - r.input_len == 3


def test_a_request_length_that_is_not_an_int_is_refused_compiled_or_kept_pure():
    """A hostile trace value that is no int: the compiled Req refuses it (TypeError at the
    field), the Python twin keeps it as it is; neither turns it into another number."""
    t = TraceRequest(req_id="r", seq=0, line=1, arrival_ns=0, input_len="12", output_len=3, hash_ids=None,
                     tokens=None)
    try:
        r = Req(t, 0)
    except TypeError:
        return
    assert r.input_len == "12" and r.fill_len == "12"


@settings(max_examples=150, deadline=None)
@given(num_bytes=st.integers(0, 2**40), pages=st.integers(0, 10**6), runs=st.integers(0, 10**6),
       to_device=st.booleans())
def test_a_copy_is_priced_with_the_config_constants(num_bytes, pages, runs, to_device):
    """copy_ns's per-page and per-run costs, now compiled constants, are config/constants'."""
    cost = CostModel.from_config(helpers.small_config())
    bw = cost.h2d_bytes_per_s if to_device else cost.d2h_bytes_per_s
    want = (cost.transfer_overhead_ns + int(num_bytes / bw * 1e9)
            + cost.num_layers * (SEGMENT_OVERHEAD_NS * pages + RUN_OVERHEAD_NS * runs))
    assert cost.copy_ns(num_bytes, pages, to_device=to_device, runs=runs) == want


def test_a_node_parent_is_its_parent_and_the_root_has_none():
    tree = RadixTree(4)
    got = tree.insert(array("q", [1, 2, 3]), 0, array("q", [0, 1, 2]), 10)
    assert _parent(got.last) is tree.root
    try:
        none = _parent(tree.root)
    except TypeError:  # compiled: the cast refuses None
        return
    assert none is None


def test_the_controller_reads_each_pool_geometry_once_as_the_pools_hold_it():
    """The rows and the device geometry the copies and the prefill writes hand the C are the
    pools' own (fixed for a pool's life)."""
    engine = Engine(helpers.small_config(), probe=None)
    ctrl = engine.scheduler.ctrl
    assert ctrl._device_rows is ctrl.device.rows and ctrl._host_rows is ctrl.host.rows
    assert (ctrl._device_layers, ctrl._device_elems) == (ctrl.device.num_layers, ctrl.device.page_elems)
    assert isinstance(ctrl.page_bytes, int) and isinstance(ctrl.dp_page_bytes, int)


@pytest.mark.parametrize("kw", [{"sglang_rules": "0.5.23"}, {"sglang_rules": "0.5.9"}])
def test_a_replay_with_backups_and_evictions_runs_through_the_typed_paths(kw):
    """A small replay whose pools are too small for its requests: evictions on both tiers,
    backups flushed and written, load-backs; every request finishes or is rejected."""
    reqs = [helpers.req(f"r{i}", 10 * i, list(range(100 * (i % 5), 100 * (i % 5) + 9))) for i in range(30)]
    engine, probe = helpers.run(reqs, **kw)
    stats = engine.scheduler.stats
    assert stats.requests_finished + stats.requests_rejected == 30
    assert stats.backups > 0 and sum(stats.evictions.values()) > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e308, -1e308])),
                max_size=40))
def test_a_batch_flops_are_summed_as_the_builtin_sums_them(xs):
    """`_fsum` (the batch's FLOP sums as a native loop) against builtin `sum` on CPython 3.11:
    the same double, bit for bit (-0.0, infinities and NaN included)."""
    got, want = admission._fsum(xs), sum(xs)
    assert repr(got) == repr(float(want))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 40), max_size=6), min_size=2, max_size=2))
def test_a_match_counts_its_pages_as_before(sizes):
    """TreeMatch.device_pages / host_pages (loops now) are the sums of their nodes' pages."""
    from tierdiag.engine.tree_node import TreeMatch, TreeNode

    def nodes(ns):
        return tuple(TreeNode(i, None, array("q", range(n)), None, None, 0, None) for i, n in enumerate(ns))
    m = TreeMatch(nodes(sizes[0]), nodes(sizes[1]))
    assert (m.device_pages, m.host_pages) == (sum(sizes[0]), sum(sizes[1]))
