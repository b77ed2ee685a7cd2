"""The run story's per-request rows (diagnose/read/run_context.py `story_requests`: every
finished request's wait window, queue, excess TTFT, primary cause code, own TTFT parts and what
it lost while it waited) made while the run is recorded, from the request rows the store's
writer process takes, so that the close, which the replay waits for, does not query them.

On the conversation trace that query was ~19-21 ms of the close's CPU (issue 41, session 24
h41ev6: the largest single query of the evidence; ~12 ms of it DuckDB planning the cause
expression), on the story's thread, which the run context waits for. A request's row is final
once handed over (rows are only ever inserted: nothing updates a `requests` row after its
insert), so each batch's part is what the store's query would read of those rows: the same
columns, computed in numpy from the batch's Arrow columns (read/run_context.py
`taken_story_rows`: a DuckDB query a batch cost ~16 ms of planning each), on the writer's main
thread right after the batch is taken (the writer idles between takes while the engine runs;
~0.5 ms a batch of ~600 rows). The close takes the parts (`story_rows`) only where they are the run's
committed finished rows (their count and the sum of their seqs, one scan of two columns) and
every one carried the engine's own lost-while-queued count; anything else (an inline writer, a
batch it could not project, a run of LARGE_RUN_REQUESTS requests or more, whose parts would be
held through the run: the 1M row's memory; values the SQL would compute differently: a NULL it
keeps, a negative it divides, a magnitude past int64's reach) and the story queries the store as
before. Both give the same arrays (tests/diagnose/test_story_rows.py)."""

from __future__ import annotations

import duckdb

# (at the top: the close's evidence threads import nothing, tests/reliability/test_thread_imports.py)
from tierdiag.diagnose.read.folded import folded_rows_check

# Past this many request rows taken, the parts are let go and the close queries (the evidence's
# large runs' plan, diagnose/run/evidence.py LARGE_RUN_REQUESTS: ~100 bytes a finished request
# held through the run otherwise).
MOST_ROWS = 100_000


class StoryRows:
    """The story's parts of the request rows of run `run_id`, batch by batch (`take`), for its
    close (`result`). Never raises from `take`: a batch it cannot project gives the parts up."""

    def __init__(self, run_id: str, most_rows: int = MOST_ROWS):
        self.run_id = run_id
        self.most_rows = most_rows
        self.parts: list[dict] = []
        self.rows = 0  # request rows taken
        self.finished = 0  # of them finished (the parts' rows)
        self.seq_sum = 0
        self.off: str | None = None  # why the parts were given up (the close queries then)
        # The run context's parts of the same batches (context_rows.py), given up alone where a
        # batch has what they cannot project (the story's parts kept).
        self.context_parts: list[dict] | None = []
        # The eviction queries' parts of the same batches (eviction_rows.py: their requests,
        # evictions and re-references), checked with the story's; None once given up (the
        # close queries them then), alone where it is what they cannot take.
        from tierdiag.diagnose.run.eviction_rows import EvictionRows

        self.evictions: EvictionRows | None = EvictionRows()
        # The run-wide sums' parts of the same batches (scan_rows.py: read/run_scan.py's one
        # query), checked with the story's; None once given up (the close queries them then).
        from tierdiag.diagnose.run.scan_rows import ScanRows

        self.scan: ScanRows | None = ScanRows()

    def take(self, taken: dict | None) -> None:
        """A batch of rows the writer took (table -> column -> Arrow array); None: no more come."""
        if taken is None:
            return
        requests = taken.get("requests")
        if self.off is not None:
            return
        if not requests:
            self._take_folds(taken)
            return
        try:
            from tierdiag.diagnose.read.run_context import taken_story_rows

            self.rows += len(next(iter(requests.values())))
            if self.rows >= self.most_rows:
                self._give_up("a large run: its close queries the store")
                return
            part = taken_story_rows(requests)
            if part is None:
                self._give_up("rows the story's SQL reads otherwise (a NULL it keeps, a value past numpy's)")
                return
            self.parts.append(part)
            if self.context_parts is not None:
                self._take_context(requests)
            self.finished += len(part["seq"])
            self.seq_sum += int(part["seq"].sum(dtype="int64")) if len(part["seq"]) else 0
        except Exception as exc:  # noqa: BLE001 - the close queries the store instead, as without a writer process
            self._give_up(f"{type(exc).__name__}: {exc}")
            return
        self._take_folds(taken)

    def _take_folds(self, taken: dict) -> None:
        """The eviction queries' and the run's scan's parts of a batch (eviction_rows.py,
        scan_rows.py); a fold that cannot project it (what it raises, or rows it declines) gives
        up its own parts alone: the close queries them."""
        self.evictions = _fed(self.evictions, taken)
        self.scan = _fed(self.scan, taken)

    def _take_context(self, requests: dict) -> None:
        """The run context's part of a batch whose story part was taken; what it cannot project
        (None, or what it raises) gives up the context's parts alone: the close queries them."""
        from tierdiag.diagnose.run.context_rows import taken_context_rows

        try:
            more = taken_context_rows(requests)
        except Exception:  # noqa: BLE001 - the context's queries then, as without a fold
            more = None
        if more is None:
            self.context_parts = None
        else:
            self.context_parts.append(more)

    def _give_up(self, why: str) -> None:
        self.off = why
        self.parts = []
        self.context_parts = None
        self.evictions = None
        self.scan = None

    def result(self, con: duckdb.DuckDBPyConnection, run_id: str):
        """The run's StoryRequests from the parts, where they are its committed finished rows
        (checked on `con`, the store); None otherwise (the caller queries)."""
        return self.results(con, run_id)[0]

    def results(self, con: duckdb.DuckDBPyConnection, run_id: str) -> tuple:
        """(StoryRequests, context_rows.ContextRows) from the parts, where they are the run's
        committed finished rows (checked on `con`, the store, once for both); each None where
        there are none to use (the caller queries)."""
        return self.results_all(con, run_id)[:2]

    def results_all(self, con: duckdb.DuckDBPyConnection, run_id: str) -> tuple:
        """`results`' two and eviction_rows.EvictionResults (the eviction queries' results),
        checked with them, in the same statement (read/folded.py `folded_rows_check`); each None
        where there are none to use (the caller queries)."""
        return self.results_scan(con, run_id)[:3]

    def results_scan(self, con: duckdb.DuckDBPyConnection, run_id: str) -> tuple:
        """`results_all`'s three and the run's scan (read/run_scan.py RunScan, its miss reasons'
        sums included) from scan_rows.py's parts, all checked in one statement
        (read/folded.py `folded_rows_check`); each None where there are none to use (the
        caller queries)."""
        import numpy as np

        from tierdiag.diagnose.read.rows import has_miss_columns
        from tierdiag.diagnose.read.run_context import story_requests_of, story_rows_check
        from tierdiag.diagnose.read.run_scan import scan_of_row
        from tierdiag.diagnose.run.context_rows import context_rows

        if self.off is not None or run_id != self.run_id or not self.parts or not has_miss_columns(con):
            return None, None, None, None
        evictions, self.evictions = self.evictions, None
        scan, self.scan = self.scan, None
        if evictions is None and scan is None:
            if story_rows_check(con, run_id) != (self.finished, self.seq_sum):
                return None, None, None, None
        else:
            have = folded_rows_check(con, run_id)
            if have[:2] != (self.finished, self.seq_sum):
                return None, None, None, None
            if evictions is not None and have[2:7] != evictions.check():
                evictions = None
            if scan is not None and (have[2], *have[7:]) != scan.check():
                scan = None
        parts, self.parts = self.parts, []
        more, self.context_parts = self.context_parts, None
        columns = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        row = scan.row() if scan is not None else None
        return (story_requests_of(columns), (context_rows(more) if more else None),
                evictions.results() if evictions is not None else None,
                scan_of_row(row, True) if row is not None else None)


def _fed(fold, taken: dict):
    """`fold` (an EvictionRows or a ScanRows) once it took a batch, or None where it is given up:
    it was already, raised on the batch, or declined its rows (`off`)."""
    if fold is None:
        return None
    try:
        fold.take(taken)
    except Exception:  # noqa: BLE001 - its queries then, as without a fold
        return None
    return fold if fold.off is None else None


_FOLDS: list[StoryRows] = []  # at most one: the run this process is recording


def start(run: dict) -> StoryRows | None:
    """A fold for the run the writer process records (`run`: RunWriter's arguments); its `take`
    is what to hand each batch of rows taken. None without a run id, or for a trace file of
    MOST_ROWS lines or more (counted: ~1.5 ms on the conversation trace, ~0.13 s for 1M synth
    requests; a trace read through a pipe has no count: the fold gives up at MOST_ROWS rows)."""
    from tierdiag.store.writer_serve import trace_lines

    run_id = run.get("run_id")
    if not run_id:
        return None
    lines = trace_lines(run.get("trace_path"))
    if lines is not None and lines >= MOST_ROWS:
        return None
    fold = StoryRows(str(run_id))
    _FOLDS[:] = [fold]
    return fold


def story_rows(con: duckdb.DuckDBPyConnection, run_id: str, *, use: bool = True):
    """The story's rows of run `run_id` folded while it was recorded (StoryRequests), once (the
    fold is let go either way; `use` False: only that): None where there are none to use (the
    story then queries: read/run_context.py story_requests)."""
    return folded_rows(con, run_id, use=use)[0]


def folded_rows(con: duckdb.DuckDBPyConnection, run_id: str, *, use: bool = True) -> tuple:
    """(the story's rows, the run context's: context_rows.ContextRows, the eviction queries':
    eviction_rows.EvictionResults, the run's scan: read/run_scan.py RunScan) of run `run_id`
    folded while it was recorded, once (the fold is let go either way; `use` False: only that):
    each None where there are none to use (then queried: read/run_context.py, read/totals.py,
    read/run_scan.py)."""
    if not _FOLDS:
        return None, None, None, None
    fold = _FOLDS.pop()
    return fold.results_scan(con, run_id) if use else (None, None, None, None)
