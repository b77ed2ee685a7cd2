"""The running requests' next pages by decode step (DecodeSteps, `Scheduler._page_ring`, issue 41):
a ring of `ps` slots, slot `step % ps` holding the requests whose next page is due at that
step. That is exact only while every next page is within `ps` steps of the decode clock; this
holds the engine to it at every prefill batch and every decode step, on the compiled core and
the Python twin alike (the attributes are read, nothing is patched)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, small_config
from tests.engine.test_invariants import workloads
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe


class RingWatch(Probe):
    """At every batch and decode step: each running request whose output still needs a page is
    in the slot of its next page, once, that page within `ps` steps ahead of the clock; nobody
    else is in the ring."""

    def __init__(self):
        super().__init__()
        self.scheduler = None
        self.checked = 0

    def wants(self, cls) -> bool:
        return cls in (ev.BatchScheduled, ev.DecodeStep)

    def emit(self, event) -> None:
        s = self.scheduler
        # the clock: a step's own (the steps run ahead keep theirs in hand until they are done)
        ps, k = s.ps, event.step if isinstance(event, ev.DecodeStep) else s.dstep
        ring = s._page_ring
        assert len(ring) == ps
        expected = {}
        for r in s.running:
            if r.next_page <= r.finish_step:
                assert k < r.next_page <= k + ps, f"{r.req_id}: next page at {r.next_page}, clock {k}, page {ps}"
                expected[id(r)] = r.next_page % ps
        found = {}
        for slot, due in enumerate(ring):
            for r in due:
                assert id(r) not in found, f"{r.req_id} twice in the ring"
                found[id(r)] = slot
        assert found == expected
        self.checked += 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), device=st.integers(4, 40), mixed=st.booleans(), page=st.sampled_from([1, PS]),
       sglang=st.sampled_from(["0.5.9", "0.5.23"]))
def test_every_next_page_is_in_its_step_slot(reqs, device, mixed, page, sglang):
    """Joins, pages given, retractions (a small device), finishes and mixed batches all keep each
    running request in the slot of its next page, and that page within a page of steps."""
    probe = RingWatch()
    cfg = small_config(device_tokens=device * PS, enable_mixed_chunk=mixed, sglang_rules=sglang, page_size=page)
    engine = Engine(cfg, probe=probe)
    probe.scheduler = engine.scheduler
    engine.run(sorted(reqs, key=lambda r: (r.arrival_ns, r.seq)))
    engine.check_invariants(idle=True)
    assert all(not due for due in engine.scheduler._page_ring)
