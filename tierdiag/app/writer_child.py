"""The replay's writer process: the store's writer loop (store/writer_process.py) with the
replay's close hook (diagnose/run/close.py: the run evidence and the closing numbers)."""

from __future__ import annotations

# The child's `python -c` code; also how a test tells the writer apart from other processes.
ENTRY = "from tierdiag.app.writer_child import main; main()"


def main() -> None:
    # No collector pass until the store is open (store/writer_serve.py `main` settles it then):
    # what the start makes (duckdb, pyarrow, numpy and the close's modules, ~45k objects) lives to
    # the process's exit, and ~90 passes walked it as it came, ~12 ms of the writer's CPU before
    # its first take (issue 41, session 36).
    import gc

    gc.disable()
    # The methods `dataclasses` and namedtuple compile from text for each class the writer's
    # modules make (the close's evidence, the store's writer, the read-ahead: ~530 and ~70), read
    # compiled from the writer's own table (tierdiag/dataclass_code.py) instead of compiled at
    # every start: ~25 % of the writer's instructions before its first take, CPU that ran beside
    # the engine's first steps on a 2-core machine (issue 41, session 25).
    from tierdiag import dataclass_code

    dataclass_code.install(table="writer")
    from tierdiag.diagnose.run import close
    from tierdiag.store import writer_serve

    def after_commit(con, db_path, run_id: str, status: str):
        try:
            return close.after_commit(con, db_path, run_id, status)
        finally:
            # The writer ends by os._exit (no atexit): what it compiled anew (a first run, or one
            # after an edit) is written back here, once the close's modules are all imported;
            # nothing where the table had it all or bytecode is not written.
            dataclass_code.write_back()

    writer_serve.main(after_commit=after_commit, preload=close.PRELOAD, while_recording=while_recording)


def while_recording(run: dict):
    """Once the store is open, while the engine runs: start reading the trace's pages for the
    run's size curves (diagnose/run/size_curves.py `read_ahead`), which the close would
    otherwise read then, on the path the replay waits for, and then their pass, fed the rows as
    they come (diagnose/run/live_curves.py); and fold the run story's per-request rows from the
    rows as they are taken (diagnose/run/story_rows.py). Returns what the writer hands each
    batch of rows it takes (None: nothing)."""
    from tierdiag.diagnose.run import story_rows
    from tierdiag.diagnose.run.size_curves import read_ahead

    feeds = [f for f in (read_ahead(run.get("trace_path"), run.get("trace_sha256"), run.get("config") or {}),
                         getattr(story_rows.start(run), "take", None)) if f is not None]
    if len(feeds) <= 1:
        return feeds[0] if feeds else None

    def each(taken) -> None:
        for feed in feeds:
            feed(taken)

    return each
