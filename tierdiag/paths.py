"""The one rule for every file tierdiag writes: `replay --db`, `report -o`, `export DIR`,
`synth OUT`, `calibrate -o`. Missing parent folders are created (like `mkdir -p`); a path that is
a folder, or a parent that cannot be created or written, is an OutputError (exit 6) naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tierdiag.errors import OutputError

# The run store a command uses without --db (here, not in store/reader.py: naming it must not
# import duckdb, which a replay's own process does not need when a writer process writes).
DEFAULT_DB = "tierdiag.duckdb"


def prepare_output_path(path: Path, *, what: str) -> None:
    """The one rule for every file tierdiag writes (--db, -o, export, calibrate -o): missing
    parent folders are created; a path that is a folder, or a parent that cannot be created or
    written, is an OutputError (exit 6) naming the path."""
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
