"""The one rule for every file tierdiag writes: `replay --db`, `report -o`, `export DIR`,
`synth OUT`, `calibrate -o`, `import sglang --trace-out`, `sweep --db`. Missing parent folders are
created (like `mkdir -p`); a path that is a folder, or a parent that cannot be created or
written, is an OutputError (exit 6) naming it.

Before that, `check_output` refuses (ConfigError, exit 2, one line naming both) an output that is
one of the command's own inputs or its store: the same file by inode (a hard or symbolic link to
it too), or, not there yet, the same path. And it never lets anything but a run store replace a
DuckDB database: a report, trace or profile written over one would lose every run in it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from tierdiag.errors import ConfigError, OutputError

# The run store a command uses without --db (here, not in store/reader.py: naming it must not
# import duckdb, which a replay's own process does not need when a writer process writes).
DEFAULT_DB = "tierdiag.duckdb"

# Every DuckDB database file (format 1.x) carries this magic at bytes 8-11 of its main header
# (duckdb/src/storage/storage_info.cpp: MainHeader::MAGIC_BYTES, after an 8-byte checksum).
DUCKDB_MAGIC = b"DUCK"
_DUCKDB_MAGIC_AT = 8


def is_duckdb_file(path: str | os.PathLike) -> bool:
    """A DuckDB database file (checked by its header, not its name)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_DUCKDB_MAGIC_AT + len(DUCKDB_MAGIC))
    except OSError:  # missing, a folder, unreadable: not one we could destroy by reading its name
        return False
    return head[_DUCKDB_MAGIC_AT:] == DUCKDB_MAGIC


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """`a` and `b` are one file: the same inode when both exist (through hard and symbolic links),
    else the same resolved path (two outputs a command would create at one place)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        pass
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return False


def check_output(path: str | os.PathLike, *, what: str, inputs: Iterable[tuple[str, str | os.PathLike]] = (),
                 store: bool = False) -> None:
    """Refuse to write `path` (the `what` option) over one of the command's `inputs` ((label,
    path) pairs: its trace, export files, --db) or, unless the output is itself a run `store`,
    over a DuckDB database. ConfigError (exit 2) naming both; nothing is touched."""
    for label, source in inputs:
        if source is not None and same_file(path, source):
            same = "" if str(path) == str(source) else f" ({source})"
            raise ConfigError(f"{what} {path} is the same file as {label}{same}: refusing to write over "
                              f"what this command reads", hint=f"pass another {what}")
    if not store and is_duckdb_file(path):
        raise ConfigError(f"{what} {path} is a DuckDB database (a run store?): refusing to replace it",
                          hint=f"pass another {what}")


def prepare_output_path(path: Path, *, what: str, inputs: Iterable[tuple[str, str | os.PathLike]] = (),
                        store: bool = False) -> None:
    """The one rule for every file tierdiag writes (--db, -o, export, calibrate -o, --trace-out):
    `check_output` first (an input, or a DuckDB file for anything but a store: exit 2); then
    missing parent folders are created; a path that is a folder, or a parent that cannot be created
    or written, is an OutputError (exit 6) naming the path."""
    path = Path(path)
    check_output(path, what=what, inputs=inputs, store=store)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder", hint=f"pass a file name to {what}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot write {path}: {parent} is not a folder") from None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: cannot create folder {parent} ({exc.strerror or exc})") from None
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: folder {parent} is not writable",
                          hint=f"pass a {what} in a folder you can write to")
