"""Where a run's storage-tier page files live (no torch: `runs`, `replay` and the readers share it).

    --db demo.duckdb                      -> /abs/demo.storage/<run_id>/NNNNNN.kvseg
    --db demo.duckdb --storage-dir /data  -> /data/<run_id>/NNNNNN.kvseg

The root is `--storage-dir` (TOML `storage_dir`) or a folder named after the database; each
run writes into its own subfolder named by its run id, so runs never share (or delete) each
other's pages. The resolved absolute path of that subfolder is recorded in the run's stored
config under `storage_dir` (absent, or null, for a run without a storage tier), which is how
`run_storage_dir` finds it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

STORAGE_SUFFIX = ".storage"  # demo.duckdb -> demo.storage (the Makefile's `clean` removes it)
STORAGE_DIR_KEY = "storage_dir"  # the run config's key for the run's folder


def storage_root(db: str | os.PathLike, storage_dir: str | os.PathLike | None) -> Path:
    """The folder that holds the runs' storage folders: `storage_dir`, else `<db stem>.storage`
    beside the database; absolute."""
    root = Path(storage_dir).expanduser() if storage_dir else Path(db).with_suffix(STORAGE_SUFFIX)
    return Path(os.path.abspath(root))


def run_folder(db: str | os.PathLike, storage_dir: str | os.PathLike | None, run_id: str) -> Path:
    """The storage folder of run `run_id` (absolute)."""
    return storage_root(db, storage_dir) / run_id


def run_storage_dir(run_info: Any, db: str | os.PathLike | None = None) -> Path | None:
    """The storage folder a recorded run wrote its page files to (a `RunInfo`, or anything with
    `config` and `run_id`): the one its config records, else None. A run recorded before the
    folder was stored in its config used `<db>.storage/<run_id>`: pass `db` to find that one.
    The folder may be gone already (deleted by hand, or a sweep worker's that was cleaned up):
    callers check `exists()`."""
    config = getattr(run_info, "config", None) or {}
    folder = config.get(STORAGE_DIR_KEY)
    if isinstance(folder, str) and folder.strip():
        return Path(folder)
    if db is not None and config.get("storage_tokens"):
        return run_folder(db, None, run_info.run_id)
    return None


def folder_bytes(path: str | os.PathLike | None) -> int:
    """Bytes of the files in `path` (0 if it does not exist)."""
    if path is None:
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total
