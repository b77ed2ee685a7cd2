"""Why the decode steps' run-ahead stops (issue 41, the storage row): every call of
`DecodeSteps._decode_ahead` that returns at once, by its first cause, and the scheduling passes
the loop ran (`schedule_pass` calls), counted on the engine core's Python twin
(TIERDIAG_PURE_ENGINE=1: the compiled core cannot be wrapped). A storage replay ran ~2.4x the
passes of a plain one; the causes say which of its stops are storage work.

    .venv/bin/python benchmarks/storage_passes.py [--trace FILE] [--requests N] [--storage-tokens N]
                                                  [--code CHECKOUT]

`--code`: count the engine of another checkout (a base, for a before/after).

Causes, in the order the run-ahead checks them: `no_running/chunked`; `waiting:*` (requests
wait and admission is open, reopens or has a query to run); `limit` (the next arrival or event
at the pass), `mem` (a step that needs eviction), `finish` (one finishing at the next step); `backup` (a backup queued for the next pass's
flush); then, where re-queries are armed or storage work is in flight, what the next pass's
storage half would do: `query` (a query's drain), `reading`, `tails`, `retry:armed`,
`retry:head`, `retry:due` (a re-query needs that pass), `writes:unstarted`, `writes:act` (a write
lands and is released), `held` (a held release due), `quiet` (nothing: the run-ahead goes on
since session 23, `prefetch.storage_quiet`). `:ran` counts the calls that ran steps.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

os.environ["TIERDIAG_PURE_ENGINE"] = "1"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def cause(s, end: int, limit: int | None) -> str:
    """The first reason `_decode_ahead` would stop at `end` (its checks, in its order)."""
    ctrl = s.ctrl
    if not s.running or s.chunked is not None:
        return "no_running/chunked"
    if s.waiting:
        if not s.batch_is_full:
            return "waiting:admission_open"
        if s._admission_reopens:
            return "waiting:reopens"
        if s.unqueried:
            return "waiting:unqueried"
    if limit is not None and end >= limit:
        return "limit"
    if ctrl.device.free_pages < len(s.running):
        return "mem"
    due = [k for k in s._finish_steps if k > s.dstep and k in s._finish_due]
    if due and min(due) == s.dstep + 1:
        return "finish"  # a request finishes at the next step (an event the loop runs)
    if ctrl.backup_queue or ctrl.backup_later:
        return "backup"
    retry = bool(s.waiting and len(s.requeries))
    if not (ctrl.storage_writes or s.unallocated or s.query_occupied or s.reading or ctrl.prefetch_tails or retry):
        return "no_storage_work"
    if s.storage_pass_done_ns >= 0:
        return "stash_mark"  # (storage_quiet stops at a chunk stash's mark)
    if s.unallocated or s.query_occupied:
        return "query"
    if s.reading:
        return "reading"
    if ctrl.prefetch_tails:
        return "tails"
    step = s.prefetch_pass + 1
    if retry:
        armed = [due for _, due in s.requeries.items()]
        if -1 in armed:
            return "retry:armed"
        if s.requeries.due(s.waiting[0]) is not None:
            return "retry:head"
        if any(0 <= due <= step for due in armed):
            return "retry:due"
    if any(w.start < 0 for w in ctrl.storage_writes):
        return "writes:unstarted"
    if any(w.release_pass <= step and w.end <= end for w in ctrl.storage_writes):
        return "writes:act"
    if any(due <= step for due, _ in s.held_releases):
        return "held"
    return "quiet"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--storage-tokens", type=int, default=50_000_000)
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose engine is counted")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.code.resolve()))
    if args.requests is not None and args.requests < 1:
        ap.error("--requests must be at least 1")
    if args.storage_tokens < 0:
        ap.error("--storage-tokens must be 0 or more")

    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine import compiled
    from tierdiag.engine import decode
    from tierdiag.engine import scheduler as scheduler_module
    from tierdiag.engine.engine import Engine
    from tierdiag.trace.reader import ReadReport, read_trace

    assert not compiled.is_compiled(), "the Python twin is needed (TIERDIAG_PURE_ENGINE=1)"
    cfg = EngineConfig(**({"storage_tokens": args.storage_tokens} if args.storage_tokens else {}))
    reqs = list(read_trace(args.trace, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
    reqs = reqs[:args.requests] if args.requests else reqs
    counts: collections.Counter = collections.Counter()
    real_ahead = decode.DecodeSteps._decode_ahead
    real_pass = scheduler_module.Scheduler.schedule_pass

    def ahead(self, end, limit, wakes=None):
        why = cause(self, end, limit)
        out = real_ahead(self, end, limit, wakes)
        counts[why + (":ran" if out != end else "")] += 1
        return out

    def one_pass(self, now):
        counts["(schedule_pass)"] += 1
        return real_pass(self, now)

    scheduler_module.Scheduler._decode_ahead = ahead
    scheduler_module.Scheduler.schedule_pass = one_pass
    with tempfile.TemporaryDirectory() as folder:
        stats = Engine(cfg, probe=None, storage_dir=folder).run(reqs)
    counts["(decode steps)"] = stats.decode_steps
    print(f"| {args.trace.name} requests={len(reqs)} storage_tokens={args.storage_tokens} | count |")
    print("|---|---|")
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"| {key} | {n:,} |")


if __name__ == "__main__":
    main()
