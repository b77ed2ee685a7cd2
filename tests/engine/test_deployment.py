"""Data-parallel deployments (engine/deployment.py; docs/contract.md "Deployments"): N ranks
behind a router, on one clock, sharing one storage tier.

Narrated scenarios first (what a rank holds, where the router sends a request, what the row says
about both), then a property test over random workloads, routers and rank counts: every rank's
pools, tree and locks are sound once idle, tokens are conserved, ids unique across ranks.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, Collect, patches_the_engine, small_config
from tests.engine.test_invariants import workloads
from tierdiag.config.router import ROUTER_NAMES
from tierdiag.engine.engine import Engine
from tierdiag.errors import ConfigError
from tierdiag.native import cplane
from tierdiag.probes import events as ev
from tierdiag.trace.reader import TraceRequest

MS = 1_000_000


class CollectAll(Collect):
    """Collect, plus batches and pool samples."""

    def __init__(self):
        super().__init__()
        self.batches: list[ev.BatchScheduled] = []
        self.samples: list[ev.PoolSample] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.BatchScheduled):
            self.batches.append(event)
        elif isinstance(event, ev.PoolSample):
            self.samples.append(event)


def turn(req_id: str, seq: int, t_ms: float, pages: tuple[int, ...], *, session: str | None = None,
         output: int = 4) -> TraceRequest:
    """A request of `pages` (one hash id a page) and one more token (its own page key)."""
    return TraceRequest(req_id=req_id, seq=seq, line=seq + 1, arrival_ns=int(t_ms * MS),
                        input_len=len(pages) * PS + 1, output_len=output,
                        hash_ids=pages + (10**9 + seq,), tokens=None, session=session)


def replay(trace: list[TraceRequest], **kw) -> tuple[Engine, CollectAll]:
    probe = CollectAll()
    engine = Engine(small_config(**kw), probe=probe)
    engine.run(trace)
    engine.check_invariants(idle=True)
    return engine, probe


# --- narrated scenarios -------------------------------------------------------------------------
def test_session_router_keeps_each_session_on_one_rank_and_its_second_turn_hits_device():
    """Two sessions with distinct 8-page prefixes, two turns each, `--dp 2 --router session`:
    the session router hashes the session id (routing/affinity.py), so each session's turns go
    to one rank, and the second turn finds its first turn's pages on that rank's device."""
    a, b = tuple(range(1, 9)), tuple(range(101, 109))
    trace = [turn("a1", 0, 0, a, session="alice"), turn("b1", 1, 0, b, session="bob"),
             turn("a2", 2, 500, a + (9,), session="alice"), turn("b2", 3, 500, b + (109,), session="bob")]
    _, probe = replay(trace, dp=2, router="session", device_tokens=64 * PS, host_tokens=128 * PS)
    r = probe.records
    assert r["a1"].dp_rank == r["a2"].dp_rank and r["b1"].dp_rank == r["b2"].dp_rank
    for second in ("a2", "b2"):
        assert r[second].device_hit_tokens == 8 * PS, "the second turn reuses its whole first turn on device"
        assert r[second].arrival_device_tokens == 8 * PS, "and its rank held it at arrival"
        assert r[second].best_rank == r[second].dp_rank
        assert r[second].route_branch is not None and r[second].route_reason


def test_round_robin_alternates_and_best_rank_names_the_rank_that_held_the_prefix():
    """round_robin sends request 0 to rank 0, 1 to rank 1, 2 to rank 0, ... A prefix computed on
    rank 0 by request p0; its follow-up (request 1) goes to rank 1, which holds none of it: the row
    says so (arrival_device_tokens 0) and names rank 0 as best_rank with the 8 pages on device."""
    p = tuple(range(1, 9))
    trace = [turn("p0", 0, 0, p), turn("p1", 1, 500, p + (9,)), turn("p2", 2, 1000, p + (10,))]
    _, probe = replay(trace, dp=2, router="round_robin")
    r = probe.records
    assert [r[k].dp_rank for k in ("p0", "p1", "p2")] == [0, 1, 0]
    assert r["p1"].arrival_device_tokens == 0 and r["p1"].device_hit_tokens == 0
    assert (r["p1"].best_rank, r["p1"].best_rank_device_tokens, r["p1"].best_rank_host_tokens) == (0, 8 * PS, 0)
    # p2 is back on rank 0, which holds the prefix: best_rank is its own rank (ties too).
    assert (r["p2"].dp_rank, r["p2"].best_rank, r["p2"].arrival_device_tokens) == (0, 0, 8 * PS)
    ranks = json.loads(r["p1"].ranks_json)
    assert [x["rank"] for x in ranks] == [0, 1]
    assert (ranks[0]["device_tokens"], ranks[1]["device_tokens"]) == (8 * PS, 0)
    assert [x["in_flight"] for x in ranks] == [0, 0], "p0 finished before p1 arrived"
    assert r["p1"].route_branch == "turn"


def test_a_page_rank_0_wrote_to_storage_is_prefetched_by_rank_1():
    """One storage tier, shared: rank 0 computes an 8-page prefix, write_through backs it up to
    host and on to storage; the same prefix, routed to rank 1 (round_robin) a second later, is not
    in rank 1's tree but is in the tier: rank 1 prefetches it (storage_hit_tokens) instead of
    recomputing. Page keys name their whole prefix, so the tier's key is the content."""
    p = tuple(range(1, 9))
    trace = [turn("w", 0, 0, p), turn("r", 1, 1000, p + (9,))]
    _, probe = replay(trace, dp=2, router="round_robin", storage_tokens=64 * PS, prefetch_threshold=0,
                      load_back_threshold=0)
    w, r = probe.records["w"], probe.records["r"]
    assert (w.dp_rank, r.dp_rank) == (0, 1)
    assert r.arrival_device_tokens == 0 and r.arrival_host_tokens == 0, "rank 1 never computed it"
    assert r.storage_hit_tokens == 8 * PS
    assert r.computed_tokens == PS + 1, "only its own 9th page and last token"
    writes = [t for t in probe.transfers if t.kind == "storage_write"]
    prefetches = [t for t in probe.transfers if t.kind == "prefetch"]
    assert {t.dp_rank for t in writes if t.t_end_ns <= r.arrival_ns} == {0}, "what was in the tier when r came"
    assert [(t.dp_rank, t.pages) for t in prefetches] == [(1, 8)]


def test_ranks_share_one_storage_bandwidth():
    """Two ranks write their own prefixes to the one tier at the same instant: the tier's clock
    (StorageTier.free_ns) is one, so the second write starts when the first ends, whichever rank
    issued it; no two storage transfers overlap."""
    trace = [turn("a", 0, 0, tuple(range(1, 9))), turn("b", 1, 0, tuple(range(101, 109)))]
    _, probe = replay(trace, dp=2, router="round_robin", storage_tokens=64 * PS)
    disk = sorted((t for t in probe.transfers if t.kind in ("storage_write", "prefetch")), key=lambda t: t.t_start_ns)
    assert {t.dp_rank for t in disk} == {0, 1}
    for before, after in zip(disk, disk[1:]):
        assert after.t_start_ns >= before.t_end_ns, f"{before} and {after} overlap on the one storage bandwidth"


def test_one_rank_writes_rank_0_and_no_routing_columns():
    trace = [turn("a", 0, 0, (1, 2, 3)), turn("b", 1, 100, (1, 2, 4))]
    engine, probe = replay(trace)
    assert engine.deployment is None
    for r in probe.records.values():
        assert r.dp_rank == 0
        assert r[r._fields.index("route_branch"):r._fields.index("ranks_json") + 1] == ev.ROUTE_NONE
    assert {b.dp_rank for b in probe.batches} == {s.dp_rank for s in probe.samples} == {0}


def test_closed_loop_releases_the_next_turn_when_the_previous_finishes_on_another_rank():
    """round_robin splits a session's turns over two ranks; closed-loop arrivals still release
    turn 2 only at turn 1's finish (on rank 0) + its pause, and turn 2 runs on rank 1."""
    p = tuple(range(1, 5))
    trace = [turn("t1", 0, 0, p, session="s", output=50), turn("t2", 1, 0, p + (5,), session="s")]
    _, probe = replay(trace, dp=2, router="round_robin")
    t1, t2 = probe.records["t1"], probe.records["t2"]
    assert (t1.dp_rank, t2.dp_rank) == (0, 1)
    assert t2.arrival_ns == t1.finish_ns
    assert t2.best_rank == 0 and t2.best_rank_device_tokens == 4 * PS


def test_ids_are_unique_across_ranks():
    """Batch, node, eviction and transfer ids: rank + 1, then every N-th (Scheduler.as_rank)."""
    trace = [turn(f"r{i}", i, i * 5, tuple(range(100 * i, 100 * i + 6)), output=70) for i in range(12)]
    engine, probe = replay(trace, dp=3, router="round_robin", device_tokens=10 * PS, host_tokens=12 * PS)
    batch_ids = [b.batch_id for b in probe.batches]
    assert len(set(batch_ids)) == len(batch_ids)
    assert all(b.batch_id % 3 == (b.dp_rank + 1) % 3 for b in probe.batches)
    ev_ids = [e.eviction_id for e in probe.evictions]
    assert ev_ids and len(set(ev_ids)) == len(ev_ids)
    tr_ids = [t.transfer_id for t in probe.transfers]
    assert len(set(tr_ids)) == len(tr_ids)
    node_ids = [n.id for rank in engine.ranks for n in rank.tree.nodes()]
    assert len(set(node_ids)) == len(node_ids)


@pytest.mark.parametrize("kw, words", [
    (dict(dp=0), "--dp 0"), (dict(dp=1.5), "--dp 1.5"), (dict(router="nearest"), "unknown --router 'nearest'"),
    (dict(router_cache_threshold=2.0), "router_cache_threshold 2.0 must be in [0, 1]"),
    (dict(router_cache_miss="any"), "unknown router_cache_miss rule 'any'"),
])
def test_bad_deployment_keys_are_refused_before_any_work(kw, words):
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        small_config(**kw)


# --- property: every rank sound, whatever the workload, router and N -------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(1, 4), router=st.sampled_from(ROUTER_NAMES),
       storage=st.sampled_from([0, 48 * PS]), device=st.integers(6, 24),
       write_policy=st.sampled_from(["write_through", "write_back"]), sessions=st.integers(0, 3))
def test_invariants_hold_on_every_rank(reqs, dp, router, storage, device, write_policy, sessions, tmp_path_factory):
    if sessions:  # some requests become turns of a few sessions (closed loop)
        reqs = [TraceRequest(r.req_id, r.seq, r.line, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens,
                             r.priority, r.extra_key, session=f"s{r.seq % sessions}" if r.seq % 2 else None)
                for r in reqs]
    cfg = small_config(dp=dp, router=router, device_tokens=device * PS, host_tokens=2 * device * PS,
                       storage_tokens=storage, write_policy=write_policy, router_balance_abs_threshold=2,
                       storage_dir=str(tmp_path_factory.mktemp("dp")) if storage else None)
    probe = CollectAll()
    engine = Engine(cfg, probe=probe)
    engine.run(sorted(reqs, key=lambda r: (r.arrival_ns, r.seq)))
    engine.check_invariants(idle=True)  # every rank's pools, tree and locks; nothing in flight
    assert len(probe.records) == len(reqs)
    for r in probe.records.values():
        assert 0 <= r.dp_rank < dp
        if r.status == "rejected":
            continue
        assert r.prefix_indices_len + r.computed_tokens == r.input_tokens
        assert r.prefix_indices_len == r.device_hit_tokens + r.host_hit_tokens + r.storage_hit_tokens
        if dp == 1:
            assert r.route_branch is None and r.ranks_json is None
            continue
        ranks = json.loads(r.ranks_json)
        # the text written out by hand (deployment._arrive, per-rank heads made once) is
        # json.dumps' own, byte for byte
        assert r.ranks_json == json.dumps(ranks, separators=(",", ":"))
        assert [x["rank"] for x in ranks] == list(range(dp))
        own = ranks[r.dp_rank]
        assert (own["device_tokens"], own["host_tokens"]) == (r.arrival_device_tokens, r.arrival_host_tokens)
        best = r.best_rank_device_tokens + r.best_rank_host_tokens
        assert best == max(x["device_tokens"] + x["host_tokens"] for x in ranks)
        assert best >= r.arrival_device_tokens + r.arrival_host_tokens
        # What a rank held at arrival is an upper bound of what it still had on device at admission
        # only in one direction: admission can find more (inserted since), never a device prefix
        # longer than the request's matchable pages.
        assert r.arrival_device_tokens + r.arrival_host_tokens <= r.input_tokens - 1
    for events, name in ((probe.batches, "batch_id"), (probe.evictions, "eviction_id"),
                         (probe.transfers, "transfer_id")):
        ids = [getattr(e, name) for e in events]
        assert len(set(ids)) == len(ids), f"{name} repeats across ranks"
        assert all(0 <= e.dp_rank < dp for e in events)
    node_ids = [n.id for rank in engine.ranks for n in rank.tree.nodes()]
    assert len(set(node_ids)) == len(node_ids)
    # The stats are the run's, over every rank: each finished request counted once.
    assert engine.stats.requests_finished + engine.stats.requests_rejected == len(reqs)


def test_peek_reads_the_tree_without_touching_it():
    """RadixTree.peek, asked at every arrival of every rank: the device and host-only pages of
    the longest cached prefix, a partly matched node counted by the pages matched, with no split,
    no access stamp and no lock (match() would split the node and stamp the path)."""
    from tierdiag.engine.tree import RadixTree

    tree = RadixTree(PS)
    tree.insert([1, 2, 3, 4], 0, [10, 11, 12, 13], now_ns=5, owner="a")
    node = tree.root.children[1]
    before = (len(list(tree.nodes())), node.last_access_ns, node.access_seq, node.lock_ref, len(node.keys))
    assert tree.peek([1, 2, 9]) == (2, 0)
    assert tree.peek([1, 2, 3, 4, 5]) == (4, 0)
    assert tree.peek([7]) == (0, 0)
    assert (len(list(tree.nodes())), node.last_access_ns, node.access_seq, node.lock_ref, len(node.keys)) == before
    # Host only below a device part: a node demoted to host counts as host.
    lower = tree.insert([1, 2, 3, 4, 5, 6], 4, [14, 15], now_ns=6, owner="b")[0]
    tree.set_host(lower, [0, 1])
    tree.demote(lower)
    assert tree.peek([1, 2, 3, 4, 5, 6, 7]) == (4, 2)


# --- the loop's idle passes -------------------------------------------------------------------
class CollectEvery(Collect):
    """Every event the engine emits, in order, as its repr less the data plane's measured wall
    time (`wall_ns`: a clock reading, as benchmarks/compare_rows.py leaves it out)."""

    def __init__(self):
        super().__init__()
        self.every: list[str] = []

    def emit(self, event):
        super().emit(event)
        self.every.append(re.sub(r"wall_ns=\d+", "wall_ns=", repr(event)))


def random_case(reqs, dp, router, device, write_policy, closed, storage, tmp_path_factory, name):
    """A Hypothesis workload made a deployment case: sorted by arrival, its turns two sessions
    where the loop is closed, a small config of `dp` ranks (a storage folder where `storage`)."""
    if closed:
        reqs = [TraceRequest(r.req_id, r.seq, r.line, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens,
                             r.priority, r.extra_key, session=f"s{r.seq % 2}") for r in reqs]
    trace = sorted(reqs, key=lambda r: (r.arrival_ns, r.seq))
    cfg = small_config(dp=dp, router=router, device_tokens=device * PS, host_tokens=2 * device * PS,
                       write_policy=write_policy, router_balance_abs_threshold=2,
                       arrivals="closed" if closed else "trace", storage_tokens=storage,
                       storage_dir=str(tmp_path_factory.mktemp(name)) if storage else None)
    return trace, cfg


def gated_and_every(trace, cfg, monkeypatch) -> tuple[list[str], list[str], int, int]:
    """The replay's events and idle_pass calls, as Deployment.run runs it (`idle_pass_changes`
    gates the idle passes) and with every idle pass called (the predicate made always true)."""
    from tierdiag.engine import deployment
    from tierdiag.engine.scheduler import Scheduler

    calls = [0]
    idle_pass = Scheduler.idle_pass

    def counted(self, now, more):
        calls[0] += 1
        idle_pass(self, now, more)

    out = []
    with monkeypatch.context() as mp:
        mp.setattr(Scheduler, "idle_pass", counted)
        for every in (False, True):
            if every:
                mp.setattr(deployment, "idle_pass_changes", lambda sched, acks_per_pass: True)
            calls[0] = 0
            probe = CollectEvery()
            Engine(cfg, probe=probe).run(trace)
            out.append((probe.every, calls[0]))
    (gated, gated_calls), (every, every_calls) = out
    return gated, every, gated_calls, every_calls


@patches_the_engine
def test_an_idle_rank_passes_only_where_its_pass_changes_something(monkeypatch):
    """Deployment.run calls an idle rank's `Scheduler.idle_pass` (self_check_during_idle's reset
    of new_token_ratio, the queued backups' flush) only where `idle_pass_changes` says it can
    change something: a --dp 8 conversation replay skipped ~586k calls at wakes for another
    rank's batch or events. Here: rank 0 holds a long request (a batch end a step, 40 steps)
    while rank 1 finished its short one and idles; the loop wakes at each of rank 0's batch
    ends, and rank 1's pass there would reset a ratio already reset with no backup queued. The
    replay skips those calls and emits the same events, in order, as one calling them all."""
    trace = [turn("long", 0, 0, tuple(range(1, 5)), output=40), turn("short", 1, 0, tuple(range(11, 15)), output=2)]
    cfg = small_config(dp=2, router="round_robin", device_tokens=64 * PS, host_tokens=128 * PS)
    gated, every, gated_calls, every_calls = gated_and_every(trace, cfg, monkeypatch)
    assert gated == every
    assert gated_calls < every_calls, (gated_calls, every_calls)


@patches_the_engine
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(2, 4), router=st.sampled_from(ROUTER_NAMES), device=st.integers(6, 24),
       write_policy=st.sampled_from(["write_through", "write_back"]), closed=st.booleans(),
       storage=st.sampled_from([0, 48 * PS]))
def test_skipping_the_idle_passes_that_change_nothing_keeps_every_event(reqs, dp, router, device, write_policy,
                                                                         closed, storage, monkeypatch,
                                                                         tmp_path_factory):
    """The same on random workloads, routers, rank counts, write policies and storage tiers
    (0.5.23's storage_acks_per_pass drains storage in idle passes), open and closed loop: the
    gated replay emits every event the replay calling every idle pass emits, in the same order
    with the same values, and never calls more."""
    trace, cfg = random_case(reqs, dp, router, device, write_policy, closed, storage, tmp_path_factory, "idle")
    gated, every, gated_calls, every_calls = gated_and_every(trace, cfg, monkeypatch)
    assert gated == every
    assert gated_calls <= every_calls


def ahead_runs_checked(trace, cfg, monkeypatch) -> list[int]:
    """Replays `trace`, checking every `run_decode_ahead` call: the AheadRun Deployment.run keeps
    of it (made after the call from the decode clock before it, only where it ran steps) times
    its steps as the `wakes` list DecodeSteps._decode_ahead writes, step by step. Returns each
    run's steps."""
    from tierdiag.engine.decode import DecodeSteps
    from tierdiag.engine.deployment import AheadRun

    real = DecodeSteps.run_decode_ahead
    runs: list[int] = []

    def checked(self, end, limit, wakes=None, fold=None):
        first_step = self.dstep
        written: list[int] = []
        out = real(self, end, limit, written, fold)
        assert (self.dstep > first_step) == bool(written)
        if written:
            run = AheadRun(self, end, first_step)
            assert run.steps == len(written)
            assert run.starts() == written
            assert run.starts() is run.starts()  # made once
            assert run.last_start(out) == written[-1]
            runs.append(run.steps)
        if wakes is not None:
            wakes.extend(written)
        return out

    with monkeypatch.context() as mp:
        mp.setattr(DecodeSteps, "run_decode_ahead", checked)
        Engine(cfg).run(trace)  # (no probe: a probe of every decode step turns the steps run ahead off)
    return runs


@patches_the_engine
def test_steps_run_ahead_are_timed_when_asked_as_the_decode_loop_times_them(monkeypatch):
    """Deployment.run does not keep each decode step's start as a rank runs them at once
    (`run_decode_ahead`): the loop needs them only where another rank is stuck (waiting for
    memory or a prefetch), which no conversation replay meets, and a list of them was ~2.7 M
    boxed ints a --dp 8 conversation replay (issue 41). It keeps an AheadRun (the run's start,
    decode clock, KV base and batch) and makes the times from them when asked: step k lasts
    CostModel.decode_step_ns(kv_base + running * k), as in the decode loop. Here rank 0 decodes a
    long output ahead, 40 steps, while rank 1 idles: every run's times are the loop's."""
    trace = [turn("long", 0, 0, tuple(range(1, 5)), output=40), turn("short", 1, 0, tuple(range(11, 15)), output=2)]
    cfg = small_config(dp=2, router="round_robin", device_tokens=64 * PS, host_tokens=128 * PS)
    runs = ahead_runs_checked(trace, cfg, monkeypatch)
    assert sum(runs) >= 30, runs


@patches_the_engine
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(2, 4), router=st.sampled_from(ROUTER_NAMES), device=st.integers(6, 24),
       closed=st.booleans())
def test_steps_run_ahead_are_timed_as_the_decode_loop_times_them_on_any_workload(reqs, dp, router, device, closed,
                                                                                 monkeypatch):
    """The same on random workloads, routers, rank counts and small devices (ranks stuck for
    memory), open and closed loop: every run's times, and its last, are the decode loop's."""
    if closed:
        reqs = [TraceRequest(r.req_id, r.seq, r.line, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens,
                             r.priority, r.extra_key, session=f"s{r.seq % 2}") for r in reqs]
    trace = sorted(reqs, key=lambda r: (r.arrival_ns, r.seq))
    cfg = small_config(dp=dp, router=router, device_tokens=device * PS, host_tokens=2 * device * PS,
                       router_balance_abs_threshold=2, arrivals="closed" if closed else "trace")
    ahead_runs_checked(trace, cfg, monkeypatch)


# The arrival's scores as text: _json_number keeps float reprs by value (issue 41: ~7,000
# instructions a repr, a --dp 8 replay writes 8 a request); every value, asked again and again
# (the table's hits), through a full table's clearing, is the reference's text and json's.
@settings(max_examples=300, deadline=None)
@given(xs=st.lists(st.one_of(st.none(), st.floats(), st.sampled_from([0.0, -0.0, 1.0, 0.1, 1e16, 1e-7])),
                   max_size=40))
def test_score_text_is_the_reference(xs):
    from tierdiag.engine import deployment as dep

    for x in xs + xs:
        text = dep._json_number(x)
        assert text == dep._json_number_reference(x)
        if x is not None and x == x and abs(x) != float("inf"):
            assert json.loads(text) == x and text == json.dumps(x)


def test_score_text_table_is_cleared_when_full():
    from tierdiag.engine import deployment as dep

    for i in range(dep._SCORE_TEXT_MAX + 10):
        x = (i + 1) / 7
        assert dep._json_number(x) == repr(x)
    assert 0 < len(dep._SCORE_TEXT) <= dep._SCORE_TEXT_MAX
    assert dep._json_number(float("nan")) == "nan" and all(k == k for k in dep._SCORE_TEXT)


# A score the table has not seen is written by the C's own shortest-digits formatter where
# 1e-4 <= |x| < 1e15 (router.c short_repr: repr's ~7,000 instructions a new match rate, issue 41
# session 34): repr's text, on any double of that range and its edges (powers of two, whose
# lower neighbour is nearer, the range's ends, short decimals, match rates as the router makes
# them), each written afresh (a table of at most 0 entries: cleared at every call).
_EDGE_FLOATS = st.one_of(
    st.floats(1e-4, 1e15), st.floats(-1e15, -1e-4),
    st.builds(lambda e, d: 2.0 ** e * (1.0 + d), st.integers(-14, 49), st.sampled_from([0.0, 2**-52, -2**-53, 2**-51])),
    st.builds(lambda x, nd: round(x, nd), st.floats(0, 1e6), st.integers(0, 17)),
    st.builds(lambda d, ps, n: d * (ps / n), st.integers(1, 5000), st.sampled_from([1, 16, 64]), st.integers(1, 10**6)),
    st.sampled_from([1e-4, 0.00010000000000000002, 9.999999999999999e-05, 1e15, 999999999999999.9, 0.1, 0.3,
                     1.0, 2.0**-14, 5e-324, 1.7976931348623157e308, 1e16, 123456789012345.67]),
)


@settings(max_examples=2000, deadline=None)
@given(xs=st.lists(_EDGE_FLOATS, min_size=1, max_size=8))
def test_a_new_score_text_is_reprs(xs):
    from tierdiag.native import cplane

    native = cplane.compiled("ranks_json")
    if native is None:
        pytest.skip("the data plane's C is not built")
    n = len(xs)
    text = native([(0, 1)] * n, (0,) * n, tuple(xs), 1, {}, 0)
    got = [r["score"] for r in json.loads(text)]
    assert got == xs
    assert text == "[" + ",".join(f'{{"rank":{r},"device_tokens":0,"host_tokens":1,"in_flight":0,"score":{x!r}}}'
                                  for r, x in enumerate(xs)) + "]"


# The arrival's ranks_json: the data plane's C (csrc/router.c, one buffer written in place) and
# its reference write json.dumps's text of every rank's share, on any shares, loads and scores
# (zeros of both signs, NaN and infinities, scores shorter than the ranks: null), asked twice
# (the score table's hits); values past int64 and other shapes are the reference's, the same
# text (issue 41 session 23: the f-strings were ~5 % of a --dp 8 replay's Engine.run).
_I64 = st.integers(-(2**63), 2**63 - 1)


def _json_of_ranks(held, in_flight, scores, ps):
    return json.dumps([{"rank": r, "device_tokens": d * ps, "host_tokens": h * ps, "in_flight": in_flight[r],
                        "score": scores[r] if r < len(scores) else None} for r, (d, h) in enumerate(held)],
                      separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 9), ps=st.one_of(st.sampled_from([1, 16, 64]), st.integers(-(2**40), 2**40)),
       score=st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0.5, 1e-7, 1e16])))
def test_ranks_json_is_json_dumps_on_both_sides(data, n, ps, score):
    from tierdiag.engine import deployment as dep

    small = st.integers(0, 4096)
    held = data.draw(st.lists(st.tuples(st.one_of(small, _I64), st.one_of(small, _I64)), min_size=n, max_size=n))
    in_flight = tuple(data.draw(st.lists(st.one_of(small, _I64), min_size=n, max_size=n)))
    scores = tuple(data.draw(st.lists(st.one_of(st.just(score), st.just(0.0), st.floats()), max_size=n)))
    want = dep.ranks_json_py(held, in_flight, scores, ps)
    for _ in range(2):
        assert dep.ranks_json_c(held, in_flight, scores, ps) == want
        assert dep.ranks_json_py(held, in_flight, scores, ps) == want
    if all(s == s and abs(s) != float("inf") for s in scores):
        assert want == _json_of_ranks(held, in_flight, scores, ps)


# The C's score texts kept by the double's bits (router.c's table of 4096 slots in front of the
# dict, issue 41 session 38): more distinct scores than slots, each asked again after others took
# its slot, of both signs and around the slot's hash, are repr's; values it does not keep (NaN,
# infinities) are the reference's.
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), extra=st.lists(st.floats(), max_size=16))
def test_the_c_score_table_answers_reprs_through_its_collisions(seed, extra):
    from tierdiag.engine import deployment as dep

    if cplane.compiled("ranks_json") is None:
        pytest.skip("the data plane's C is not built")
    rng = random.Random(seed)
    values = [rng.choice([1, -1]) * rng.random() * 10.0 ** rng.randint(-6, 16) for _ in range(6000)] + extra
    for round_ in range(2):
        for i in range(0, len(values), 8):
            scores = tuple(values[i:i + 8])
            n = len(scores)
            want = dep.ranks_json_py([(0, 1)] * n, (0,) * n, scores, 1)
            assert dep.ranks_json_c([(0, 1)] * n, (0,) * n, scores, 1) == want
        rng.shuffle(values)


@pytest.mark.parametrize("held, in_flight, scores, ps, typed", [
    ([(1, 0)], (3,), (1,), 64, True),  # an int score: the reference's float()
    ([(True, 0)], (3,), (0.5,), 64, True),  # a bool share
    ([(2**62, 0)], (3,), (0.5,), 64, True),  # tokens past int64
    ([(1, 0)], (2**70,), (0.5,), 64, True),  # a load past int64
    ([(1, 0)], (3,), (0.5,), 2**64, True),  # a page size past int64
    ([[1, 0]], (3,), (0.5,), 64, False),  # a list, not a pair tuple (the compiled callers refuse it)
    ([(1, 0)], [3], (0.5,), 64, False),  # loads as a list (the same)
])
def test_ranks_json_hands_other_shapes_to_the_reference(held, in_flight, scores, ps, typed):
    from tierdiag.engine import deployment as dep
    from tierdiag.native import cplane

    native = cplane.compiled("ranks_json")
    if native is not None:
        table = dict(dep._SCORE_TEXT)
        assert native(held, in_flight, scores, ps, dep._SCORE_TEXT, dep._SCORE_TEXT_MAX) == -1
        assert dep._SCORE_TEXT == table  # nothing changed
    if typed:
        want = dep.ranks_json_py(held, in_flight, scores, ps)
        assert dep.ranks_json_c(held, in_flight, scores, ps) == want
        assert want == _json_of_ranks(held, in_flight, [float(x) for x in scores], ps)
