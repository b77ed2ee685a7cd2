"""DuckDB's C extension as `duckdb` for a read command's process, its Python package loaded only
if something asks for it (start-up: issue 41).

`import duckdb` (DuckDB 2.x) runs the package around the C extension `_duckdb`: `_relation`
(the relational API, ~4,500 lines that import dataclasses, inspect, html, secrets, random,
decimal, uuid), `_version` (importlib.metadata: email, zipfile, csv) and `_sources` (ctypes).
That was ~90 ms of CPU of `summary`'s ~0.3 s, where `_duckdb` alone is ~10 ms. The readers use
what the C extension holds (connect, execute, fetchall / fetchone / fetchnumpy, the exception
classes), and the package re-exports those very objects, so `except duckdb.Error` catches the
same class either way.

`install()` puts a module named `duckdb` in sys.modules whose attributes are `_duckdb`'s. Any
other name (`duckdb.sql`, `duckdb.DuckDBPyRelation`, `__path__` for a submodule such as
`duckdb.sqltypes`), and any method the package adds to DuckDBPyConnection (`con.sql`,
`con.table`, `con.arrow`, ...), imports the whole package at that moment and answers from it:
it loads later, that is all. One thing is not deferred: the scans of Python objects
(`SELECT ... FROM a_local_arrow_table`), whose scanners the package hands `_duckdb` as it loads
(`_set_arrow_sources` reads them at once, and the package warns against importing its modules
while a query runs). Until the package is loaded such a scan is DuckDB's InvalidInputException
("... the duckdb package did not set up duckdb._sources"); the readers read the store's tables
and nothing else, and in a process where the package has loaded, scans are as ever.

cli/main.py installs it for the plain forms of `summary` and `explain`, whose process ends with
the command, before anything imports `duckdb`. Where `duckdb` is loaded already, or the C
extension is not a top-level `_duckdb` (DuckDB 1.x: `duckdb.duckdb`), nothing is installed.
"""

from __future__ import annotations

import sys
import types

_HOOK = "__getattr__"


def install() -> bool:
    """Install the core-only `duckdb` (module doc); whether it did."""
    if "duckdb" in sys.modules:
        return False
    try:
        import _duckdb
    except ImportError:
        return False
    conn = getattr(_duckdb, "DuckDBPyConnection", None)
    if conn is None or _HOOK in conn.__dict__:
        return False
    core = types.ModuleType("duckdb", _duckdb.__doc__)
    core.__dict__.update({k: v for k, v in _duckdb.__dict__.items() if not k.startswith("__")})
    core.__version__ = getattr(_duckdb, "__version__", None)

    def package_attribute(name: str):  # PEP 562: a name `_duckdb` lacks
        return getattr(load_package(core), name)

    def connection_attribute(self, name: str):  # only where the ordinary lookup found nothing
        load_package(core)
        return object.__getattribute__(self, name)

    core.__getattr__ = package_attribute
    setattr(conn, _HOOK, connection_attribute)
    sys.modules["duckdb"] = core
    return True


def load_package(core: types.ModuleType) -> types.ModuleType:
    """Import DuckDB's whole package in the core module's place; the core module (held by every
    module that imported `duckdb` before) then holds the package's names."""
    import importlib

    import _duckdb

    conn = _duckdb.DuckDBPyConnection
    if _HOOK in conn.__dict__:
        delattr(conn, _HOOK)  # before the import: the package's own look-ups must not come back here
    if sys.modules.get("duckdb") is core:
        del sys.modules["duckdb"]
    try:
        package = importlib.import_module("duckdb")
    except BaseException:
        sys.modules.setdefault("duckdb", core)
        raise
    core.__dict__.pop(_HOOK, None)
    core.__dict__.update({k: v for k, v in package.__dict__.items() if k not in ("__name__", "__spec__", "__loader__")})
    return package


def release_cached_blocks(con) -> bool:
    """Make the database instance of `con` let go of the blocks its buffer pool keeps cached after
    queries (the tables' blocks read, a sort's or a join's buffers no longer pinned): its memory
    limit set to a megabyte for one statement, which evicts every unpinned block, then reset.
    Measured on a 1M-request store (issue 41): a `curve_columns`-sized query left the process at
    190 MB resident once its arrays were dropped, 99 MB after this; duckdb_memory() counted 23 MB
    of it. Whether it could evict them all or not, no query is refused by it, and whatever it
    finds it resets to the default limit (the writer's instance never sets another); True where
    the limit could be lowered. Call it only where no other query of the same instance runs (a
    cursor on another thread): for that statement the instance's limit is a megabyte."""
    import duckdb

    try:
        con.execute("SET memory_limit = '1MB'")
        lowered = True
    except duckdb.Error:  # a block still pinned: nothing changed, nothing to undo
        lowered = False
    con.execute("RESET memory_limit")
    return lowered


def purge_freed_memory(con) -> bool:
    """Have DuckDB's allocator (the jemalloc inside `_duckdb`) hand what its queries freed back to
    the system within about a second, on threads of its own (`allocator_background_threads`: the
    whole process's DuckDB, every connection). DuckDB flushes it only after a task on one of its
    worker threads, and a connection of one thread (ours: store/reader.py) has none, so a large
    query's sort and result buffers stayed resident after it: a `curve_columns` of a 1M-request
    store (issue 41) left 194-202 MB resident once its arrays were dropped, 115 MB a second after
    with this set. Nothing is refused by it; a DuckDB without the setting is left as it is. True
    where it is set."""
    import duckdb

    try:
        con.execute("SET allocator_background_threads = true")
    except duckdb.Error:  # no such setting in this DuckDB (or no such threads here): as before
        return False
    return True


_PURGING: list = []  # the connection `purge_from_now` set it on, held for the process's life
_LIFELONG: list = []  # `purge_on`'s connection, where one was named


def purge_on(con) -> None:
    """Name the connection `purge_from_now` asks on instead of opening an instance of its own: one
    whose instance stays open for the process's life, with no query of it running on another
    thread when `purge_from_now` is called (the writer process's own: store/writer_serve.py, its
    RunWriter's, which holds no file between writes). The setting is the process's, whichever
    instance asks: an idle instance of its own was a second DuckDB instance in the writer, ~15 ms
    of its CPU (~95 M instructions: its catalog and static extensions) and ~8 threads, to set it
    (issue 41, session 36). Nothing is set here; None names none."""
    _LIFELONG[:] = [] if con is None else [con]


def purge_from_now() -> bool:
    """`purge_freed_memory` for this whole process from now on, before any connection of ours is
    at hand (the writer process, once recording starts: its writes' inserts and checkpoints left
    +50-190 MB resident each until the close): DuckDB's allocator is the process's, and it purges
    on its threads while an instance that asked for them is open (DuckDB 2.0.1 stops them as any
    instance is closed), so it is asked on the connection `purge_on` named, else a small idle
    in-memory instance (one thread) is opened, set, and kept. True where it is set."""
    if _PURGING:
        return True
    import duckdb

    for con in _LIFELONG:
        if purge_freed_memory(con):  # a closed one refuses: an instance of its own then
            _PURGING.append(con)
            return True
    try:
        con = duckdb.connect(":memory:", config={"threads": 1})
    except duckdb.Error:
        return False
    if not purge_freed_memory(con):
        con.close()
        return False
    _PURGING.append(con)
    return True


_TRIM: list = []  # malloc_trim, looked up once (None: no such call in this C library)


def release_freed_heap() -> bool:
    """Hand the pages of the heap that glibc keeps after frees back to the system (`malloc_trim(0)`;
    nothing where the C library has no such call): whether it was called. Not DuckDB's memory
    (that is `purge_freed_memory`'s): the process's own C heap, which the writer process fills and
    frees on several threads (the read-ahead, the live pass, the rows' columns decoded from the
    engine's hand-overs), each thread's allocations from an arena of its own, and glibc keeps what
    an arena freed for that arena: measured on a 100k-request replay (benchmarks/writer_memory.py
    --trim), ~100-150 MB of the writer's resident set was such freed heap (issue 41, the 1M row's
    memory); DuckDB allocates from its own allocator, so rows a write lets go (store/writer.py
    `RunWriter.let_rows_go`) made room for its transaction only once handed back. What is
    allocated after is the same; only the resident set is smaller. ~1-20 ms a call."""
    if not _TRIM:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL(None).malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _TRIM.append(fn)
    if _TRIM[0] is None:
        return False
    _TRIM[0](0)
    return True


# The most threads `alone_threads` gives an instance: the machine's usable CPUs, at most this many
# (the writer's close runs it where the engine's process only waits for the answer: its core is idle).
ALONE_THREADS = 2


def alone_threads(con, threads: int) -> int | None:
    """Let the instance of `con` run its next queries on more threads: min(`threads`, ALONE_THREADS,
    the usable CPUs), where that is more than it has (our connections run on one: store/reader.py).
    Returns the threads it had, for `restore_threads`, where it raised them; None where nothing was
    changed (asked for no more than it has, one CPU, a DuckDB that refused). Call it only where no
    other query of the instance runs meanwhile, and only for queries whose result does not depend on
    how their work is split (no floating-point sums: their order would; a sort on a key that orders
    every row does not), as the request lookup's hash and sort by (bucket, seq) (store/lookup.py:
    ~1.6 s of a 1M-request close on one thread; issue 41)."""
    import os

    import duckdb

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    n = min(int(threads), ALONE_THREADS, cpus)
    try:
        had = int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        if n <= had:
            return None
        con.execute(f"SET threads = {n}")
    except duckdb.Error:
        return None
    return had


def restore_threads(con, had: int) -> None:
    """The instance of `con` back on the `had` threads `alone_threads` returned."""
    con.execute(f"SET threads = {int(had)}")


# The least limit `hold_memory` sets: under it DuckDB refuses even a settings query (a limit of a
# few bytes: out of memory at `SELECT current_setting(...)`), and a write of the widest table
# failed at 32 MB (the `requests` table's 69 columns pin a segment each as they are appended).
HOLD_LEAST_BYTES = 64 << 20


def hold_memory(con, limit_bytes: int) -> str | None:
    """Bound the buffer-managed memory of `con`'s DuckDB instance (the tables' cached blocks, a
    transaction's rows, a checkpoint's merged row groups) at `limit_bytes` until `lift_memory`,
    what passes it spilled to a folder of its own made here in the system's temporary directory
    (never the current directory, DuckDB's default `.tmp`): returns that folder, for
    `remove_spill` once the instance is done with; None where nothing was set (a DuckDB that
    refused either setting, no temporary directory to make it in, a limit not an int of at least
    HOLD_LEAST_BYTES).
    DuckDB fails a statement whose pinned memory alone passes the limit, and a failed checkpoint
    invalidates the database, so the limit must stay well above what a statement pins (measured:
    a 1M-request store's writes of ~30k requests checkpointed at 100 MB, failed at 32 MB; issue 41,
    benchmarks/README.md session 34 h44peak)."""
    import shutil
    import tempfile

    import duckdb

    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < HOLD_LEAST_BYTES:
        return None
    try:
        folder = tempfile.mkdtemp(prefix="tierdiag-spill-")
    except OSError:
        return None
    try:
        con.execute("SET temp_directory = '" + folder.replace("'", "''") + "'")
        con.execute(f"SET memory_limit = '{limit_bytes}B'")
    except duckdb.Error:
        for reset in ("RESET memory_limit", "RESET temp_directory"):
            try:
                con.execute(reset)
            except duckdb.Error:  # no such setting here: it was never changed
                continue
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


def lift_memory(con) -> None:
    """`hold_memory`'s limit lifted: DuckDB's default again (its spill folder stays set, so that
    whatever spills later lands there too, not in the current directory)."""
    con.execute("RESET memory_limit")


def remove_spill(folder: str | None) -> None:
    """Remove `hold_memory`'s spill folder and what DuckDB left in it (nothing once the instance
    freed its spilled blocks; a process that leaves by os._exit never closes the instance)."""
    import shutil

    if folder:
        shutil.rmtree(folder, ignore_errors=True)
