"""A store file a replay began and that was cut inside DuckDB's header, told from a user's damaged one.

DuckDB makes a new file in three writes of 4 KiB, under its lock, before anything is committed:
its main header (the `DUCK` magic, its version), then its two database headers (strace, DuckDB
2.0: `fcntl(F_SETLK)`, then `pwrite` at 0, 4096, 8192). A replay killed between them (kill -9 of
the replay, inline, or of its writer process) leaves a file of 4 or 8 KiB that DuckDB cannot
open: every reader said it was damaged (exit 4) and a replay refused it, though nothing was ever
in it (issue 41, session 39).

The file alone cannot say who made it: a user's store cut to 8 KiB (a copy cut short) reads the
same to DuckDB. So a replay that makes a store leaves a marker beside it first,
`P.tierdiag-creating` (`begin`), and removes it once the run's row is committed (`end`). A file
is a creation cut short (`cut_creation`) only where every one of these holds:

- the marker is there: a tierdiag replay began a store at this path and did not get to its run;
- the file is a regular file of 4 or 8 KiB: cut between DuckDB's first writes, each whole;
- its main header is DuckDB's (`DUCK` at byte 8), and what follows it is what DuckDB writes for
  a new, empty database (compared with one made now, `_fresh`): no metadata, no block. Its main
  header holds nothing recorded, so such a file holds nothing anyone recorded, whoever put it
  there (a stale marker beside a file someone else put at the path does not change that);
- no DuckDB log beside it (`P.wal`, not empty): a commit's would hold data;
- no process holds DuckDB's lock on it: one that does is creating it now.

A replay then re-creates it (`remove_cut_creation`: the file and the marker removed, under the
lock, the content checked again on the open file; then the store made as at a new path);
readers answer as for a store with no runs (docs/contract.md section 7) and leave it as it is.
Any other file DuckDB cannot open is left and refused as damaged; one of that shape with no
marker (cut by something else, or by a tierdiag before the marker) gets a hint saying it holds
nothing (`header_only`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

SUFFIX = ".tierdiag-creating"
PAGE = 4096  # DuckDB's header size: the main header, then two database headers
HEADER_BYTES = 3 * PAGE
MAGIC = b"DUCK"
MAGIC_AT = 8

_FRESH: list[bytes] = []


def marker(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(p.name + SUFFIX)


def begin(path: str | os.PathLike) -> None:
    """Leave the marker beside a store about to be made at `path` (where DuckDB cannot make the
    file either, nothing: it says why)."""
    with contextlib.suppress(OSError):
        marker(path).write_text("a tierdiag replay is making the store beside this file; "
                                "removed once its first run is recorded\n")


def end(path: str | os.PathLike) -> None:
    """Remove the marker (the store's first run recorded, or the store removed)."""
    with contextlib.suppress(OSError):
        marker(path).unlink()


def _fresh() -> bytes:
    """The bytes DuckDB writes for a new, empty database (this DuckDB's), made once a process."""
    if not _FRESH:
        import duckdb

        with tempfile.TemporaryDirectory(prefix="tierdiag-fresh-") as folder:
            made = os.path.join(folder, "fresh.duckdb")
            duckdb.connect(made).close()
            with open(made, "rb") as fh:
                _FRESH.append(fh.read(HEADER_BYTES))
    return _FRESH[0]


def _holds_nothing(data: bytes) -> bool:
    """Bytes cut between DuckDB's first writes of a new, empty database: nothing recorded."""
    if len(data) not in (PAGE, 2 * PAGE) or data[MAGIC_AT:MAGIC_AT + len(MAGIC)] != MAGIC:
        return False
    return data[PAGE:] == _fresh()[PAGE:len(data)]


def _no_log(path: Path) -> bool:
    try:
        return os.stat(f"{path}.wal").st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _read_unlocked(fh) -> bytes | None:
    """The file's first bytes where no process holds DuckDB's lock on it, else None (a shared
    lock tried, never waited for: it writes nothing, and goes with the file's close)."""
    import fcntl

    try:
        fcntl.lockf(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return None
    return os.pread(fh.fileno(), HEADER_BYTES, 0)


def header_only(path: str | os.PathLike) -> bool:
    """The file has the shape of a creation cut short (4 or 8 KiB of a new, empty database's
    header, no log beside it), marker or not: it holds nothing. Read-only."""
    p = Path(path)
    try:
        if not p.is_file() or os.stat(p).st_size not in (PAGE, 2 * PAGE) or not _no_log(p):
            return False
        with open(p, "rb") as fh:
            data = _read_unlocked(fh)
    except OSError:
        return False
    return data is not None and _holds_nothing(data)


def cut_creation(path: str | os.PathLike) -> bool:
    """A store a tierdiag replay began at `path` and that was cut inside DuckDB's header (module
    doc): its marker beside it, and `header_only`. Read-only: what readers ask."""
    try:
        if not marker(path).is_file():
            return False
    except OSError:
        return False
    return header_only(path)


def remove_cut_creation(path: str | os.PathLike) -> bool:
    """Remove a creation cut short (`cut_creation`) and its marker, under an exclusive lock on
    the file, its content read again through that open file; True where removed. Anything else
    (another process holding it, the content changed meanwhile) is left: False."""
    import fcntl

    p = Path(path)
    if not cut_creation(p):
        return False
    try:
        with open(p, "rb+") as fh:
            try:
                fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            st = os.fstat(fh.fileno())
            if not (_holds_nothing(os.pread(fh.fileno(), HEADER_BYTES, 0)) and _no_log(p)
                    and os.stat(p).st_ino == st.st_ino):
                return False
            p.unlink()  # under the lock: a replay that opens the path now makes a new file
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(f"{p}.wal")  # an empty log, if any: nothing in it either
    end(p)
    return True
