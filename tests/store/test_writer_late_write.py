"""The writer process's late writes (store/writer_serve.py `late_write_due`): past half of the
trace's requests handed over, the rows pending are written whatever the interval says once they
are as many as those still to come (and at least LATE_LEAST of the trace's), so that what the
close writes on the path the replay waits for is a small share of the rows, not anything up to a
whole interval's (issue 41, benchmarks/README.md session 23 h41close5). How far the run is comes
from the trace's lines (`trace_lines`, counted on a thread once the store is open) and the
request rows taken."""

from __future__ import annotations

import os
import queue
import types

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tests.support.serve_writer import CountingWriter
from tests.support.unreadable import as_a_reader, unreadable
from tierdiag.store import writer_serve
from tierdiag.store.writer_serve import LATE_FROM, LATE_LEAST, late_write_due, trace_lines

_LINE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINE, max_size=60), st.booleans())
def test_trace_lines_counts_each_line_the_last_one_without_its_newline(tmp_path_factory, lines, last_newline):
    """Every line counts (blank ones, unicode, escapes, a NUL: the count is an estimate of the
    requests, the reader decides what each line is), the last one with or without its newline;
    an empty file has none."""
    path = tmp_path_factory.mktemp("lines") / "t\u00e9 \\n.jsonl"
    body = "\n".join(lines) + ("\n" if last_newline and lines else "")
    path.write_bytes(body.encode("utf-8", "surrogatepass"))
    assert trace_lines(str(path)) == len(lines) - (1 if lines and not last_newline and lines[-1] == "" else 0)


def test_trace_lines_over_reads_of_a_megabyte(tmp_path):
    """Lines across the 1 MiB reads: none counted twice, the last one without its newline too."""
    path = tmp_path / "big.jsonl"
    line = b"x" * 999 + b"\n"
    path.write_bytes(line * 3000 + b"tail")
    assert trace_lines(str(path)) == 3001
    path.write_bytes(line * 3000)
    assert trace_lines(str(path)) == 3000


@pytest.mark.parametrize("make", ["none", "empty", "missing", "folder", "fifo", "nul", "unreadable"])
def test_trace_lines_is_none_where_it_cannot_count_a_file(tmp_path, make):
    """Not a regular file that can be read (no path, a folder, a pipe the engine read, a name
    with a NUL, one that is gone or unreadable): None, so no late write, and nothing raised."""
    path: object = tmp_path / "t.jsonl"
    if make == "none":
        path = None
    elif make == "empty":
        path = ""
    elif make == "folder":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)
    elif make == "nul":
        path = str(tmp_path / "a\x00b")
    elif make == "unreadable":  # (as root too: counted where mode bits hold)
        path.write_text("{}\n")
        unreadable(path)
        assert as_a_reader("import sys; from tierdiag.store.writer_serve import trace_lines\n"
                           "print(trace_lines(sys.argv[1]))", str(path)) == "None"
        return
    assert trace_lines(None if path is None else str(path)) is None


@settings(max_examples=500, deadline=None)
@given(st.integers(-10, 10**7), st.one_of(st.none(), st.integers(-10**6, 10**7)), st.integers(0, 10**7))
def test_a_late_write_is_due_when_what_is_pending_is_as_much_as_what_is_to_come(taken, expected, at_write):
    """Due from LATE_FROM of the expected requests taken while LATE_LEAST of them are still to
    come (the close writes the rest), where what was taken since the last write began is at
    least what is still to come. Never with no count (a pipe: None; zero or a nonsense count)."""
    got = late_write_due(taken, expected, at_write)
    if expected is None or expected <= 0:
        assert got is False
        return
    rest = expected - taken
    want = LATE_FROM * expected <= taken and rest >= LATE_LEAST * expected and taken - at_write >= rest
    assert got == want
    if got:
        assert late_write_due(taken, expected, taken) is False  # once written, not due again at once


@pytest.mark.parametrize("expected", [16, 100, 1000, 12031, 10**6])
def test_without_other_writes_each_late_write_halves_the_rest(expected):
    """One request taken at a time and written whenever due: writes at 50, 75, 87.5 and 93.75 %
    of the trace (to the request), none after, so the close writes at most a sixteenth."""
    writes, at = [], 0
    for taken in range(1, expected + 1):
        if late_write_due(taken, expected, at):
            writes.append(taken)
            at = taken
    shares = [w / expected for w in writes]
    assert len(writes) <= 4
    assert all(abs(got - want) <= 1 / expected + 1e-9 for got, want in zip(shares, (0.5, 0.75, 0.875, 0.9375)))
    assert 1 - shares[-1] <= 1 / 16 + 1 / expected


def _serve(expected):
    serve = writer_serve._Serve(inbox=queue.SimpleQueue(), reply_fd=-1)
    serve.writer = CountingWriter()
    serve.every = serve.every_max = serve.most = 1e9  # the interval never due: only the late write
    serve.expected = expected
    return serve


def _batch(n: int) -> dict:
    return {"requests": {"seq": pa.array(range(n), pa.int64())}, "batches": {"batch_id": pa.array([1, 2])}}


def test_the_serving_loop_writes_late_as_the_run_nears_its_end():
    """1,000 requests handed 50 at a time with an interval that never comes: writes at the first
    batch at or past 50, 75, 87.5 and 93.75 % (500, 750, 900, 950), none for batches without
    request rows, none with the last batch (the close writes it)."""
    serve = _serve(1000)
    for _ in range(20):
        serve.rows(_batch(50))
        serve.rows({"batches": {"batch_id": pa.array([3])}})
    assert serve.writer.writes == [500, 750, 900, 950]
    assert serve.taken == 1000


def test_a_late_write_waits_for_an_empty_inbox_then_comes_at_the_next_batch():
    """More already handed over (or the close) is nearer the end than this batch: the late write
    waits, and comes with the next batch taken when nothing else is waiting."""
    serve = _serve(100)
    serve.rows(_batch(40))
    serve.inbox.put(b"more")
    serve.rows(_batch(20))  # 60 in, but more waits
    assert serve.writer.writes == []
    serve.inbox.get()
    serve.rows(_batch(1))
    assert serve.writer.writes == [61]


def test_no_late_write_soon_after_another_write_or_without_a_count():
    """A write (the interval's) leaves what was pending written: the next late one waits until as
    much is pending as is to come. Without a count (a trace read through a pipe) the interval
    alone decides, as before."""
    serve = _serve(100)
    serve.rows(_batch(45))
    serve.write()  # the interval's write, at 45 %
    serve.rows(_batch(25))  # 70 in: 25 pending, 30 to come
    assert serve.writer.writes == [45]
    serve.rows(_batch(5))  # 75 in: 30 pending, 25 to come
    assert serve.writer.writes == [45, 75]
    serve = _serve(None)
    for _ in range(10):
        serve.rows(_batch(10))
    assert serve.writer.writes == []


def test_the_writer_process_counts_the_trace_it_opens(tmp_path):
    """_Serve.open counts the lines of the run's trace on a thread (`expected`); a trace that is
    not a file leaves it None."""
    import tierdiag.store.writer as W

    class Serve(writer_serve._Serve):
        def reply(self, msg):
            return True

    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n" * 37)
    real = W.RunWriter
    W.RunWriter = lambda **kw: types.SimpleNamespace(host=None)  # the open names its host to duckdb_core.purge_on
    try:
        for path, want in ((str(trace), 37), (str(tmp_path / "gone.jsonl"), None), ("-", None)):
            serve = Serve(inbox=None, reply_fd=-1)
            assert serve.open({"writer": {"trace_path": path}, "write_every_s": 1.0})
            import threading

            for thread in threading.enumerate():
                if thread.name == "tierdiag-trace-lines":
                    thread.join(10)
            assert serve.expected == want
    finally:
        W.RunWriter = real
