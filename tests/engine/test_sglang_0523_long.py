"""What issue 43's long mode (the conversation trace's first 2,000 requests through SGLang 0.5.23's
own Scheduler, tests/sglang/test_scheduler_long.py) found in the engine, narrated with the SGLang
functions it restates: when a write-through backup's copy starts, and when its node unlocks.

Pools: device 16 pages, host 64 pages of 64 tokens (helpers.small_config).
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import req
from tests.engine.test_sglang_0523_decode import pages, run_batches
from tierdiag.engine.engine import Engine


def _chunked_backups(**kw):
    """a: 8 pages and 1 token, in chunks of 4 pages (a 256-token budget): batch 1 computes pages
    0-3, batch 2 pages 4-7, batch 3 the last token. Returns the batches' ends and the backups."""
    a = req("a", 0, pages(1, 8), output=1)
    engine, probe = run_batches([a], max_prefill_tokens=4 * helpers.PS, write_policy="write_through", **kw)
    ends = [b.t_end_ns for b in probe.batches]
    backups = [(t.t_start_ns, t.t_end_ns, t.pages) for t in probe.transfers if t.kind == "backup"]
    return engine, ends, backups


def test_a_chunks_backup_is_copied_with_the_next_batchs_backups():
    """0.5.23: `Scheduler.get_next_batch_to_run` -> `stash_chunked_request` -> `cache_unfinished_req`
    inserts a chunk at the start of the pass after the batch that computed it; the insert's
    write-through backup (`UnifiedRadixCache._execute_kv_backup`) is queued with
    `cache_controller.write(..., flush=False)`: host room is made and the node locked at once, the
    copy not started. The queue goes at `flush_pending_backups`, at the end of the batch that pass
    runs (`Scheduler.process_batch_result`; a pass that runs nothing: the next pass's
    `writing_check`), as one copy (`CacheOperation.merge_ops`) with one `HiCacheAck`: every node
    in it stays locked until that copy's end. So a's first chunk (pages 0-3, computed by batch 1)
    starts its copy when batch 2 ends, and its second when batch 3 ends. The long mode found it at
    conversation[:2000] (tests/sglang/test_scheduler_long.py, chunk_host seed 1: a chunk's pages
    unlocked a batch early in the engine, so a request was admitted 0.78 ms before SGLang's)."""
    engine, ends, backups = _chunked_backups()
    assert len(ends) == 3
    assert [(start, n) for start, _, n in backups] == [(ends[1], 4), (ends[2], 4)]
    assert all(node.lock_ref == 0 for node in _nodes(engine.tree.root))  # the last flush's ack came


def test_switched_back_each_backup_starts_at_its_insert():
    """0.5.9 (`CacheController.write` -> `start_writing` at once, one ack a node), the rule switched
    back on 0.5.23 (`sglang_switched_back=backups_flush_per_batch`): the chunk's copy starts at
    its insert, the end of the batch that computed it."""
    _, ends, backups = _chunked_backups(sglang_switched_back="backups_flush_per_batch")
    assert [(start, n) for start, _, n in backups] == [(ends[0], 4), (ends[1], 4)]


@pytest.mark.parametrize("dp", [1, 2])
def test_backups_queued_by_the_last_batch_are_copied_when_the_scheduler_idles(dp):
    """The last batch's backups (nothing runs after it) are flushed by its result processing all
    the same: the idle pass copies them, and their ack unlocks every node (also per rank under
    --dp, engine/deployment.py's loop)."""
    a = req("a", 0, pages(1, 3), output=1)
    b = req("b", 0, pages(100, 3), output=1)
    engine, probe = run_batches([a, b], write_policy="write_through", dp=dp)
    assert sum(t.pages for t in probe.transfers if t.kind == "backup") == 6
    for tree in _trees(engine):
        assert all(node.lock_ref == 0 for node in _nodes(tree.root))


def _trees(engine):
    return [rank.tree for rank in engine.ranks]


def _nodes(node):
    stack = [node]
    while stack:
        n = stack.pop()
        if n.parent is not None:
            yield n
        stack.extend(n.children.values())


@helpers.patches_the_engine  # replaces the scheduler's _new_prefill
def test_a_pass_that_runs_nothing_while_requests_wait_keeps_the_new_token_ratio():
    """`Scheduler.event_loop_normal`: a pass with no batch calls `on_idle`, which resets
    `new_token_ratio` (`new_token_ratio_tracker.reset()`) only when `is_fully_idle`: nothing running,
    no chunked request, and no waiting request. With requests waiting (for memory, or for a
    backup's ack) it returns before the reset, so the ratio the decode steps decayed stays for the
    next admission. The engine reset it at every pass that ran nothing; on the conversation
    trace's first 2,000 at its rate that admitted one request fewer beside a chunk (step 1288 of
    issue 43's long mode, 2,080 of 3,368 steps and 1,249 TTFTs apart after it: 0 since)."""
    engine = Engine(helpers.small_config())
    sched = engine.scheduler
    sched._arrive(req("a", 0, pages(1, 2)), 0, 0, None)
    assert sched.waiting
    sched._new_prefill = lambda now: None  # nothing can be admitted this pass
    sched.new_token_ratio = 0.3
    assert sched.schedule_pass(0) is None
    assert sched.new_token_ratio == 0.3


def test_the_fully_idle_scheduler_resets_the_new_token_ratio():
    """... and fully idle (`is_fully_idle`: the last request finished, none waiting) it resets it:
    a request that decoded (the ratio decays a step at a time) leaves the ratio at its initial
    value once the run is over."""
    from tierdiag.engine.schedule_common import INIT_NEW_TOKEN_RATIO

    engine, _ = run_batches([req("a", 0, pages(1, 2), output=50)])
    assert engine.scheduler.new_token_ratio == INIT_NEW_TOKEN_RATIO
