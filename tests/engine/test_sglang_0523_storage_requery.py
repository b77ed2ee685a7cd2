"""SGLang 0.5.23's storage re-query after a queued request lost part of its prefix, narrated.

Found by the scheduler harness's storage tier (issue 43; tests/sglang/sglang0523_storage.py):
on `stored` seed 0 (page 64, fcfs, write_through) st0-18, a repeat of an earlier prompt, matched
its prefix on device and host at arrival, waited while eviction took it off both tiers, and was
admitted by SGLang with 320 storage tokens where the engine recomputed them: at admission SGLang's
`Scheduler._prefetch_after_device_hit_loss` saw the match shorter than at its storage query and
queried storage again.
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req


def _queued(engine: Engine, name: str, keys: list[int], seq: int = 0) -> Req:
    r = Req(req(name, 0, keys, seq=seq), 0)
    r.keys = list(keys)
    r.max_match_pages = len(keys)
    return r


def _recording(monkeypatch, sched) -> list:
    queried = []
    monkeypatch.setattr(sched, "_start_prefetch", lambda r, now: queried.append((r.req_id, r.storage_hit_end)))
    return queried


@helpers.patches_the_engine  # replaces the scheduler's _start_prefetch
def test_a_shorter_match_at_admission_queries_storage_again_and_skips_the_pass(monkeypatch):
    """scheduler.py `_prefetch_after_device_hit_loss` (0.5.23), called by
    `_get_new_batch_prefill_raw` after `check_prefetch_progress` and `init_next_round_input`:
    `previous_match_len = req.storage_prefetch_last_match_len` (device + host tokens matched at
    the last `_prefetch_kvcache`); if the match now is shorter, `_retry_storage_prefetch(req)`
    (attempts + 1, `_prefetch_kvcache(req)` without a known end: `prefetch_from_storage` first
    cancels an armed re-query) and the request is skipped this pass (`continue`)."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS))
    s = engine.scheduler
    queried = _recording(monkeypatch, s)
    r = _queued(engine, "r", list(range(100, 108)))
    r.storage_last_match = 6  # six pages matched at its query; the tree is empty now
    r.storage_hit_end = 7
    s._arm_prefetch_retry(r)  # a re-query armed earlier: cancelled by the new query
    assert s._prefetch_after_hit_loss(r, 0) is True
    assert queried == [("r", None)] and r.prefetch_retries == 1
    assert s.requeries.due(r) is None


@helpers.patches_the_engine  # replaces the scheduler's _start_prefetch
def test_no_requery_without_a_loss_before_a_query_or_past_the_cap(monkeypatch):
    """The same function's guards: `if not previous_match_len` (no query yet, or it matched
    nothing) and `if current_match_len >= previous_match_len` return False; past
    `hicache_storage_prefetch_retry_max_attempts` (8) "the shorter live match is admitted as is"
    (`storage_prefetch_last_match_len = current_match_len`). 0.5.9 has no re-query."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS))
    s = engine.scheduler
    queried = _recording(monkeypatch, s)
    r = _queued(engine, "r", list(range(100, 108)))
    assert s._prefetch_after_hit_loss(r, 0) is False  # never queried (0)
    r.storage_last_match = 0
    assert s._prefetch_after_hit_loss(r, 0) is False
    r.storage_last_match, r.prefetch_retries = 3, 8
    assert s._prefetch_after_hit_loss(r, 0) is False and r.storage_last_match == 0
    assert queried == []
    old = Engine(helpers.small_config(storage_tokens=128 * PS, sglang_rules="0.5.9")).scheduler
    r.storage_last_match, r.prefetch_retries = 3, 0
    assert old._prefetch_after_hit_loss(r, 0) is False


@helpers.patches_the_engine  # replaces the scheduler's _start_prefetch
def test_the_query_records_the_match_it_was_made_with(tmp_path, monkeypatch):
    """`_prefetch_kvcache` sets `req.storage_prefetch_last_match_len = prefix_len +
    host_hit_length` at every query, before its gate: b matches a's 8 pages on device at arrival,
    so its query records 8, and with nothing evicted while it waits it is not queried again."""
    trace = [req("a", 0, list(range(1, 9))), req("b", 500, list(range(1, 9)) + [50, 51, 52, 53])]
    cfg = helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS, storage_dir=str(tmp_path / "st"))
    engine = Engine(cfg, probe=helpers.Collect())
    s = engine.scheduler
    seen, start = [], s._start_prefetch

    def query(r, now):
        start(r, now)
        seen.append((r.req_id, r.storage_last_match))

    monkeypatch.setattr(s, "_start_prefetch", query)
    engine.run(helpers.numbered(trace))
    assert seen == [("a", 0), ("b", 8)]
    assert engine.probe.records["b"].device_hit_tokens == 8 * PS
    engine.check_invariants(idle=True)
