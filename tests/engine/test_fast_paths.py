"""The engine's fast paths (issue 41) against the plain code they replace, kept as the reference.

- The loops' decode steps (DecodeSteps.run_decode_ahead): the passes that can only be plain decode
  steps, before the next arrival or event, run at once instead of one trip round the loop each.
- The storage re-queries (StoragePrefetch._retry_prefetches): the few entries due or unarmed
  instead of pop_ready's walk of the whole waiting queue (`_retry_prefetches_walk`).

Neither may change anything: every event the engine emits (requests, batches, evictions,
transfers, pool samples, decode steps where a probe takes them), in order, the scheduler's
state at every prefill batch and the run's stats are the reference's, on one rank and on a
deployment, open and closed loop, with and without a storage tier, under both rule sets."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, small_config
from tests.engine.test_invariants import workloads
from tierdiag.config.router import ROUTER_NAMES
from tierdiag.engine import scheduler as scheduler_module
from tierdiag.engine.arrivals import ArrivalSource
from tierdiag.engine.decode import DecodeSteps
from tierdiag.engine.engine import Engine
from tierdiag.engine.prefetch import StoragePrefetch
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe
from tests.engine.helpers import patches_the_engine

# These tests swap the engine's methods and class attributes (monkeypatch) to run the fast paths
# against the reference loop: under a compiled core, on the Python twin (test_python_twin.py).
pytestmark = patches_the_engine
from tierdiag.trace.reader import TraceRequest


_FAST_RETRY = StoragePrefetch._retry_prefetches
_WALK = StoragePrefetch._retry_prefetches_walk


class Everything(Probe):
    """Every event, in order; decode steps only when `steps` (a deployment's fast path stands
    aside for a probe that takes them, one rank's emits them in order)."""

    def __init__(self, steps: bool):
        super().__init__()
        self.steps = steps
        self.events: list = []
        self.schedulers: list = []

    def wants(self, cls) -> bool:
        return self.steps or cls is not ev.DecodeStep

    def emit(self, event) -> None:
        self.events.append(event)
        if isinstance(event, ev.BatchScheduled):
            # A prefill batch is a pass the loop runs: its rank's state then is the loop's too
            # (what the fast path keeps beside the events: the admission budget's ratio, the
            # decode clock, the re-query clock, batch_is_full)
            s = self.schedulers[event.dp_rank]
            self.events.append((s.new_token_ratio, s.dstep, s.prefetch_pass, s.batch_is_full, s._kv_base))


def _replay(reqs, cfg, ahead: bool, steps: bool, monkeypatch) -> tuple[list, dict]:
    """Replay with the fast paths (`ahead`) or the reference code."""
    monkeypatch.setattr(DecodeSteps, "decode_ahead", ahead)
    monkeypatch.setattr(StoragePrefetch, "_retry_prefetches", _FAST_RETRY if ahead else _WALK)
    return replay_everything(reqs, cfg, steps)


def replay_through_memo(reqs, cfg, memo: bool, monkeypatch, taken: list, owner, name: str, holds) -> tuple[list, dict]:
    """One replay with a memo's check `owner.name` (its own function: `holds`) answering as
    itself (`memo`) or always refusing, each answer appended to `taken`: the comparable events
    and the stats (test_refresh_memo's and test_requery_memo's replays)."""

    def patched(*args):
        got = memo and holds(*args)
        taken.append(got)
        return got

    monkeypatch.setattr(owner, name, patched)
    events, stats = replay_everything(reqs, cfg, False)
    return [_comparable(e) for e in events], stats


def replay_everything(reqs, cfg, steps: bool) -> tuple[list, dict]:
    """Every event (`Everything`) and the stats of one replay of `reqs` under `cfg`, its
    invariants checked idle (also test_refresh_memo's and test_requery_memo's replays)."""
    probe = Everything(steps)
    engine = Engine(cfg, probe=probe)
    probe.schedulers = [r.scheduler for r in engine.ranks]
    engine.run(sorted(reqs, key=lambda r: (r.arrival_ns, r.seq)))
    engine.check_invariants(idle=True)
    return probe.events, dataclasses.asdict(engine.stats)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(1, 4), router=st.sampled_from(ROUTER_NAMES),
       storage=st.sampled_from([0, 48 * PS]), device=st.integers(4, 40),
       write_policy=st.sampled_from(["write_through", "write_back"]), sessions=st.integers(0, 3),
       arrivals=st.sampled_from(["trace", "closed"]), steps=st.booleans(), mixed=st.booleans(),
       sglang=st.sampled_from(["0.5.9", "0.5.23"]))
def test_fast_paths_change_no_event(reqs, dp, router, storage, device, write_policy, sessions, arrivals, steps,
                                    mixed, sglang, tmp_path_factory, monkeypatch):
    if sessions:
        reqs = _with_sessions(reqs, sessions)
    runs = []
    for ahead in (False, True):
        cfg = small_config(dp=dp, router=router, device_tokens=device * PS, host_tokens=2 * device * PS,
                           storage_tokens=storage, write_policy=write_policy, arrivals=arrivals,
                           enable_mixed_chunk=mixed, router_balance_abs_threshold=2, sglang_rules=sglang,
                           storage_dir=str(tmp_path_factory.mktemp("ahead")) if storage else None)
        runs.append(_replay(reqs, cfg, ahead, steps, monkeypatch))
    (ref_events, ref_stats), (events, stats) = runs
    assert stats == ref_stats
    assert len(events) == len(ref_events)
    for a, b in zip(ref_events, events):
        assert _comparable(a) == _comparable(b)


def _comparable(event):
    """The event without what is measured (a copy's wall time): the rest is the model's."""
    if isinstance(event, ev.Transfer):
        return event._replace(wall_ns=0)
    return event


@pytest.mark.parametrize("dp", [1, 3])
def test_long_decodes_take_the_fast_path_and_keep_their_times(dp, monkeypatch):
    """A few long outputs, nothing arriving meanwhile: most passes are plain decode steps (the
    fast path runs them), the finish times and decode counts are the pass-by-pass loop's."""
    reqs = [TraceRequest(f"r{i}", i, i + 1, i * 1_000_000, 3 * PS + 1, 300 + 50 * i,
                         (i * 10, i * 10 + 1, i * 10 + 2, 99 + i), None) for i in range(4)]
    calls = []
    real = DecodeSteps.run_decode_ahead

    def counting(self, end, limit, wakes=None, fold=None):
        out = real(self, end, limit, wakes, fold)
        calls.append(out != end)
        return out

    monkeypatch.setattr(DecodeSteps, "run_decode_ahead", counting)
    fast = _replay(reqs, small_config(dp=dp, device_tokens=40 * PS), True, False, monkeypatch)
    assert any(calls), "no pass took the fast path"
    slow = _replay(reqs, small_config(dp=dp, device_tokens=40 * PS), False, False, monkeypatch)
    assert fast[1] == slow[1]
    assert [_comparable(e) for e in fast[0]] == [_comparable(e) for e in slow[0]]
    assert fast[1]["decode_steps"] >= 300


def _runs_by_rank(monkeypatch) -> list[tuple[int, int]]:
    """(rank, steps) of every `run_decode_ahead` call that ran steps, as the replay goes."""
    runs: list[tuple[int, int]] = []
    real = DecodeSteps.run_decode_ahead

    def counting(self, end, limit, wakes=None, fold=None):
        first = self.dstep
        out = real(self, end, limit, wakes, fold)
        if self.dstep > first:
            runs.append((self.rank, self.dstep - first))
        return out

    monkeypatch.setattr(DecodeSteps, "run_decode_ahead", counting)
    return runs


def _replay_cut_at_every_event(reqs, cfg, monkeypatch) -> tuple[list, dict]:
    """`_replay` with the fast paths, each rank's run-ahead stopped at the next event of any rank
    (as Deployment.run stopped it up to session 32) instead of at its own rank's next event."""
    from tierdiag.engine import deployment

    own_limit = deployment._ahead_limit
    deployments: list = []
    real_init = deployment.Deployment.__init__

    def keep(self, *args, **kw):
        real_init(self, *args, **kw)
        deployments.append(self)

    def every_rank(src, now, closed, has_next, src_next, _own):
        # the next event of any rank as the rank's own (the shared heap's head)
        return own_limit(src, now, closed, has_next, src_next, deployments[-1].events)

    with monkeypatch.context() as mp:
        mp.setattr(deployment.Deployment, "__init__", keep)
        mp.setattr(deployment, "_ahead_limit", every_rank)
        return _replay(reqs, cfg, True, False, monkeypatch)


def test_a_rank_runs_ahead_past_another_rank_s_events(monkeypatch):
    """Rank 0 decodes a long output while rank 1 prefills two long prompts (round_robin: long,
    mid on rank 0; big, big2 on rank 1, all at 0). Rank 1's events (a prefill's end, its
    backups' acks, its finishes) were each a stop of rank 0's run-ahead, a trip round the loop
    and a pass of rank 0 at the step that crossed it; now only rank 0's own events (its
    requests' finishes) and arrivals stop it. Every event, in order, and the stats are the
    pass-by-pass loop's, and the loop's that stopped at every event."""
    reqs = [TraceRequest("long", 0, 1, 0, 4 * PS + 1, 80, (1, 2, 3, 4, 10**9), None),
            TraceRequest("big", 1, 2, 0, 30 * PS + 1, 30, tuple(range(1000, 1030)) + (10**9 + 1,), None),
            TraceRequest("mid", 2, 3, 0, 3 * PS + 1, 20, (2000, 2001, 2002, 10**9 + 2), None),
            TraceRequest("big2", 3, 4, 0, 30 * PS + 1, 30, tuple(range(3000, 3030)) + (10**9 + 3,), None)]
    cfg = small_config(dp=2, router="round_robin", device_tokens=64 * PS, host_tokens=128 * PS)
    runs = _runs_by_rank(monkeypatch)
    own = _replay(reqs, cfg, True, False, monkeypatch)
    own_runs = list(runs)
    runs.clear()
    every = _replay_cut_at_every_event(reqs, cfg, monkeypatch)
    every_runs = list(runs)
    passes = _replay(reqs, cfg, False, False, monkeypatch)
    assert own[1] == every[1] == passes[1]
    assert [_comparable(e) for e in own[0]] == [_comparable(e) for e in every[0]] == \
        [_comparable(e) for e in passes[0]]
    rank0_own = [steps for rank, steps in own_runs if rank == 0]
    rank0_every = [steps for rank, steps in every_runs if rank == 0]
    # the same steps ahead, in fewer runs: rank 1's events cut rank 0's only where they stop it all
    assert sum(rank0_own) == sum(rank0_every) >= 70, (rank0_own, rank0_every)
    assert len(rank0_own) < len(rank0_every), (rank0_own, rank0_every)
    assert [steps for rank, steps in own_runs if rank == 1] == [steps for rank, steps in every_runs if rank == 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(2, 8), router=st.sampled_from(ROUTER_NAMES),
       storage=st.sampled_from([0, 48 * PS]), device=st.integers(4, 40),
       write_policy=st.sampled_from(["write_through", "write_back"]), sessions=st.integers(0, 2),
       arrivals=st.sampled_from(["trace", "closed"]), mixed=st.booleans(),
       sglang=st.sampled_from(["0.5.9", "0.5.23"]))
def test_runs_ahead_past_other_ranks_events_change_no_event(reqs, dp, router, storage, device, write_policy,
                                                           sessions, arrivals, mixed, sglang, tmp_path_factory,
                                                           monkeypatch):
    """A rank's run-ahead stopped only by its own events and the arrivals, on 2-8 ranks, every
    router, small devices (evictions, retractions, ranks stuck for memory: they wake at every
    step run ahead), storage tiers (another rank's writes and reads on the shared tier, its
    storage acks and wakes), write policies (the second backup flush of an idle rank), both rule
    sets, open and closed loop: every event, in order, and the stats are the pass-by-pass
    loop's, and the loop's that stopped each run at every rank's next event."""
    if sessions:
        reqs = _with_sessions(reqs, sessions)
    runs = []
    for mode in ("passes", "own", "every"):
        cfg = small_config(dp=dp, router=router, device_tokens=device * PS, host_tokens=2 * device * PS,
                           storage_tokens=storage, write_policy=write_policy, arrivals=arrivals,
                           enable_mixed_chunk=mixed, router_balance_abs_threshold=2, sglang_rules=sglang,
                           storage_dir=str(tmp_path_factory.mktemp("ahead")) if storage else None)
        if mode == "every":
            runs.append(_replay_cut_at_every_event(reqs, cfg, monkeypatch))
        else:
            runs.append(_replay(reqs, cfg, mode == "own", False, monkeypatch))
    (ref_events, ref_stats) = runs[0]
    for events, stats in runs[1:]:
        assert stats == ref_stats
        assert [_comparable(e) for e in events] == [_comparable(e) for e in ref_events]



def _with_sessions(reqs, sessions: int):
    """`reqs` with every odd one a turn of one of `sessions` sessions (the even ones without)."""
    return [TraceRequest(r.req_id, r.seq, r.line, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens,
                         r.priority, r.extra_key, session=f"s{r.seq % sessions}" if r.seq % 2 else None)
            for r in reqs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), sessions=st.integers(1, 4), read_ahead=st.integers(0, 5), device=st.integers(4, 40),
       storage=st.sampled_from([0, 48 * PS]), sglang=st.sampled_from(["0.5.9", "0.5.23"]))
def test_closed_loop_steps_ahead_with_a_short_read_ahead(reqs, sessions, read_ahead, device, storage, sglang,
                                                         tmp_path_factory, monkeypatch):
    """A closed loop with sessions runs its plain decode steps at once too (issue 41: a synth
    replay's steps were each a trip round the loop). The read-ahead is what could tell: a line
    read ahead is late or not by the clock it is read at, and the loop reads at every wake while
    it has room (`ArrivalSource.reads_ahead`). With a read-ahead of a few lines it fills and
    drains all through the replay; every event and the stats stay the pass-by-pass loop's."""
    monkeypatch.setattr(scheduler_module, "ArrivalSource", functools.partial(ArrivalSource, read_ahead=read_ahead))
    reqs = _with_sessions(reqs, sessions)
    runs = []
    for ahead in (False, True):
        cfg = small_config(device_tokens=device * PS, host_tokens=2 * device * PS, storage_tokens=storage,
                           arrivals="closed", sglang_rules=sglang,
                           storage_dir=str(tmp_path_factory.mktemp("ahead")) if storage else None)
        runs.append(_replay(reqs, cfg, ahead, True, monkeypatch))
    (ref_events, ref_stats), (events, stats) = runs
    assert stats == ref_stats
    assert [_comparable(e) for e in events] == [_comparable(e) for e in ref_events]


def test_a_closed_loop_with_sessions_takes_the_fast_path(monkeypatch):
    """Sessions in a closed loop, long outputs: the decode steps between a turn's release and
    the next finish run at once (before, a closed loop that had met a session ran every pass
    round the loop), with the turns' releases and every event as the loop's."""
    reqs = _with_sessions([TraceRequest(f"r{i}", i, i + 1, i * 1_000_000, 3 * PS + 1, 200 + 40 * i,
                                        (i * 10, i * 10 + 1, i * 10 + 2, 99 + i), None) for i in range(8)], 2)
    calls = []
    real = DecodeSteps.run_decode_ahead

    def counting(self, end, limit, wakes=None, fold=None):
        out = real(self, end, limit, wakes, fold)
        calls.append(out != end and self.arrivals.num_sessions > 0)
        return out

    monkeypatch.setattr(DecodeSteps, "run_decode_ahead", counting)
    cfg = small_config(device_tokens=40 * PS, arrivals="closed")
    fast = _replay(reqs, cfg, True, True, monkeypatch)
    assert any(calls), "no decode step ran ahead once a session was met"
    slow = _replay(reqs, cfg, False, True, monkeypatch)
    assert fast[1] == slow[1]
    assert [_comparable(e) for e in fast[0]] == [_comparable(e) for e in slow[0]]


@st.composite
def bursts(draw):
    """Requests arriving together onto a small device, sharing a few prefixes some earlier
    request left in storage: a queue that waits many passes, its storage re-queries firing."""
    n = draw(st.integers(4, 30))
    convs = draw(st.integers(1, 4))
    reqs = []
    for i in range(n):
        c = draw(st.integers(0, convs - 1))
        shared = tuple(c * 1000 + p for p in range(draw(st.integers(0, 8))))
        own = tuple(500_000 + i * 100 + p for p in range(draw(st.integers(0, 3))))
        t_ms = draw(st.sampled_from([0, 0, 0, 1, 5, 200]))
        reqs.append(TraceRequest(f"r{i}", i, i + 1, t_ms * 1_000_000, (len(shared) + len(own)) * PS + 1,
                                 draw(st.integers(1, 300)), shared + own + (900_000 + i,), None))
    return sorted(reqs, key=lambda r: (r.arrival_ns, r.seq))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=bursts(), dp=st.integers(1, 2), device=st.integers(12, 30), host=st.integers(0, 30),
       policy=st.sampled_from(["fcfs", "lpm"]), prefetch=st.sampled_from(["best_effort", "wait_complete", "timeout"]))
def test_storage_requeries_fire_as_the_walk_fires_them(reqs, dp, device, host, policy, prefetch, tmp_path_factory,
                                                       monkeypatch):
    runs = []
    for ahead in (False, True):
        cfg = small_config(dp=dp, device_tokens=device * PS, host_tokens=(device + host) * PS, storage_tokens=200 * PS,
                           storage_dir=str(tmp_path_factory.mktemp("requery")), schedule_policy=policy,
                           prefetch_policy=prefetch, write_policy="write_through", sglang_rules="0.5.23")
        runs.append(_replay(reqs, cfg, ahead, False, monkeypatch))
    (ref_events, ref_stats), (events, stats) = runs
    assert stats == ref_stats
    assert [_comparable(e) for e in events] == [_comparable(e) for e in ref_events]


def test_a_chunked_prompt_on_a_slow_link_keeps_its_backup_flushes(monkeypatch):
    """0.5.23 queues a chunk stash's backup for the flush after the next one (`stash_chunked_request`,
    then `flush_pending_backups`), and the passes after a prompt's last chunk are plain decode
    steps: the fast path stands aside while a backup is queued (the next pass's `schedule_pass` flushes it
    at its head), so with a link slow enough that no ack stops it first, the copies, their acks and
    every decode step are still the pass-by-pass loop's."""
    from tierdiag.engine.controller import CacheController

    real = CacheController._copy_ns
    # A slow device->host link: a backup's ack comes after the next decode steps, so no event
    # stops the fast path before the pass that must flush.
    monkeypatch.setattr(CacheController, "_copy_ns", lambda self, *a, **k: 200 * real(self, *a, **k))
    reqs = [TraceRequest("long", 0, 1, 0, 12 * PS + 1, 400, tuple(range(100, 113)), None)]
    cfg = small_config(device_tokens=64 * PS, host_tokens=128 * PS, max_prefill_tokens=4 * PS,
                       write_policy="write_through", sglang_rules="0.5.23")
    fast = _replay(reqs, cfg, True, False, monkeypatch)
    slow = _replay(reqs, cfg, False, False, monkeypatch)
    assert any(isinstance(e, ev.Transfer) and e.kind == "backup" for e in slow[0]), "no backup to flush"
    assert fast[1] == slow[1]
    assert [_comparable(e) for e in fast[0]] == [_comparable(e) for e in slow[0]]


@pytest.mark.parametrize("closed", [False, True])
def test_a_queue_behind_a_full_batch_takes_the_fast_path(closed, monkeypatch):
    """Requests keep arriving while the running batch fills the device: admission is shut
    (`batch_is_full`), so every pass until a finish is a plain decode step with a queue. The
    fast path runs those steps with the queue waiting and the arrivals and copies' acks between
    them folded in (`run_decode_ahead`'s `fold`); every event, the finish times and the stats
    are the pass-by-pass loop's."""
    reqs = [TraceRequest(f"r{i}", i, i + 1, i * 3_000_000, 6 * PS + 1, 150 + 20 * (i % 4),
                         tuple(1000 * i + j for j in range(7)), None) for i in range(24)]
    calls = []
    real = DecodeSteps._decode_ahead

    def watching(self, end, limit, wakes=None):
        queued = bool(self.waiting)
        out = real(self, end, limit, wakes)
        calls.append(queued and out != end)
        return out

    monkeypatch.setattr(DecodeSteps, "_decode_ahead", watching)
    cfg = small_config(device_tokens=24 * PS, arrivals="closed" if closed else "trace")
    fast = _replay(reqs, cfg, True, True, monkeypatch)
    assert any(calls), "no decode step ran ahead with requests waiting"
    slow = _replay(reqs, cfg, False, True, monkeypatch)
    assert fast[1] == slow[1]
    assert [_comparable(e) for e in fast[0]] == [_comparable(e) for e in slow[0]]
