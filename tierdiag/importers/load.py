"""`tierdiag import sglang`: an SGLang metrics export -> one `observed` run (+ a replayable trace).

Records stream from `importers.sglang_export.read_export`; only their numbers are kept, as Arrow
columns in chunks (a few hundred bytes a request, never the prompts: peak RSS grows ~0.7 KB a
request with DuckDB's own buffers, benchmarks/import_sglang.py). Times are written relative to
the first request's arrival, which is known only at the end: the export is in *finish* order,
so the earliest arrival can sit in any file. Hence one write at the end, after the whole export
has been read: a bad export records nothing. That write is one transaction holding the runs row
and every request (store.copy_run.write_run_tables), during which Ctrl-C and SIGTERM wait
(`signals.deferred`): an import is all or nothing. Interrupted while it reads, nothing is
recorded; a signal that lands while it writes is acted on once the run is committed, and the
line says so; killed (-9) while it writes, the transaction never commits.

The trace (`--trace-out`) has to be in arrival order (`tierdiag replay` refuses timestamps that
go backwards), so token lists go to a temporary file beside it as they come, with an index of
(arrival, offset, length); at the end the index is sorted and the lines copied out in arrival
order. Memory stays bounded by the index (about 60 bytes a request), not by the prompts.

Mapping (DESIGN §5: NULL for what the server did not report, never 0)::

    req_id              id (the server's request id, rid)
    arrival_ns          request_received_ts - first request's, in ns
    input/output        prompt_tokens / completion_tokens
    device/host/storage cached_tokens_details (null = miss: 0/0/0); computed = prompt - their sum
    prefix_indices_len  device + host + storage (SGLang's prefix_len after load-back)
    extend_input_len    computed tokens
    queue_ns            queue_time
    storage_wait_ns     storage_prefetch_wait
    ttft_ns             first_token_latency           first_token_ns = arrival + ttft
    prefill_ns          first token - forward_entry_time (first scheduled)
    finish_ns           request_finished_ts (else arrival + e2e_latency)
    status              finished | aborted (finish_reason type abort; reject_reason its message)
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from array import array
import tempfile
import time
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierdiag import __version__, signals
from tierdiag.config.names import RunKind
from tierdiag.errors import OutputError, RunInterrupted, TraceError
from tierdiag.paths import check_output, open_output, prepare_output_path
from tierdiag.units import NS_PER_MS, NS_PER_S
from tierdiag.importers.sglang import (
    KEEP_TOKEN_IDS_HINT,
    METRICS_FLAG,
    ImportReport,
    SGLangRequest,
)
from tierdiag.importers.sglang_export import read_export

CHUNK_ROWS = 16_384
PROGRESS_EVERY = 1_000
OBSERVED_TIMING = "observed"  # runs.timing of an imported run: the server's own clock

_INT_COLS = ("arrival_ns", "input_tokens", "output_tokens", "device_hit_tokens", "host_hit_tokens",
             "storage_hit_tokens", "computed_tokens", "prefix_indices_len", "extend_input_len", "queue_ns",
             "storage_wait_ns", "ttft_ns", "first_token_ns", "prefill_ns", "finish_ns", "dp_rank")
# Columns holding epoch ns until the first arrival is known.
_ABSOLUTE_COLS = ("arrival_ns", "first_token_ns", "finish_ns")
_STR_COLS = ("req_id", "status", "reject_reason", "hit_class")


@dataclass(frozen=True)
class ImportSummary:
    run_id: str
    db_path: str
    run_name: str
    files: list[str]
    num_requests: int
    num_finished: int
    num_aborted: int
    num_with_ttft: int
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    span_s: float | None
    bad_lines: int
    first_bad: list[str]
    details_mismatch: int
    first_mismatch: str | None
    metrics_enabled: bool  # the server exported its timing fields (--enable-metrics)
    storage_backends: list[str]
    dp_ranks: int | None  # data-parallel ranks the export names (its dp_rank values); None: none
    trace_out: str | None
    trace_requests: int
    trace_text_only: int
    trace_no_prompt: int
    trace_no_arrival: int
    wall_s: float
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * NS_PER_S)


class _Columns:
    """Per-request numbers, in chunks of Arrow arrays (compact; nulls where unreported)."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, pa.Array]] = []
        self._rows: dict[str, list] = {c: [] for c in _INT_COLS + _STR_COLS}
        self.n = 0

    def add(self, r: SGLangRequest) -> None:
        rows = self._rows
        arrival = _ns(r.received_s)
        ttft = _ns(r.ttft_s)
        first_token = arrival + ttft if arrival is not None and ttft is not None else None
        forward = _ns(r.forward_entry_s)
        prefill = first_token - forward if first_token is not None and forward is not None else None
        if prefill is not None and prefill < 0:
            prefill = None  # clocks of two processes; a negative span is not a measurement
        finish = _ns(r.finished_s)
        if finish is None and arrival is not None and r.e2e_s is not None:
            finish = arrival + _ns(r.e2e_s)
        reused = r.reused_tokens
        computed = r.prompt_tokens - reused if reused is not None else None
        if r.device_tokens is None:
            hit_class = None
        elif r.host_tokens or r.storage_tokens:
            hit_class = "tiered_hit"
        else:
            hit_class = "device_hit" if r.device_tokens else "miss"
        aborted = r.finish_type == "abort"
        for col, value in (
            ("req_id", r.req_id), ("status", "aborted" if aborted else "finished"),
            ("reject_reason", (r.finish_message or "aborted") if aborted else None), ("hit_class", hit_class),
            ("arrival_ns", arrival), ("input_tokens", r.prompt_tokens), ("output_tokens", r.completion_tokens),
            ("device_hit_tokens", r.device_tokens), ("host_hit_tokens", r.host_tokens),
            ("storage_hit_tokens", r.storage_tokens), ("computed_tokens", computed),
            ("prefix_indices_len", reused if r.device_tokens is not None else None),
            ("extend_input_len", computed), ("queue_ns", _ns(r.queue_s)),
            ("storage_wait_ns", _ns(r.storage_prefetch_wait_s)), ("ttft_ns", ttft),
            ("first_token_ns", first_token), ("prefill_ns", prefill), ("finish_ns", finish),
            ("dp_rank", r.dp_rank),
        ):
            rows[col].append(value)
        self.n += 1
        if len(rows["req_id"]) >= CHUNK_ROWS:
            self._seal()

    def _seal(self) -> None:
        if not self._rows["req_id"]:
            return
        chunk = {c: pa.array(v, type=pa.int64()) for c, v in self._rows.items() if c in _INT_COLS}
        chunk.update({c: pa.array(v, type=pa.string()) for c, v in self._rows.items() if c in _STR_COLS})
        self.chunks.append(chunk)
        self._rows = {c: [] for c in _INT_COLS + _STR_COLS}

    def finish(self) -> tuple[int | None, list[dict[str, pa.Array]]]:
        """(first arrival in epoch ns or None, chunks with times relative to it and `seq` filled).

        seq = order of arrival (ties and unknown arrivals: order read), as in a trace."""
        self._seal()
        arrivals = pa.chunked_array([c["arrival_ns"] for c in self.chunks], type=pa.int64())
        t0 = pc.min(arrivals).as_py()
        # Arrow's sort is stable: ties and unknown arrivals (nulls, last) keep the order read.
        order = pc.array_sort_indices(arrivals, order="ascending", null_placement="at_end")
        order = order.to_numpy()
        seq = np.empty(len(arrivals), dtype=np.int64)
        seq[order] = np.arange(len(arrivals), dtype=np.int64)
        out = []
        start = 0
        for c in self.chunks:
            n = len(c["req_id"])
            c = dict(c)
            if t0 is not None:
                for col in _ABSOLUTE_COLS:
                    c[col] = pc.subtract(c[col], pa.scalar(t0, pa.int64()))
            c["seq"] = pa.array(seq[start:start + n], type=pa.int64())
            start += n
            out.append(c)
        return t0, out


class _TraceSpool:
    """Token lists in read order in a temp file; copied out in arrival order at the end."""

    def __init__(self, out: Path, inputs: list[tuple[str, str | os.PathLike]]) -> None:
        self.out = out
        # Not one of the export files nor --db, never over a DuckDB file; parents created.
        prepare_output_path(out, what="--trace-out", inputs=inputs, stream_special=True)
        self._inputs = list(inputs)
        parent = out.parent if str(out.parent) else Path(".")
        try:
            self._fh = tempfile.NamedTemporaryFile(prefix=f".{out.name}.", suffix=".spool", dir=parent, delete=False)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from None
        self.spool_path = Path(self._fh.name)
        # Per request only (arrival, offset, length) stays in memory, as int64 arrays; the rest of
        # its line (id, lengths, tokens) is already in the spool.
        self.arrival = array("q")
        self.offset = array("q")
        self.length = array("q")
        self._pos = 0
        self.text_only = 0
        self.no_prompt = 0
        self.no_arrival = 0
        self.first_text_only: str | None = None
        self._encode = msgspec.json.Encoder().encode

    def add(self, r: SGLangRequest) -> None:
        if r.input_ids is None:
            if r.has_text:
                self.text_only += 1
                if self.first_text_only is None:
                    self.first_text_only = f"{r.file}:{r.line}"
            else:
                self.no_prompt += 1
            return
        if r.received_s is None:
            self.no_arrival += 1
            return
        if r.prompt_tokens == 0:
            self.no_prompt += 1
            return
        # Everything of the trace line but its timestamp (known once the first arrival is).
        body = b"".join((b'"id":', self._encode(r.req_id), b',"input_length":', str(r.prompt_tokens).encode(),
                         b',"output_length":', str(r.completion_tokens or 0).encode(), b',"tokens":',
                         r.input_ids, b"}\n"))
        try:
            self._fh.write(body)
        except OSError as exc:
            raise OutputError(f"cannot write {self.out}: {exc.strerror or exc}") from None
        self.arrival.append(round(r.received_s * NS_PER_S))
        self.offset.append(self._pos)
        self.length.append(len(body))
        self._pos += len(body)

    def write(self, t0_ns: int | None) -> tuple[int, str]:
        """Write the trace in arrival order; (requests written, sha256 of the file)."""
        self._fh.flush()
        self._fh.close()
        n = len(self.arrival)
        digest = hashlib.sha256()
        try:
            arrival = np.frombuffer(self.arrival, dtype=np.int64) if n else np.empty(0, dtype=np.int64)
            order = np.argsort(arrival, kind="stable")
            base = t0_ns if t0_ns is not None else 0
            # The one output writer (tierdiag/paths.py): an exclusive temporary file renamed into
            # place (never through a link at a temporary name), a FIFO or device streamed into.
            with open(self.spool_path, "rb") as src, open_output(self.out, what="--trace-out",
                                                                 inputs=self._inputs) as dst:
                for i in order.tolist():
                    src.seek(self.offset[i])
                    rest = src.read(self.length[i])
                    head = b'{"timestamp":' + str((self.arrival[i] - base) // NS_PER_MS).encode() + b","
                    digest.update(head)
                    digest.update(rest)
                    dst.write(head)
                    dst.write(rest)
        except OSError as exc:
            raise OutputError(f"cannot write {self.out}: {exc.strerror or exc}") from None
        finally:
            self.spool_path.unlink(missing_ok=True)
        return n, digest.hexdigest()

    def discard(self) -> None:
        try:
            self._fh.close()
        finally:
            self.spool_path.unlink(missing_ok=True)


def import_sglang(paths: list[str | os.PathLike], *, db: Path, run_name: str | None = None,
                  trace_out: Path | None = None, skip_bad: bool = False,
                  command_line: list[str] | None = None,
                  progress: Callable[[int, int, int], None] | None = None) -> ImportSummary:
    """Read the export under `paths` into one observed run in `db` (and the trace, if asked).

    `progress(records, bytes read, total bytes)` is called every PROGRESS_EVERY records (total
    counts the files as stored, so a gzipped export reads past it)."""
    t_start = time.perf_counter()
    report = ImportReport()
    records = read_export(paths, with_tokens=trace_out is not None, skip_bad=skip_bad, report=report)
    sources = [("an export file", f) for f in report.files]
    # --db is not one of the export files (nor --trace-out: checked below, against --db too).
    check_output(db, what="--db", inputs=sources, store=True)
    total_bytes = sum(os.path.getsize(f) for f in report.files)
    spool = _TraceSpool(trace_out, sources + [("--db", db)]) if trace_out is not None else None
    cols = _Columns()
    totals = dict(finished=0, aborted=0, ttft=0, timed=0, input=0, device=0, host=0, storage=0, computed=0)
    backends: set[str] = set()
    ranks: set[int] = set()
    try:
        for r in records:
            cols.add(r)
            if progress is not None and cols.n % PROGRESS_EVERY == 0:
                progress(cols.n, report.bytes_read, total_bytes)
            if spool is not None:
                spool.add(r)
            totals["aborted" if r.finish_type == "abort" else "finished"] += 1
            totals["ttft"] += r.ttft_s is not None
            totals["timed"] += r.received_s is not None
            if r.device_tokens is not None:
                totals["input"] += r.prompt_tokens
                totals["device"] += r.device_tokens
                totals["host"] += r.host_tokens
                totals["storage"] += r.storage_tokens
                totals["computed"] += r.prompt_tokens - r.reused_tokens
            if r.storage_backend:
                backends.add(r.storage_backend)
            if r.dp_rank is not None:
                ranks.add(r.dp_rank)
        if cols.n == 0:
            skipped = f" ({report.bad_lines:,} bad lines skipped)" if report.bad_lines else ""
            raise TraceError(f"{', '.join(report.files)}: no requests in the export{skipped}")
        t0, chunks = cols.finish()
        trace_n, trace_sha = spool.write(t0) if spool is not None else (0, None)
    except KeyboardInterrupt:
        if spool is not None:
            spool.discard()
        raise RunInterrupted(f"interrupted while reading the export; nothing recorded in {db}"
                             + (f", no {trace_out} written" if trace_out is not None else "")) from None
    except BaseException:
        if spool is not None:
            spool.discard()
        raise

    span_s = None
    if t0 is not None:
        last = max((pc.max(c["finish_ns"]).as_py() or 0) for c in chunks)
        span_s = last / NS_PER_S
    config = {"source": "sglang", "export_files": report.files, "metrics_enabled": totals["timed"] > 0,
              "storage_backends": sorted(backends), "first_arrival_epoch_ns": t0,
              "trace_out": str(trace_out) if trace_out is not None else None, "trace_out_sha256": trace_sha,
              # The data-parallel ranks the export names (None: it names none): the twin's --dp default.
              "dp_ranks": len(ranks) or None}
    label = " ".join(str(p) for p in paths)
    name = run_name or _default_name(paths)
    run_id = _write_run(db, chunks, name=name, trace_path=label, trace_sha256=_files_fingerprint(report.files),
                        config=config, command_line=command_line, num_requests=cols.n, t_start=t_start,
                        trace_out=trace_out)

    warnings = []
    if spool is not None and spool.text_only:
        warnings.append(f"{spool.text_only:,} request{'s were' if spool.text_only != 1 else ' was'} exported as "
                        f"text only (no token ids, first at {spool.first_text_only}) and left out of "
                        f"{trace_out}; {KEEP_TOKEN_IDS_HINT}")
    if spool is not None and spool.no_prompt:
        warnings.append(f"{spool.no_prompt:,} request(s) exported without their prompt (no input_ids and no "
                        f"text) left out of {trace_out}; {KEEP_TOKEN_IDS_HINT}")
    if spool is not None and spool.no_arrival:
        warnings.append(f"{spool.no_arrival:,} request(s) without request_received_ts left out of {trace_out}: "
                        f"no arrival time to replay (launch SGLang with {METRICS_FLAG})")
    if not totals["timed"]:
        warnings.append(f"the export has no timing fields (SGLang ran without {METRICS_FLAG}): arrival, "
                        f"queue time, TTFT and finish time are NULL; only the tier split is known")
    if report.incomplete_tails:
        warnings.append(f"left out {len(report.incomplete_tails)} incomplete last line(s) (the server still "
                        f"writing, or a crash), first at {report.incomplete_tails[0]}")
    if report.details_mismatch:
        warnings.append(f"{report.details_mismatch:,} request(s) with cached_tokens different from the sum of "
                        f"cached_tokens_details (first: {report.first_mismatch}); the split was used")
    return ImportSummary(
        run_id=run_id, db_path=str(db), run_name=name, files=report.files,
        num_requests=cols.n, num_finished=totals["finished"], num_aborted=totals["aborted"],
        num_with_ttft=totals["ttft"], input_tokens=totals["input"], device_tokens=totals["device"],
        host_tokens=totals["host"], storage_tokens=totals["storage"], computed_tokens=totals["computed"],
        span_s=span_s, bad_lines=report.bad_lines, first_bad=list(report.first_bad),
        details_mismatch=report.details_mismatch, first_mismatch=report.first_mismatch,
        metrics_enabled=totals["timed"] > 0, storage_backends=sorted(backends), dp_ranks=len(ranks) or None,
        trace_out=str(trace_out) if trace_out is not None else None, trace_requests=trace_n,
        trace_text_only=spool.text_only if spool else 0, trace_no_prompt=spool.no_prompt if spool else 0,
        trace_no_arrival=spool.no_arrival if spool else 0, wall_s=time.perf_counter() - t_start,
        warnings=warnings)


def _write_run(db: Path, chunks: list[dict[str, pa.Array]], *, name: str, trace_path: str, trace_sha256: str,
               config: dict, command_line: list[str] | None, num_requests: int, t_start: float,
               trace_out: Path | None) -> str:
    """The runs row and every request in one transaction (all or nothing); the run's id.

    Signals wait until it has committed or rolled back; one that came meanwhile is raised then,
    as RunInterrupted saying which: recorded whole, or nothing recorded (while waiting for a busy
    --db, before anything was written)."""
    # Imported here: the reading above needs no database, and a bad export should not create one.
    from tierdiag.store.copy_run import open_destination, write_run_tables
    from tierdiag.store.schema import SCHEMA_VERSION, new_run_id

    run_id = new_run_id()
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    row = {"run_id": run_id, "name": name, "created_at": now, "finished_at": now, "status": "complete",
           "schema_version": SCHEMA_VERSION, "tierdiag_version": __version__,
           "command_line": " ".join(command_line if command_line is not None else sys.argv),
           "pid": os.getpid(), "hostname": socket.gethostname(), "trace_path": trace_path,
           "trace_sha256": trace_sha256, "config_json": json.dumps(config, sort_keys=True, default=str),
           "hardware_json": "{}", "data_plane_json": "{}", "timing": OBSERVED_TIMING, "num_requests": num_requests,
           "wall_s": time.perf_counter() - t_start, "error": None, "kind": RunKind.OBSERVED, "sweep_id": None}
    runs = pa.table({k: pa.array([v], type=_RUNS_TYPES.get(k, pa.string())) for k, v in row.items()})
    requests = pa.Table.from_batches([pa.RecordBatch.from_pydict(
        {**c, "run_id": pa.repeat(pa.scalar(run_id, pa.string()), len(c["req_id"]))}) for c in chunks])
    committed = False
    try:
        with signals.deferred():
            # A damaged, foreign or busy --db is refused before the transaction, as RunWriter does.
            open_destination(db, check=True).close()
            write_run_tables(db, {"runs": runs, "requests": requests})
            committed = True
    except KeyboardInterrupt:
        trace = "" if trace_out is None else f"; {trace_out} was written"
        if committed:
            raise RunInterrupted(f"interrupted after the import was recorded: run {run_id} is complete in {db} "
                                 f"({num_requests:,} requests){trace}") from None
        raise RunInterrupted(f"interrupted before the import was recorded; nothing recorded in {db}{trace}") from None
    return run_id


# The runs row's typed columns (store/schema.py); the rest are VARCHAR.
_RUNS_TYPES = {"created_at": pa.timestamp("us"), "finished_at": pa.timestamp("us"), "schema_version": pa.int32(),
               "pid": pa.int32(), "num_requests": pa.int64(), "wall_s": pa.float64()}


def _default_name(paths: list[str | os.PathLike]) -> str:
    first = Path(paths[0])
    return f"sglang-{first.name if first.is_dir() else first.stem.split('.')[0]}"


def _files_fingerprint(files: list[str]) -> str:
    """Identity of the export without re-reading gigabytes: names, sizes and mtimes, hashed."""
    digest = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        digest.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
