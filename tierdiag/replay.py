"""Replay a trace through the engine into a run store: the one function behind `tierdiag replay`.

The `runs` row is written first (status running) so a crash leaves a visible trace of the run;
events are appended in bulk as the recorder fills; the status becomes complete, interrupted
(Ctrl-C) or failed (an error) at the end, and whatever was recorded before stays readable.
"""

from __future__ import annotations

import gzip
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tierdiag.engine.config import EngineConfig
from tierdiag.errors import TierdiagError
from tierdiag.trace.reader import ReadReport, read_trace, trace_sha256


@dataclass(frozen=True)
class ReplaySummary:
    run_id: str | None
    db_path: str | None
    run_name: str
    status: str
    num_requests: int
    num_rejected: int
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    load_backs: int
    load_back_bytes: int
    load_back_p50_ms: float | None
    load_back_p99_ms: float | None
    skipped: dict
    evictions: dict
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    virtual_s: float
    prefill_busy_share: float  # share of virtual time the GPU spent in prefill
    wall_s: float
    bad_lines: int
    first_bad: list = field(default_factory=list)
    unknown_keys: list = field(default_factory=list)
    data_plane: dict = field(default_factory=dict)

    @property
    def reuse_share(self) -> float:
        reused = self.device_tokens + self.host_tokens + self.storage_tokens
        return reused / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["reuse_share"] = self.reuse_share
        return d


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k] / 1e6


def count_lines(path: Path) -> int | None:
    """Cheap total for the progress bar (None for compressed traces)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
            fh.seek(0)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return None


def replay(trace: Path, cfg: EngineConfig, *, db: Path | None, run_name: str | None, probes: bool,
           skip_bad: bool, command_line: list[str] | None = None,
           progress: Callable[[int, int, object], None] | None = None) -> ReplaySummary:
    # Imported here: read-only commands share this package and must not pay for torch.
    from tierdiag.engine.engine import Engine, describe_data_plane
    from tierdiag.engine.hardware import hardware_summary
    from tierdiag.probes.recorder import Recorder

    t0 = time.perf_counter()
    report = ReadReport()
    requests = read_trace(trace, block_size=cfg.block_size, skip_bad=skip_bad, report=report)
    sha = trace_sha256(trace)
    writer = None
    recorder = None
    storage_dir = None
    if db is not None and probes:
        from tierdiag.store.writer import RunWriter

        writer = RunWriter(db, name=run_name, trace_path=str(trace), trace_sha256=sha, config=cfg.to_json(),
                           hardware=hardware_summary(), data_plane=describe_data_plane(cfg), timing=cfg.timing,
                           command_line=command_line)
        recorder = Recorder(writer.append)
        if cfg.storage_tokens and cfg.storage_dir is None:
            storage_dir = Path(db).with_suffix(".storage") / writer.run_id
    engine = Engine(cfg, probe=recorder, storage_dir=storage_dir, progress=progress)
    status, error = "complete", None
    try:
        stats = engine.run(requests)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except TierdiagError as exc:
        status, error = "failed", exc.one_line()
        raise
    except BaseException as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if writer is not None:
            try:
                recorder.flush()
            finally:
                writer.finish(status, num_requests=engine.stats.requests_finished + engine.stats.requests_rejected,
                              error=error)
    return ReplaySummary(
        run_id=writer.run_id if writer else None, db_path=str(db) if writer else None,
        run_name=writer.name if writer else (run_name or trace.stem), status=status,
        num_requests=stats.requests_finished, num_rejected=stats.requests_rejected,
        input_tokens=stats.input_tokens, device_tokens=stats.device_tokens, host_tokens=stats.host_tokens,
        storage_tokens=stats.storage_tokens, computed_tokens=stats.computed_tokens,
        recomputed_tokens=stats.recomputed_tokens, load_backs=stats.load_backs,
        load_back_bytes=stats.load_back_bytes, load_back_p50_ms=_percentile(stats.load_back_ns, 0.5),
        load_back_p99_ms=_percentile(stats.load_back_ns, 0.99), skipped=dict(stats.skipped),
        evictions=dict(stats.evictions), ttft_p50_ms=_percentile(stats.ttft_ns, 0.5),
        ttft_p90_ms=_percentile(stats.ttft_ns, 0.9), ttft_p99_ms=_percentile(stats.ttft_ns, 0.99),
        virtual_s=stats.virtual_end_ns / 1e9,
        prefill_busy_share=stats.busy_ns / stats.virtual_end_ns if stats.virtual_end_ns else 0.0, wall_s=time.perf_counter() - t0, bad_lines=report.bad_lines,
        first_bad=list(report.first_bad), unknown_keys=sorted(report.unknown_keys),
        data_plane=describe_data_plane(cfg),
    )
