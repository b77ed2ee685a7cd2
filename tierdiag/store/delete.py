"""Delete one run: its rows from every table, in one transaction, and its storage-tier folder.

The folder is removed only when it is plainly one the storage tier wrote (see
`storage_folder_problem`): a bad or hostile config must never make `runs --delete` remove a
user's files. DuckDB has one writer at a time, so a delete waits briefly for a replay that is
flushing and otherwise says the file is busy; a run still being recorded is refused.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import duckdb

from tierdiag import signals
from tierdiag.errors import OutputError, StoreError
from tierdiag.store.reader import connect_with_retry, is_lock_error, list_runs, lock_holder, open_store, resolve_run
from tierdiag.store.schema import EVENT_TABLES, OPTIONAL_TABLES
from tierdiag.store.storage_dir import run_storage_dir

# What the storage tier writes under its folder, and nothing else: page files `ab/<sha256 hex>`
# (one file a page) or segment files `000001.kvseg`; `.tmp` is a page being written.
_PAGE_DIR = re.compile(r"[0-9a-f]{2}")
_PAGE_FILE = re.compile(r"[0-9a-f]{64}(\.tmp)?")
_SEGMENT_FILE = re.compile(r"\d{6}\.kvseg(\.tmp)?")
_MARKERS = frozenset({".tierdiag-storage"})


@dataclass(frozen=True)
class DeletedRun:
    run_id: str
    name: str
    rows: dict[str, int]  # table -> rows deleted
    db_bytes_before: int
    db_bytes_after: int
    storage_dir: str | None  # the run's storage folder, when it recorded one
    storage_removed: bool
    storage_files: int
    storage_bytes: int
    storage_kept_because: str | None  # why the folder was left in place (None: removed, or none)

    @property
    def num_rows(self) -> int:
        return sum(self.rows.values())

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "name": self.name, "rows": self.rows, "num_rows": self.num_rows,
                "db_bytes_before": self.db_bytes_before, "db_bytes_after": self.db_bytes_after,
                "storage_dir": self.storage_dir, "storage_removed": self.storage_removed,
                "storage_files": self.storage_files, "storage_bytes": self.storage_bytes,
                "storage_kept_because": self.storage_kept_because}


def storage_folder_problem(folder: Path, *, db_path: Path) -> str | None:
    """Why `folder` must not be removed, or None when it is a storage-tier folder and only that:
    an absolute path to a real directory (not a link) holding nothing but page or segment
    files, and no home, root, working directory or folder that holds the database."""
    if not folder.is_absolute():
        return f"{folder} is a relative path (relative to where the replay ran, not to here)"
    if folder.is_symlink():
        return f"{folder} is a symbolic link"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    real = folder.resolve()
    protected = {Path("/"), Path.home().resolve(), Path.cwd().resolve()}
    if real in protected or real == real.parent:
        return f"{folder} is the root, home or working directory"
    db_real = db_path.resolve()
    if real in db_real.parents:
        return f"{folder} holds the database itself"
    for entry in os.scandir(real):
        if entry.is_symlink():
            return f"it holds a link ({entry.name})"
        if entry.is_dir():
            if not _PAGE_DIR.fullmatch(entry.name):
                return f"it holds a folder tierdiag does not write ({entry.name})"
            for inner in os.scandir(entry.path):
                if inner.is_symlink() or not inner.is_file() or not _PAGE_FILE.fullmatch(inner.name):
                    return f"it holds a file tierdiag does not write ({entry.name}/{inner.name})"
        elif not (entry.is_file() and (_SEGMENT_FILE.fullmatch(entry.name) or entry.name in _MARKERS)):
            return f"it holds a file tierdiag does not write ({entry.name})"
    return None


def _folder_size(folder: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
    return files, size


def delete_run(db: Path, run: str, *, keep_storage: bool = False) -> DeletedRun:
    """Remove run `run` (an id, a unique id prefix, or a name only one run has) from `db`."""
    with open_store(db) as con:
        runs = list_runs(con)
        info = resolve_run(con, run, db_label=str(db))
    if info.run_id != run and sum(r.name == run for r in runs) > 1:
        raise StoreError(f"run name {run!r} is shared by {sum(r.name == run for r in runs)} runs in {db}",
                         hint="delete by run id (`tierdiag runs` lists them)")
    if info.status == "running":
        raise StoreError(f"run {info.run_id} is still being recorded", hint="wait for its replay to finish, or stop it")
    folder = run_storage_dir(info)
    kept = None
    if folder is not None:
        others = [r.run_id for r in runs if r.run_id != info.run_id and run_storage_dir(r) is not None
                  and os.path.realpath(run_storage_dir(r)) == os.path.realpath(folder)]
        if keep_storage:
            kept = "--keep-storage"
        elif others:
            kept = f"run {others[0]} uses it too"
        elif folder.exists() or folder.is_symlink() or not folder.is_absolute():
            problem = storage_folder_problem(folder, db_path=db)
            if problem is not None:
                raise StoreError(f"not deleting run {info.run_id}: its storage_dir {folder} does not look like a "
                                 f"tierdiag storage folder ({problem})",
                                 hint="remove the folder yourself, or pass --keep-storage to delete only the rows")
        else:
            kept = "it is already gone"
    before = db.stat().st_size
    try:
        con = connect_with_retry(db, read_only=False)
    except duckdb.Error as exc:
        if is_lock_error(exc):
            raise StoreError(f"{db} is busy: another process has it open{lock_holder(exc)}",
                             hint="DuckDB allows one writer: try again when it is done") from None
        raise StoreError(f"cannot open {db} for writing: {str(exc).splitlines()[0]}") from None
    rows: dict[str, int] = {}
    files = size = 0
    removed = False
    # Held against Ctrl-C: the rows and the folder go together (an interrupt waits for both).
    with signals.deferred(), closing(con):
        begun = False
        try:
            con.execute("BEGIN TRANSACTION")
            begun = True
            present = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
            optional = tuple(t for t in OPTIONAL_TABLES if t in present)  # a store made before them lacks them
            for table in EVENT_TABLES + optional + ("runs",):
                (n,) = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [info.run_id]).fetchall()[0]
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [info.run_id])
                rows[table] = int(n)
            con.execute("COMMIT")
            begun = False
        except BaseException:
            if begun:
                con.execute("ROLLBACK")
            raise
        con.execute("CHECKPOINT")  # the deleted blocks are free for reuse (the file shrinks if it can)
        if folder is not None and kept is None:
            files, size = _folder_size(folder)
            try:
                shutil.rmtree(folder)
            except OSError as exc:
                raise OutputError(f"deleted run {info.run_id}'s rows, but cannot remove {folder}: "
                                  f"{exc.strerror or exc}", hint="remove the folder yourself") from None
            removed = True
            # The default layout is <db>.storage/<run id>: the parent goes with its last run.
            parent = folder.parent
            if parent.name.endswith(".storage") and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
    return DeletedRun(run_id=info.run_id, name=info.name, rows=rows, db_bytes_before=before,
                      db_bytes_after=db.stat().st_size, storage_dir=str(folder) if folder is not None else None,
                      storage_removed=removed, storage_files=files, storage_bytes=size, storage_kept_because=kept)
