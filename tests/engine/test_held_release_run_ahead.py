"""h41held (issue 41 investigation, session 23): a held release and the decode run-ahead.

A held release (prefetch.py `_finish_prefetch` -> `held_releases`) is the unread host slots of a
prefetch that best_effort ended at its admission poll before the read's ack was drained
(`done = 0`, the read done on the clock). SGLang 0.5.23: `check_prefetch_progress` terminates the
operation; the IO thread's last `PrefetchAck(completed_req=True)` is taken by the next
`check_hicache_events` (`_drain_storage_control_queues_impl` -> `_drain_ack_prefetch`, which
`append_host_mem_release`s `host_indices[completed_tokens:]`), and the one after it frees them
(`_drain_release`, whose count `drain_storage_control_queues` / `_sync_hicache_ready_counts`
took before `_drain_ack_prefetch` queued them). `check_hicache_events` runs at every scheduler
iteration (`get_next_batch_to_run` -> `_process_hicache_events`), decode-only ones included.

The decode run-ahead (decode.py `_decode_ahead`) stops for every other storage work in flight
(writes, queries, reads, cut reads' tails) but not for a held release: the passes it runs do not
drain, so the slots come back at the loop's next pass, after that pass's drain allocated the
next hit's host memory. Only with storage priced at 0 ns (tests, and the tests/sglang harness)
can the read be done at the poll of the pass that allocated it; at the real price
(costmodel.DISK_LATENCY_NS, >= 100 us) the poll always finds it in flight and the slots go to
`prefetch_tails`, which the run-ahead does stop for: no CLI replay makes a held release.
"""
import dataclasses

from tests.engine import helpers
from tests.engine.helpers import PS, patches_the_engine, price_at_zero, req, small_config
from tierdiag.engine.decode import DecodeSteps
from tierdiag.engine.engine import Engine
from tierdiag.engine.prefetch import StoragePrefetch
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe

pytestmark = patches_the_engine

_REAL = StoragePrefetch._drain_held_releases


class Everything(Probe):
    def __init__(self):
        super().__init__()
        self.events: list = []

    def wants(self, cls) -> bool:
        return cls is not ev.DecodeStep

    def emit(self, event) -> None:
        # (a transfer's wall_ns is the data plane's measured wall: not the model's)
        self.events.append(event._replace(wall_ns=0) if isinstance(event, ev.Transfer) else event)


def _replay(tmp_path, ahead: bool, monkeypatch):
    """r1: 12 pages in storage, 40 tokens out; r2 (8 other stored pages) arrives while r1
    decodes. Device and host 16 pages each, write_back (no backups: nothing else takes host
    memory), storage priced at 0. Returns the events, the stats and (pass, decode step) of each
    held release freed."""
    monkeypatch.setattr(DecodeSteps, "decode_ahead", ahead)
    frees: list = []

    def watching(self, *, every=False):
        had = len(self.held_releases)
        _REAL(self, every=every)
        if len(self.held_releases) < had:
            frees.append((self.prefetch_pass + 1, self.dstep))
    monkeypatch.setattr(StoragePrefetch, "_drain_held_releases", watching)
    cfg = small_config(storage_tokens=128 * PS, prefetch_threshold=PS, storage_dir=str(tmp_path / f"tier{ahead}"),
                       verify="off", prefetch_policy="best_effort", host_tokens=16 * PS, device_tokens=16 * PS,
                       write_policy="write_back")
    probe = Everything()
    engine = Engine(cfg, probe=probe)
    price_at_zero(engine, ["storage_ns"])
    r1 = req("r1", 0, list(range(1, 13)), output=40, seq=0)
    r2 = req("r2", 1.5, list(range(101, 109)), output=4, seq=1)
    for t in (r1, r2):
        helpers.store_input_pages(engine, t)
    engine.run([r1, r2])
    engine.check_invariants(idle=True)
    return probe.events, dataclasses.asdict(engine.stats), frees


def test_the_pass_by_pass_loop_frees_a_held_release_two_drains_after_its_poll(tmp_path, monkeypatch):
    """Pass 1 (t=0): r1's query, the drain allocates its 12-page hit, the read done at once; the
    admission poll ends it (best_effort) before its ack: 12 slots held. Pass 2 (r1's first
    decode step) takes the ack, pass 3's drain (before r1's second step) frees them, as SGLang's third
    `check_hicache_events` does. r2's hit then finds the host pool free: 8 pages read."""
    events, stats, frees = _replay(tmp_path, False, monkeypatch)
    assert frees[0] == (3, 1)  # pass 3's drain, before its decode step (r1's second)
    reads = [e for e in events if isinstance(e, ev.Transfer) and e.req_id == "r2" and e.kind == "prefetch"]
    assert [e.pages for e in reads] == [8]
    assert stats["skipped"] == {"prefetch_incomplete": 2}


def test_the_run_ahead_frees_a_held_release_when_the_loop_does(tmp_path, monkeypatch):
    """The run-ahead from r1's second pass on runs the passes up to r2's arrival without a
    drain: r1's 12 slots are freed at r2's pass, after its drain allocated r2's hit, which finds
    4 free pages (`host_full`, 4 of 8 read) where the pass-by-pass loop (and SGLang) read 8."""
    fast = _replay(tmp_path, True, monkeypatch)
    slow = _replay(tmp_path, False, monkeypatch)
    assert fast[2] == slow[2]
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
