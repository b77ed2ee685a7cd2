"""The miss reason `prefetch_lost` (engine/miss.py; issue 43 follow-up), narrated: a request's own
storage prefetch read its pages into host, and host pressure deleted them before the request was
scheduled, so it computed them again although storage held them and the read had happened.

SGLang 0.5.23 inserts a finished prefetch's pages into the tree unprotected, at the storage drain of
the pass after its read (`UnifiedRadixCache._handle_prefetch_result` -> `tree_core.insert_host`:
"when this function returns the host memory referenced must be inserted into the radix tree or
released to pool"), whether or not its request is admitted then. Another request's prefetch that
needs host room (`_drain_and_alloc_storage_hit` -> `allocate_storage_hit`, evicting host leaves)
may delete them while the request still waits. At its admission, `_prefetch_after_device_hit_loss`
compares `prefix_len + host_hit_length` with `storage_prefetch_last_match_len`, the match at its
last query, taken before those pages: it is not shorter, so storage is not queried again and the
request computes them.

Before this reason the engine called those tokens `beyond_storage` ("a storage tier existed but
did not hold it"), which was false: storage held them and the prefetch read them.
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.miss import MISS_COLUMNS


def _engine(tmp_path, **kw) -> Engine:
    """0.5.23 (the default rules), a 16-page device, a 24-page host, storage priced at 0 ns."""
    return helpers.storage_engine(tmp_path, "st", prefetch_policy="wait_complete", host_tokens=24 * PS, **kw)


def _reasons(record) -> dict[str, int]:
    return {c[len("miss_"):-len("_tokens")]: getattr(record, c) for c in MISS_COLUMNS if getattr(record, c)}


def test_a_prefetch_evicted_from_host_before_admission_is_prefetch_lost(tmp_path):
    """a (8 pages, 400 output tokens) runs first and holds the device: its decode reservation
    leaves r no room (PrefillAdder NO_TOKEN) until a finishes. r's 8 pages are in storage: its
    query, hit and read go through while it waits, and the drain inserts them into host,
    unprotected. q, also waiting, then prefetches 14 stored pages: the host (24 pages: a's 8-page
    write_through copy, r's 8) has 8 free, so q's allocation deletes r's host-only leaves. When a
    finishes r is admitted: nothing of its prefix is in the tree, its last query's match (0) is
    not longer than now, so no re-query; it computes its 8 pages: prefetch_lost, 8 pages. q's
    read goes the same way, pushed out by a's finish."""
    engine = _engine(tmp_path)
    a = req("a", 0, list(range(1000, 1008)), output=400)
    r = req("r", 1, list(range(1, 9)))
    q = req("q", 2, list(range(101, 115)))
    helpers.store_input_pages(engine, r)
    helpers.store_input_pages(engine, q)
    engine.run(helpers.numbered([a, r, q]))
    got = engine.probe.records["r"]
    # storage held it and its prefetch read it: 8 pages matched, 8 read, none used
    assert (got.storage_match_tokens, got.storage_bytes, got.storage_hit_tokens) == (
        8 * PS, 8 * engine.ctrl.page_bytes, 0)
    assert got.storage_skipped_reason is None  # nothing skipped: the read completed
    assert got.computed_tokens == r.input_len and got.recomputed_tokens == 8 * PS
    # the deletion came while it waited, forced by q's prefetch
    deleted = [e for e in engine.probe.evictions if e.tier == "host" and e.action == "delete" and e.owner_req_id == "r"]
    assert deleted and all(e.cause_req_id == "q" for e in deleted)
    assert _reasons(got) == {"prefetch_lost": 8 * PS, "never_cached": 1}
    assert got.miss_beyond_storage_tokens == 0  # what it was called before: storage did hold them
    # q's own read fared no better: a's finish inserted its output pages, whose write_through
    # host copies took the room of q's host-only leaves before q was scheduled
    qd = [e for e in engine.probe.evictions if e.tier == "host" and e.action == "delete" and e.owner_req_id == "q"]
    assert qd and all(e.cause_req_id == "a" for e in qd)
    assert _reasons(engine.probe.records["q"]) == {"prefetch_lost": 14 * PS, "never_cached": 1}
    engine.check_invariants(idle=True)


def test_a_prefetch_admitted_at_once_loses_nothing(tmp_path):
    """The same r alone: the drain inserts its read and the same pass admits it, loading the pages
    back (a storage hit); nothing was lost, no prefetch_lost."""
    engine = _engine(tmp_path)
    r = req("r", 1, list(range(1, 9)))
    helpers.store_input_pages(engine, r)
    engine.run(helpers.numbered([r]))
    got = engine.probe.records["r"]
    assert got.storage_hit_tokens == 8 * PS and got.miss_prefetch_lost_tokens == 0
    assert _reasons(got) == {"never_cached": 1}
