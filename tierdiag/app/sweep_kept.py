"""A sweep never throws a finished run away: where its runs go when --db cannot take them (a store
of the sweep's own beside it, `kept_store_path`), and `resume`, which merges such a store later
(`tierdiag sweep --resume KEPT --db DB`)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tierdiag.errors import ConfigError, TierdiagError
from tierdiag.store.writer import FINAL_WAIT_S

# After the sweep, a last try to move kept runs into a --db that was busy: the full wait was
# already spent on the merge that failed.
LAST_MERGE_WAIT_S = 2.0
# How long a merge waits for --db before keeping the run (the writer's wait at a run's close).
MERGE_WAIT_S = FINAL_WAIT_S


def kept_store_path(db: Path, sweep_id: str) -> Path:
    """Where a sweep keeps the runs --db could not take: beside it, named after the sweep."""
    return db.with_name(f"{db.stem}.{sweep_id}.duckdb")


class Keeper:
    """Where finished runs go: `db` until a write to it fails, then the kept store."""

    def __init__(self, db: Path, sweep_id: str):
        self.db = db
        self.sweep_id = sweep_id
        self.failure: TierdiagError | None = None
        self.path: Path | None = None

    def write(self, tables, overrides: dict) -> tuple[str, str | None]:
        """(run id, the kept store's path or None when the run is in `db`): a run's tables (Ray)."""
        from tierdiag.store.copy_run import write_run_tables

        return self._write(lambda path, **wait: write_run_tables(path, tables, overrides, **wait))

    def write_from(self, copier, overrides: dict) -> tuple[str, str | None]:
        """The same for the run of the store file `copier` has as its source (a worker's): copied
        inside DuckDB, no rows through Python (store.copy_run.RunFileCopier)."""
        return self._write(lambda path, **wait: copier.copy(path, overrides, **wait))

    def _write(self, put) -> tuple[str, str | None]:
        if self.failure is None:
            try:
                return put(self.db, wait_s=MERGE_WAIT_S), None
            except TierdiagError as exc:  # busy past the wait, a full disk, a damaged file
                self.failure = exc
        if self.path is None:
            self.path = kept_store_path(self.db, self.sweep_id)
        try:
            return put(self.path), str(self.path)
        except TierdiagError:  # beside --db is not writable either: the temporary folder
            self.path = Path(tempfile.gettempdir()) / kept_store_path(self.db, self.sweep_id).name
            return put(self.path), str(self.path)

    def last_try(self, outcomes: list) -> list:
        """Move the kept runs into `db` if it takes them now; the outcomes as they end up."""
        if self.path is None:
            return outcomes
        from tierdiag.store.copy_run import merge_store

        try:
            merge_store(self.path, self.db, wait_s=LAST_MERGE_WAIT_S)
        except TierdiagError:
            return outcomes
        self.path = None
        return [dataclasses.replace(o, kept_in=None) for o in outcomes]


# --- later: runs a sweep kept because --db could not take them ----------------------------------

@dataclass(frozen=True)
class Resumed:
    kept: str
    sweep_id: str | None  # the sweep the kept runs belong to (one, when a sweep kept them)
    copied: tuple[str, ...]  # run ids copied into --db now
    present: tuple[str, ...]  # run ids --db held already (a merge cut short, then resumed)

    @property
    def run_ids(self) -> tuple[str, ...]:
        return self.present + self.copied


def resume(kept: str | os.PathLike, db: str | os.PathLike,
           progress: Callable[[str], None] | None = None) -> Resumed:
    """Copy the runs of a kept store into `db` (one transaction a run, none twice) and remove it.

    A failure (--db still busy, a full disk) leaves the kept store as it was, less the runs
    already copied, for another try."""
    from tierdiag.diagnose.read.ids import runs_of_no_sweep, sweep_ids
    from tierdiag.store.copy_run import merge_store
    from tierdiag.store.reader import open_store

    kept = Path(kept)
    con = open_store(kept)  # missing, foreign, damaged: its own one-line error
    try:
        sweeps = sweep_ids(con)
        # A store with runs of no sweep in it (a replay's, an import's) is no store a sweep kept:
        # merging it would move every run out of it and remove the file the user named.
        strays = runs_of_no_sweep(con)
    finally:
        con.close()
    if strays:
        raise ConfigError(
            f"--resume {kept}: {strays} of its runs were not made by a sweep, so it is no store a sweep kept; "
            "nothing was changed",
            hint="--resume merges the DB-stem.SWEEP_ID.duckdb store a sweep named, and removes it")
    copied, present = merge_store(kept, Path(db), progress=progress)
    return Resumed(str(kept), sweeps[0] if len(sweeps) == 1 else None, tuple(copied), tuple(present))
