"""The engine's handle on its probe (`Emitters`): one callable an event kind, taking the tuple of
the event's fields in order (probes/events.py's EMITTED names the kinds, `emitter` makes each),
or None where nothing is to be emitted (no probe, or a probe that keeps no such events: the
engine then builds neither the event nor its fields); `tick`, called once a batch (None where
the probe has nothing to do then); `request`, the `record` emitter taking every column by
keyword (issue 38).

Compiled with the engine core (compiled.MODULES): a native class whose attributes the compiled
Scheduler and CacheController (`emit: Emitters`) read at a fixed offset; as the plain class it
was in probes/events.py, each of the ~40 `self.emit.X` reads in the compiled core (with a probe
or without) was a look-up by name (issue 41). The Python source is its twin."""

from __future__ import annotations

from typing import Any, Callable, Optional

from tierdiag.probes import events as ev

Emit = Optional[Callable[[tuple], None]]


def _of(probe: Any, name: str) -> Emit:
    return ev.emitter(probe, ev.EMITTED[name])


class Emitters:
    """One attribute a kind of events.EMITTED (each its emitter or None), `tick` and `request`."""

    def __init__(self, probe: Any) -> None:
        self.arrived: Emit = _of(probe, "arrived")
        self.matched: Emit = _of(probe, "matched")
        self.skipped: Emit = _of(probe, "skipped")
        self.transfer: Emit = _of(probe, "transfer")
        self.eviction: Emit = _of(probe, "eviction")
        self.lost: Emit = _of(probe, "lost")
        self.batch: Emit = _of(probe, "batch")
        self.prefill_done: Emit = _of(probe, "prefill_done")
        self.first_token: Emit = _of(probe, "first_token")
        self.pool_sample: Emit = _of(probe, "pool_sample")
        self.record: Emit = _of(probe, "record")
        self.decode_step: Emit = _of(probe, "decode_step")
        self.tick: Optional[Callable[[], None]] = getattr(probe, "tick", None)
        # The request record by name (issue 38): `emit.request(req_id=..., seq=..., ...)`, every
        # field a keyword (those RequestRecord gives a default may be left out); None where no
        # record is emitted. Builds the same tuple `record` takes, in the columns' order.
        self.request: Optional[Callable[..., None]] = (None if self.record is None
                                                       else ev.by_keyword(ev.RequestRecord, self.record))
