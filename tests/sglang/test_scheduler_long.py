"""What the long mode (TIERDIAG_HARNESS_LONG=1: the conversation trace's first 2,000 requests at
its rate and at 4x) found, on workloads small enough for CI (issue 43; tests/sglang/README.md,
"The long mode").

- The chunk stash's window (a harness artefact, fixed in sglang0523_scheduler.py): SGLang
  checkpoints a chunk into the tree at the start of the next pass (`get_next_batch_to_run` ->
  `stash_chunked_request`), the engine at the end of the batch that computed it
  (`Scheduler._cache_unfinished`): the same instant, the same tree, but the harness counted
  SGLang's host evictions from that insert's backup in the next step's window. conversation[:100]
  x1 differed from step 69 on; these workloads differed in 37-38 of 45-48 steps.
- The merged backup flush (an engine modelling error, fixed: Controller.flush_backups, narrated in
  tests/engine/test_sglang_0523_long.py): SGLang queues a write-through backup without submitting
  it (`_execute_kv_backup`: `cache_controller.write(..., flush=False)`) and submits the queue at
  the end of the batch's result processing (`Scheduler.process_batch_result` ->
  `UnifiedRadixCache.flush_pending_backups`) as ONE copy (`CacheOperation.merge_ops`) with one ack:
  a chunk's backup, queued by the stash at a pass's start, waits for the end of the batch that
  pass runs and unlocks with that batch's own backups. The engine copied and acknowledged each
  node at its insert: seed 1 admitted a request 0.78 ms early (step 14; 17 of 24 TTFTs moved).
  The harness now prices a copy when SGLang submits it (`start_writing`), not when it is queued.
"""

from __future__ import annotations

import pytest

from tests.sglang import scheduler_harness as H

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"chunk_host-s{s}") for s in range(4)])
def test_chunk_backups_agree_with_sglang(sglang_0523_scheduler, seed):
    """Chunked prompts whose chunk inserts evict host leaves: every prefill step (its eviction
    window included) and every request agree with SGLang 0.5.23's Scheduler."""
    rep = H.run_both(sglang_0523_scheduler, H.chunk_host(seed), ())
    if not rep.clean:
        pytest.fail(rep.summary(), pytrace=False)
