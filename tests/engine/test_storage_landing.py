"""A storage write's landing (issue 41, the storage row): `CacheController._land` writes the parts
of the node its host copy's ack found (`_parts`: the node, and where a match split it since, its
upper parts above it, root side first), each still on host and in the tree, and nothing else.

A node not split since (nearly every landing) is written alone without `_parts`' list; the
tier's write (`StorageTier.write_from` with the host pool's row view) goes straight to the
compiled index's admit-and-write (`_admit_write_rows`). Both must land exactly what the walk
says: the same keys in the tier, the same storage-write rows in the same order, the same
deletions counted, on a tier that fills during the landing.
"""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tierdiag.engine.content import write_content
from tierdiag.engine.controller import CallClock

TIER_PAGES = 128  # helpers.storage_engine's tier (its host pool: 64 pages, what a chain and a prefill write take)


def _chain(engine, lengths: list[int], base: int) -> list:
    """Host-only nodes one below the other from the root, `lengths[i]` pages each, their
    content written; keys from `base` on."""
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    parent, nodes, key = tree.root, [], base
    for n in lengths:
        keys = list(range(key, key + n))
        key += n
        slots = ctrl.host.alloc(n)
        write_content(ctrl.host, slots, keys)
        parent = tree.insert_host(parent, keys, slots, 1, None)
        nodes.append(parent)
    return nodes


def _expected_parts(node, pages: int, root) -> list:
    """`_parts` restated: the node, then its ancestors below the root while they cover fewer
    than `pages`, root side first."""
    parts, covered, up = [node], len(node.keys), node.parent
    while covered < pages and up is not None and up is not root:
        parts.append(up)
        covered += len(up.keys)
        up = up.parent
    return parts[::-1]


def _deleted(ctrl) -> int:
    return ctrl.stats.evictions.get("storage/delete", 0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       pages_at=st.floats(0, 1), cut=st.integers(0, 5), off_host=st.integers(0, 5),
       prefill=st.lists(st.integers(1, 16), max_size=12), repeat=st.booleans(),
       start=st.integers(0, 10**6), length=st.integers(0, 10**6))
def test_a_landing_writes_the_acked_parts_still_held_and_nothing_else(tmp_path_factory, lengths, pages_at, cut,
                                                                     off_host, prefill, repeat, start, length):
    """Whatever the node's split (pages from one to the whole chain), parts dropped from the
    tree or off host since, and a tier filled before (up to past its capacity, so that the
    landing deletes pages, and maybe with the landing's own keys there already): the keys in the
    tier, the rows and the deletions are those of the parts the walk names."""
    engine = helpers.storage_engine(tmp_path_factory.mktemp("land"))
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    ctrl.clock = CallClock(lambda t, fn, arg: None)  # (no event loop here)
    nodes = _chain(engine, lengths, 100_000)  # (above every prefill key)
    node = nodes[-1]
    total = sum(lengths)
    pages = max(1, round(pages_at * total))
    # pages written before the landing (other keys; with `repeat`, the node's own first keys too)
    for i, n in enumerate(prefill):
        keys = list(range(1_000 * (i + 1), 1_000 * (i + 1) + n))
        slots = ctrl.host.alloc(n)
        write_content(ctrl.host, slots, keys)
        ctrl.storage.write_from(ctrl.host.array, array("q", slots), array("q", keys), rows=ctrl.host.rows)
        ctrl.host.free(slots)  # (gathered by the call: the host pool is smaller than the tier)
    if repeat:
        keys = list(node.keys)[:1]
        slots = ctrl.host.alloc(1)
        write_content(ctrl.host, slots, keys)
        ctrl.storage.write_from(ctrl.host.array, array("q", slots), array("q", keys), rows=ctrl.host.rows)
    # a node dropped from the tree since the ack, or its host copy gone (set here as the tree
    # leaves them: no parent, no host run); the walk then stops at a dropped one
    if 0 < cut <= len(nodes):
        nodes[cut - 1].parent = None
    if 0 < off_host <= len(nodes) and off_host != cut:
        nodes[off_host - 1].host = None
    parts = _expected_parts(node, pages, tree.root)
    written = [p for p in parts if p.host is not None and p.parent is not None]
    used, deleted, rows = ctrl.storage.used_pages, _deleted(ctrl), len(engine.probe.transfers)
    ctrl._land(node, "cause", pages, start, start + length, start + length)
    new = [k for p in written for k in p.keys if k not in (list(node.keys)[:1] if repeat else [])]
    want_used = min(TIER_PAGES, used + len(new))
    assert ctrl.storage.used_pages == want_used
    assert _deleted(ctrl) - deleted == used + len(new) - want_used
    # the parts written are in the tier unless pushed out by a later part of the same landing
    # (a landing of more pages than the tier holds); every key of a part not written is absent
    landed = [k for p in written for k in p.keys]
    kept = landed[-TIER_PAGES:] if len(landed) > TIER_PAGES else landed
    assert all(k in ctrl.storage for k in kept)
    skipped = [k for p in nodes if p not in written for k in p.keys if not (repeat and k == list(node.keys)[0])]
    assert not any(k in ctrl.storage for k in skipped)
    # one storage-write row a part written, root side first, on the tier's clock as handed in
    got = [(t.kind, t.pages, t.t_start_ns, t.t_end_ns, t.req_id) for t in engine.probe.transfers[rows:]]
    assert got == [("storage_write", len(p.keys), start, start + length, "cause") for p in written]
    ctrl.storage.flush()


def test_a_split_node_lands_its_upper_parts_and_an_unsplit_one_alone(tmp_path):
    """Narrated: a write of 6 pages acknowledged on one node, which a match split into 2 + 4
    since; the landing writes both parts, upper first. A node not split lands alone: its parent
    (backed up but not part of this write) stays out of the tier."""
    engine = helpers.storage_engine(tmp_path)
    ctrl = engine.ctrl
    ctrl.clock = CallClock(lambda t, fn, arg: None)
    upper, lower = _chain(engine, [2, 4], 500)
    ctrl._land(lower, None, 6, 0, 10, 10)
    assert [k in ctrl.storage for k in (500, 501, 502, 505)] == [True] * 4
    assert [t.pages for t in engine.probe.transfers] == [2, 4]
    other_upper, other_lower = _chain(engine, [3, 2], 700)
    ctrl._land(other_lower, None, 2, 10, 20, 20)
    assert [k in ctrl.storage for k in (700, 702, 703, 704)] == [False, False, True, True]
    assert [t.pages for t in engine.probe.transfers] == [2, 4, 2]
    ctrl.storage.flush()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chains=st.lists(st.tuples(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.floats(0, 1)),
                       min_size=1, max_size=3),  # (at most 60 pages: the host pool holds 64)
       owner_pass=st.integers(0, 9))
def test_a_copys_ack_queues_a_storage_write_a_part_it_covered(tmp_path_factory, chains, owner_pass):
    """The write-through copy's ack (`_ack_backups_to_storage`, one batch of nodes): every
    node's lock dropped first, then one storage write queued a part the walk names (the node
    alone where it was not split while its copy was in flight), root side first, node after
    node, each part's host copy protected until its write's drain, its release pass two
    passes on."""
    from types import SimpleNamespace

    engine = helpers.storage_engine(tmp_path_factory.mktemp("ack"))
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    ctrl.pass_owner = SimpleNamespace(prefetch_pass=owner_pass)
    acked, want = [], []
    for i, (lengths, pages_at) in enumerate(chains):
        node = _chain(engine, lengths, 100_000 * (i + 1))[-1]
        pages = max(1, round(pages_at * sum(lengths)))
        tree.inc_lock(node)  # the copy's lock (backup)
        acked.append((node, f"c{i}", pages))
        want += [(p, f"c{i}", owner_pass + 2, len(p.keys)) for p in _expected_parts(node, pages, tree.root)]
    ctrl.backups_in_flight = len(acked)
    ctrl._ack_backups_to_storage(acked)
    assert ctrl.backups_in_flight == 0
    assert all(node.lock_ref == 0 for node, _, _ in acked)
    got = [(w.node, w.cause, w.release_pass, w.pages) for w in ctrl.storage_writes]
    assert got == want
    assert all(w.node.host_ref == 1 and w.start == -1 and not w.landed for w in ctrl.storage_writes)
