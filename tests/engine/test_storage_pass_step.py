"""The storage writes' per-pass walks handed the pass by the scheduler (issue 41, the storage row).

`storage_pass_start` hands `CacheController.start_storage_writes`, `release_storage_writes` and
`free_prefetch_tails` the pass it is (its `prefetch_pass + 1`), where each read the scheduler's
count by a generic attribute read a pass (`pass_now`); and `release_storage_writes` leaves the
list of writes in flight as it is on a pass that takes no write's ack. Both must decide exactly
as before: the same writes started, landed and released, in the same order, whichever way the
pass is given.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS
from tierdiag.engine.content import write_content
from tierdiag.engine.controller import CallClock


def _host_node(engine, keys: list[int], now: int):
    """A host-only node below the root, its content written."""
    ctrl = engine.ctrl
    slots = ctrl.host.alloc(len(keys))
    write_content(ctrl.host, slots, keys)
    return engine.scheduler.tree.insert_host(engine.scheduler.tree.root, keys, slots, now, None)


ENTRY = st.tuples(st.integers(0, 6),  # release pass
                  st.sampled_from([-1, 0, 5, 10, 20]),  # start (-1: not started)
                  st.integers(0, 30),  # end
                  st.booleans())  # landed


def _setup(tmp_path, folder: str, entries: list[tuple[int, int, int, bool]], owner_pass: int):
    """An engine with a storage write in flight per entry (a host node each, its copy held),
    its fields as given; the pass count `owner_pass`."""
    engine = helpers.storage_engine(tmp_path, folder=folder)
    ctrl = engine.ctrl
    ctrl.pass_owner = SimpleNamespace(prefetch_pass=owner_pass)
    nodes = []
    for i, (release_pass, start, end, landed) in enumerate(entries):
        node = _host_node(engine, [1000 + 10 * i, 1001 + 10 * i], 1)
        ctrl._storage_after_ack(node, "x", 0)
        entry = ctrl.storage_writes[-1]
        entry.release_pass = release_pass
        if start >= 0:
            entry.start, entry.end = start, max(start, end)
        entry.landed = landed and start >= 0
        nodes.append(node)
    return engine, nodes


def _state(engine, nodes) -> tuple:
    ctrl = engine.ctrl
    return ([(nodes.index(e.node), e.release_pass, e.start, e.end, e.landed) for e in ctrl.storage_writes],
            [n.host_ref for n in nodes], ctrl.storage.used_pages, ctrl.storage.write_free_ns)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY, max_size=6), owner_pass=st.integers(0, 5), now=st.integers(0, 30))
def test_a_pass_handed_in_decides_as_the_pass_count_read(tmp_path_factory, entries, owner_pass, now):
    """A pass's start and drain with the pass handed in (`step`, as `storage_pass_start` does)
    start, land and release the same writes as the controller reading the count itself."""
    tmp = tmp_path_factory.mktemp("step")
    read, read_nodes = _setup(tmp, "read", entries, owner_pass)
    given_, given_nodes = _setup(tmp, "given", entries, owner_pass)
    for engine, nodes in ((read, read_nodes), (given_, given_nodes)):
        engine.ctrl.clock = CallClock(lambda t, fn, arg: None)  # (no event loop here)
    read.ctrl.start_storage_writes(now)
    given_.ctrl.start_storage_writes(now, owner_pass + 1)
    assert _state(read, read_nodes) == _state(given_, given_nodes)
    before = _state(given_, given_nodes)[0]
    read.ctrl.release_storage_writes(now)
    given_.ctrl.release_storage_writes(now, step=owner_pass + 1)
    assert _state(read, read_nodes) == _state(given_, given_nodes)
    # what a drain keeps: the writes whose ack it does not take, in their order
    step = owner_pass + 1
    kept = [e for e in before if not (e[4] and e[1] <= step and e[3] <= now)]
    assert _state(given_, given_nodes)[0] == kept
    released = {e[0] for e in before} - {e[0] for e in kept}
    assert all(given_nodes[i].host_ref == 0 for i in released)
    assert all(given_nodes[e[0]].host_ref == 1 for e in kept)


def test_a_pass_that_takes_no_ack_leaves_the_writes_in_flight_as_they_are(tmp_path):
    """Writes landed but not yet due (their release pass ahead), or not yet ended: nothing
    released, the list the same writes in the same order; at their pass, released."""
    engine, nodes = _setup(tmp_path, "tier", [(3, 0, 5, True), (1, 0, 50, True), (2, 5, 9, False)], 0)
    ctrl = engine.ctrl
    writes = list(ctrl.storage_writes)
    ctrl.release_storage_writes(10, step=1)  # the first's pass not reached, the second not ended
    assert ctrl.storage_writes == writes and [n.host_ref for n in nodes] == [1, 1, 1]
    ctrl.release_storage_writes(10, step=3)  # the first is due now
    assert ctrl.storage_writes == writes[1:] and [n.host_ref for n in nodes] == [0, 1, 1]

