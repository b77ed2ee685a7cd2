"""SGLang 0.5.23's tier split of a request whose storage prefetch brought pages that reached the
device before its admission, narrated.

Found by the scheduler harness's storage tier (tests/sglang/test_scheduler_0523.py, `stored`
seed 0, page 1, fcfs, write_through, timeout): st0-9's prefetch read 538 tokens past its 64-token
match; st0-12's chunk then put 450 of them on device (its insert refilled the prefetched host
nodes), and st0-9 was admitted with 514 device and 88 host tokens. SGLang reported device 64 /
storage 538, the engine device 514 / storage 88 (the pages it loaded from its own prefetch).
"""

from __future__ import annotations

import numpy as np

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RULE_SETS


def test_the_split_counts_the_whole_prefetched_span_as_storage():
    """schedule_batch.py `split_cached_prefix_by_tier(prefix_len, host_hit_len,
    storage_hit_len=req.storage_hit_length, storage_hit_start=req.storage_hit_start)`: storage =
    the part of [storage_hit_start, + storage_hit_length) inside the prefix, by position, whatever
    tier those tokens were found on at admission; host = the materialized host hit less the part
    of it the span covers; device = the rest. st0-9 (page 1): prefix 602, host hit 88 (loaded),
    span 538 from 64 -> device 64, host 0, storage 538."""
    split = RULE_SETS["0.5.23"].split_cached_prefix
    # (prefix, device, host_hit, host_loaded, its prefetch's part of the host hit, where it
    # starts, the prefetched span, where it starts)
    assert split(602, 514, 88, 88, 88, 514, 538, 64) == (64, 0, 538)
    # a span entirely in the host hit: as before (storage after the host pages not prefetched)
    assert split(9, 4, 5, 5, 2, 7, 2, 7) == (4, 3, 2)
    # no span: nothing is storage
    assert split(9, 4, 5, 5, 0, 9, 0, 0) == (4, 5, 0)
    # a span past the prefix (declined load-back): the part inside the prefix only
    assert split(6, 6, 3, 0, 3, 6, 5, 4) == (4, 0, 2)
    # 0.5.9's `prepare_for_extend`: storage = min(host_hit_length, storage_hit_length), its
    # storage part being what its prefetch brought of the host hit (unchanged)
    assert RULE_SETS["0.5.9"].split_cached_prefix(602, 514, 88, 88, 88, 514, 538, 64) == (514, 0, 88)


def _engine(tmp_path) -> Engine:
    cfg = helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS, storage_dir=str(tmp_path / "tier"),
                               verify="off")
    return Engine(cfg, probe=helpers.Collect())


def _queued(keys: list[int]) -> Req:
    r = Req(req("r", 0, keys), 0)
    r.keys = list(keys)
    r.keys_np = np.asarray(keys, dtype=np.int64)
    r.max_match_pages = len(keys)
    return r


def test_the_span_is_what_the_prefetch_put_into_the_tree_taken_at_the_admission_poll(tmp_path):
    """unified_radix_cache.py `_handle_prefetch_result`: `loaded_from_storage = completed_tokens
    - insert_result.prefix_len` (pages the tree already held are not counted), kept in
    `prefetch_loaded_tokens_by_reqid` with its start `operation.storage_start +
    insert_result.prefix_len`; scheduler.py `_get_new_batch_prefill_raw`, once
    `check_prefetch_progress` finds the prefetch done, `pop_prefetch_loaded_span`: `if
    loaded_tokens > 0` it becomes `req.storage_hit_length` / `storage_hit_start` (a later
    prefetch that loads nothing leaves them)."""
    engine = _engine(tmp_path)
    s, ctrl, tree = engine.scheduler, engine.ctrl, engine.scheduler.tree
    keys = list(range(200, 210))
    slots = ctrl.device.alloc(4)
    node = tree.insert(keys[:4], 0, slots, 1).last  # 2 pages matched at the query, 2 more computed since
    # backed up: a node on device without a host copy would take the read's pages as its host
    # copy and count them loaded (`UnifiedTreeCore.insert_host`, not under write_back;
    # tests/engine/test_sglang_0523_insert_host_refill.py)
    tree.set_host(node, ctrl.host.alloc(4))
    r = _queued(keys)
    anchor, matched = tree.locate(keys[:2])
    assert matched == 2
    tree.protect_host(anchor)
    r.anchor = anchor
    host = ctrl.host.alloc(6).tolist()  # (a prefetch's slots are lists: controller.alloc_storage_hit)
    r.prefetch = (2, 6, host, 0, 0)  # six pages read from page 2 on
    s._finish_prefetch(r, 5)
    assert (r.loaded_span_pages, r.loaded_span_start) == (4, 4)  # pages 2-3 were in the tree
    assert (r.storage_span_pages, r.storage_span_start) == (0, 0)  # not before the admission poll
    s._pop_loaded_span(r)
    assert (r.storage_span_pages, r.storage_span_start) == (4, 4)
    assert r.loaded_span_pages == 0
    s._pop_loaded_span(r)  # nothing new: the request keeps its span
    assert (r.storage_span_pages, r.storage_span_start) == (4, 4)
