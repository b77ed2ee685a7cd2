"""Build small workloads in memory and collect what the engine reports about them."""

from __future__ import annotations

from tierdiag.engine.config import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe
from tierdiag.trace.reader import TraceRequest

PS = 64  # page size used by the narrated tests: one hash id = one page (block_size 64)


class Collect(Probe):
    def __init__(self):
        super().__init__()
        self.records: dict[str, ev.RequestRecord] = {}
        self.evictions: list[ev.Eviction] = []
        self.transfers: list[ev.Transfer] = []
        self.skips: list[ev.LoadBackSkipped] = []
        self.lost: list[ev.PrefixLostPages] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.RequestFinished):
            self.records[event.record.req_id] = event.record
        elif isinstance(event, ev.Eviction):
            self.evictions.append(event)
        elif isinstance(event, ev.Transfer):
            self.transfers.append(event)
        elif isinstance(event, ev.LoadBackSkipped):
            self.skips.append(event)
        elif isinstance(event, ev.PrefixLostPages):
            self.lost.append(event)


def req(req_id: str, t_ms: float, pages: list[int], *, extra_tokens: int = 1, output: int = 4, seq: int = 0) -> TraceRequest:
    """A request whose input is `pages` (one hash id per page) plus `extra_tokens` more tokens."""
    return TraceRequest(req_id=req_id, seq=seq, line=seq + 1, arrival_ns=int(t_ms * 1e6),
                        input_len=len(pages) * PS + extra_tokens, output_len=output,
                        hash_ids=tuple(pages) + ((max(pages) + 10**6,) if extra_tokens else ()), tokens=None)


def numbered(requests: list[TraceRequest]) -> list[TraceRequest]:
    out = []
    for i, r in enumerate(requests):
        out.append(TraceRequest(r.req_id, i, i + 1, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens))
    return sorted(out, key=lambda r: (r.arrival_ns, r.seq))


def small_config(**kw) -> EngineConfig:
    base = dict(model="tiny", gpu="h100", device_tokens=16 * PS, host_tokens=64 * PS, page_size=PS,
                block_size=PS, verify="all", data_plane_mib=4)
    base.update(kw)
    return EngineConfig(**base)


def run(requests: list[TraceRequest], cfg: EngineConfig | None = None, **kw) -> tuple[Engine, Collect]:
    probe = Collect()
    engine = Engine(cfg or small_config(**kw), probe=probe)
    engine.run(numbered(requests))
    return engine, probe
