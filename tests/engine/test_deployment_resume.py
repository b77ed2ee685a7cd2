"""Deployment.run's pass that can only be a plain decode step, run as the first step of the
rank's run-ahead (`run_decode_ahead` from the pass's own time) instead of `schedule_pass` and
`_decode` (issue 41 session 32: ~23k such passes on conversation[:2000] at --dp 8, each where
another rank's event or an arrival cut the rank's run). The loop takes that path only where the
rank's pass is its own `schedule_pass`: a harness's `pass_fn` (here a wrapper of the same
method) runs every pass through the pass, as before. Both replays must emit the same events, in
the same order, with the same values."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, patches_the_engine, small_config
from tests.engine.test_deployment import CollectEvery, random_case, turn
from tests.engine.test_invariants import workloads
from tierdiag.config.router import ROUTER_NAMES
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev


class CollectAhead(CollectEvery):
    """CollectEvery without the decode steps' events (a probe of every decode step turns the
    steps run ahead off, and with them the path under test)."""

    def wants(self, cls) -> bool:
        return cls is not ev.DecodeStep


def resumed_and_passed(trace, cfg) -> tuple[list[str], list[str], int]:
    """The replay's events as Deployment.run runs it, and with every rank's pass made a wrapper
    of `schedule_pass` (which turns the plain decode pass's short cut off); and how many passes
    the wrapper ran."""
    out = []
    passes = [0]
    for wrapped in (False, True):
        probe = CollectAhead()
        engine = Engine(cfg, probe=probe)
        if wrapped:
            assert engine.deployment is not None
            for sched in engine.deployment.ranks:
                def through_the_pass(now, sched=sched):
                    passes[0] += 1
                    return sched.schedule_pass(now)
                sched.pass_fn = through_the_pass
        engine.run(trace)
        engine.check_invariants(idle=True)
        out.append(probe.every)
    return out[0], out[1], passes[0]


def test_a_plain_decode_pass_runs_as_the_run_ahead_s_first_step():
    """Rank 0 decodes a long output while rank 1's requests arrive one after another: each
    arrival (the limit of rank 0's run-ahead) cuts rank 0's run, and its next pass is a plain
    decode step. The replay emits what the one through schedule_pass emits."""
    trace = [turn("long", 0, 0, tuple(range(1, 5)), output=60)]
    trace += [turn(f"s{i}", i, 0.05 * i, tuple(range(100 * i, 100 * i + 3)), output=2) for i in range(1, 12)]
    cfg = small_config(dp=2, router="round_robin", device_tokens=64 * PS, host_tokens=128 * PS)
    resumed, passed, passes = resumed_and_passed(trace, cfg)
    assert resumed == passed
    assert passes > 0


@patches_the_engine
def test_the_short_cut_skips_schedule_pass(monkeypatch):
    """On the Python engine: the same replay calls `schedule_pass` fewer times than the one
    through the pass (the plain decode passes are the run-ahead's), and emits the same events."""
    from tierdiag.engine.scheduler import Scheduler

    trace = [turn("long", 0, 0, tuple(range(1, 5)), output=60)]
    trace += [turn(f"s{i}", i, 0.05 * i, tuple(range(100 * i, 100 * i + 3)), output=2) for i in range(1, 12)]
    cfg = small_config(dp=2, router="round_robin", device_tokens=64 * PS, host_tokens=128 * PS)
    calls = [0]
    real = Scheduler.schedule_pass

    def counted(self, now):
        calls[0] += 1
        return real(self, now)

    monkeypatch.setattr(Scheduler, "schedule_pass", counted)
    probe = CollectAhead()
    Engine(cfg, probe=probe).run(trace)
    own_calls = calls[0]
    resumed, passed, passes = resumed_and_passed(trace, cfg)
    assert probe.every == resumed == passed
    assert own_calls < passes, (own_calls, passes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(2, 4), router=st.sampled_from(ROUTER_NAMES), device=st.integers(6, 24),
       write_policy=st.sampled_from(["write_through", "write_back"]), closed=st.booleans(),
       storage=st.sampled_from([0, 48 * PS]))
def test_the_plain_decode_pass_keeps_every_event_on_any_workload(reqs, dp, router, device, write_policy, closed,
                                                                 storage, tmp_path_factory):
    """The same on random workloads, routers, rank counts, small devices (evictions,
    retractions, ranks stuck for memory), write policies and storage tiers, open and closed
    loop: every event, in order, with its values."""
    trace, cfg = random_case(reqs, dp, router, device, write_policy, closed, storage, tmp_path_factory, "resume")
    resumed, passed, _ = resumed_and_passed(trace, cfg)
    assert resumed == passed
