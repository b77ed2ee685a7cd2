"""`sweep --resume KEPT` merges a store a sweep kept and then removes it. A store that holds runs no
sweep made (a replay's, an import's, or a kept store someone replayed into) is refused before
anything moves: merging it would empty the store the user named and delete the file (h49host found
`--resume` took any store). One line, exit 2, the file byte for byte as it was, --db not made."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sweep.sweep_helpers import cli_here, one_line_error
from tierdiag.store.copy_run import read_run_tables, write_run_tables


def _refused(kept: Path, db: Path) -> str:
    before = kept.read_bytes()
    proc = cli_here("sweep", "--resume", kept, "--db", db)
    line = one_line_error(proc, 2, "not made by a sweep", "nothing was changed")
    assert kept.read_bytes() == before, "the store the user named is left as it was"
    assert not db.exists(), "--db is not made for a refused resume"
    assert "\x1b" not in proc.stderr
    return line


def test_a_replays_store_is_refused_whole(tmp_path, singles):
    kept = tmp_path / "mine.duckdb"
    shutil.copyfile(singles, kept)
    line = _refused(kept, tmp_path / "db.duckdb")
    assert "4 of its runs" in line  # singles: the sweep's 4 configs, each replayed on its own


def test_a_kept_store_with_one_replayed_run_in_it_is_refused(tmp_path, singles, swept):
    kept = tmp_path / "sweep.s1.duckdb"
    shutil.copyfile(swept, kept)
    (one,) = duckdb.connect(str(singles), read_only=True).execute(
        "SELECT run_id FROM runs ORDER BY name LIMIT 1").fetchone()
    write_run_tables(kept, read_run_tables(singles, one))
    line = _refused(kept, tmp_path / "db.duckdb")
    assert "1 of its runs" in line


def test_a_sweeps_own_store_still_merges(tmp_path, swept):
    kept = tmp_path / "sweep.s1.duckdb"
    shutil.copyfile(swept, kept)
    db = tmp_path / "db.duckdb"
    proc = cli_here("sweep", "--resume", kept, "--db", db, "--json")
    assert proc.returncode == 0, proc.stderr
    assert not kept.exists()
    assert duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM runs").fetchone()[0] == 4


# Names a user's store may have: markup, escapes, spaces, non-ASCII; each is only data in the line.
NAMES = st.sampled_from(["[bold]x.duckdb", "a b.duckdb", "ünï.duckdb", "x\x1b[31m.duckdb",
                         "-x.duckdb", "[link=https:]y.duckdb", "s.sweep-1.duckdb"])


@settings(max_examples=7, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES)
def test_refusal_names_any_store_as_data(tmp_path_factory, singles, name):
    folder = tmp_path_factory.mktemp("named")
    kept = folder / name
    shutil.copyfile(singles, kept)
    line = _refused(kept, folder / "db.duckdb")
    if name.startswith("["):
        assert name.split("]")[0] + "]" in line, "markup in a name is printed, not interpreted"
