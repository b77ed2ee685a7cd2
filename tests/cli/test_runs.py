"""`tierdiag runs`: one table that fits 80 columns whatever the runs' options, and `--delete`,
which removes a run's rows from every table and its storage folder, and nothing else."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest

from tests.cli.cli_helpers import cli, cli_here, on_tty
from tests.report.fake_run import write_fake_run
from tierdiag.store.schema import EVENT_TABLES, OPTIONAL_TABLES

RUN_ID = re.compile(r"^(\d{8}-\d{6}-[0-9a-f]{6})\b", re.M)


def _set_config(db: Path, run_id: str, **changes) -> None:
    con = duckdb.connect(str(db))
    (cfg,) = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps({**json.loads(cfg), **changes}), run_id])
    con.close()


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, list[str]]:
    db = tmp_path / "runs.duckdb"
    ids = [write_fake_run(db, 30, seed, name=f"run-{seed}").run_id for seed in (1, 2)]
    _set_config(db, ids[1], eviction_policy="lfu", load_back_threshold=256, storage_tokens=1_000_000)
    return db, ids


def test_runs_is_one_table_at_80_columns_even_when_options_differ(two_runs):
    db, ids = two_runs
    piped = cli_here("runs", "--db", db)
    code, tty = on_tty("runs", "--db", db, NO_COLOR="1")
    assert piped.returncode == 0 and code == 0, piped.stderr
    for text in (piped.stdout, tty.replace("\r", "")):
        assert "…" not in text
        assert all(len(line) <= 80 for line in text.splitlines()), text
        assert RUN_ID.findall(text) == ids  # whole ids, each at the start of its row
        header = next(line for line in text.splitlines() if line.startswith("run "))
        assert "kind" in header and "requests" in header and "config" in header
        # the options that differ, one a line, beside the pools in tokens and GiB
        assert "eviction_policy=lfu" in text and "load_back_threshold=256" in text
        assert "storage 1,000,000 (" in text and "GiB)" in text
        assert "write_policy" not in text  # write_through is the default
    for rid in ids:
        assert cli_here("summary", "--db", db, "--run", rid, "--json").returncode == 0


def test_runs_json_has_the_pools_in_tokens_and_bytes(two_runs):
    db, ids = two_runs
    rows = json.loads(cli_here("runs", "--db", db, "--json").stdout)
    pools = {r["run_id"]: r["pools"] for r in rows}
    assert pools[ids[0]]["device"]["tokens"] == 200_000 and pools[ids[0]]["device"]["bytes"] > 0
    assert "storage" not in pools[ids[0]] and pools[ids[1]]["storage"]["tokens"] == 1_000_000
    assert {r["run_id"]: r["changed_from_defaults"].get("eviction_policy") for r in rows}[ids[1]] == "lfu"


def _counts(db: Path, run_id: str) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        present = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
                for t in EVENT_TABLES + tuple(t for t in OPTIONAL_TABLES if t in present) + ("runs",)}
    finally:
        con.close()


def _storage_folder(root: Path) -> Path:
    """A folder laid out as the storage tier writes one: ab/<sha256 hex> page files."""
    page = "ab" + "0" * 62
    (root / "ab").mkdir(parents=True)
    (root / "ab" / page).write_bytes(b"\0" * 4096)
    (root / "cd").mkdir()
    (root / "cd" / ("cd" + "1" * 62)).write_bytes(b"\0" * 1024)
    return root


def test_delete_removes_every_row_and_the_storage_folder(two_runs, tmp_path):
    db, (keep, gone) = two_runs
    folder = _storage_folder(tmp_path / "runs.storage" / gone)
    _set_config(db, gone, storage_dir=str(folder))
    before = _counts(db, gone)
    assert before["requests"] and before["transfers"] and before["batches"] and before["pool_samples"], before
    assert before["run_evidence"] == 1  # stored when the run was closed; deleted with it
    kept_before = _counts(db, keep)
    res = cli_here("runs", "--db", db, "--delete", gone)
    assert res.returncode == 0, res.stderr
    line, = res.stdout.splitlines()
    tables = sum(1 for n in before.values() if n)
    assert line.startswith(f"deleted run {gone} (run-2): {sum(before.values()):,} rows from {tables} tables")
    assert f"removed {folder} (2 files, 5.0 KiB freed)" in line
    assert not folder.exists() and not folder.parent.exists()  # <db>.storage goes with its last run
    assert not any(_counts(db, gone).values())
    assert _counts(db, keep) == kept_before  # the other run is untouched
    assert RUN_ID.findall(cli_here("runs", "--db", db).stdout) == [keep]
    # Unknown now: the same one-line error and exit code as every command's --run.
    again = cli_here("runs", "--db", db, "--delete", gone)
    assert again.returncode == 4 and again.stderr.count("\n") == 1 and f"no run '{gone}'" in again.stderr


@pytest.mark.parametrize("make", ["home", "user_files", "symlink", "holds_db", "relative"])
def test_delete_never_removes_a_folder_tierdiag_did_not_write(two_runs, tmp_path, make):
    db, (_, run) = two_runs
    if make == "home":
        folder = Path.home()
    elif make == "user_files":
        folder = _storage_folder(tmp_path / "mine")
        (folder / "thesis.tex").write_text("years of work")
    elif make == "symlink":
        target = _storage_folder(tmp_path / "real")
        folder = tmp_path / "link"
        folder.symlink_to(target)
    elif make == "relative":
        folder = Path("storage")  # where the replay ran, not where `runs` runs
        _storage_folder(tmp_path / "storage")
    else:
        folder = tmp_path  # holds the database itself
    _set_config(db, run, storage_dir=str(folder))
    before = _counts(db, run)
    res = cli_here("runs", "--db", db, "--delete", run, cwd=tmp_path)
    assert res.returncode == 4 and res.stderr.count("\n") == 1, res.stderr
    assert "does not look like a tierdiag storage folder" in res.stderr and "--keep-storage" in res.stderr
    assert _counts(db, run) == before  # nothing deleted
    assert (tmp_path / folder).exists()
    if make == "user_files":
        assert (folder / "thesis.tex").read_text() == "years of work"
        # --keep-storage deletes the rows only
        res = cli_here("runs", "--db", db, "--delete", run, "--keep-storage")
        assert res.returncode == 0 and f"kept {folder} (--keep-storage)" in res.stdout
        assert not any(_counts(db, run).values()) and (folder / "thesis.tex").exists()


def test_delete_keeps_a_folder_another_run_uses_and_refuses_a_live_run(two_runs, tmp_path):
    db, (a, b) = two_runs
    folder = _storage_folder(tmp_path / "shared-storage")
    _set_config(db, a, storage_dir=str(folder))
    _set_config(db, b, storage_dir=str(folder))
    res = cli_here("runs", "--db", db, "--delete", b, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["run_id"] == b and out["num_rows"] == sum(out["rows"].values()) > 0
    assert out["storage_dir"] == str(folder) and not out["storage_removed"]
    assert out["storage_kept_because"] == f"run {a} uses it too"
    assert folder.exists()
    # A run still being recorded (its process alive on this host) is not deleted under it.
    import os
    import socket

    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET status = 'running', pid = ?, hostname = ? WHERE run_id = ?",
                [os.getpid(), socket.gethostname(), a])
    con.close()
    res = cli("runs", "--db", db, "--delete", a)
    assert res.returncode == 4 and "still being recorded" in res.stderr
    assert _counts(db, a)["runs"] == 1


def test_delete_while_another_process_writes_says_busy(two_runs):
    db, (a, _) = two_runs
    holder = duckdb.connect(str(db))  # DuckDB has one writer: this process holds the file
    try:
        res = cli("runs", "--db", db, "--delete", a)
    finally:
        holder.close()
    assert res.returncode == 4 and "busy" in res.stderr and res.stderr.count("\n") == 1
    assert _counts(db, a)["runs"] == 1


def test_an_observed_run_says_where_it_came_from():
    from rich.console import Console

    from tierdiag.report.runs_view import render_runs
    from tierdiag.store.reader import RunInfo

    info = RunInfo(run_id="20261201-120000-abcdef", name="prod", created_at="2026-12-01 12:00:00", status="complete",
                   tierdiag_version="0", trace_path="/var/log/m", trace_sha256="", config={"source": "sglang"},
                   hardware={}, data_plane={}, timing="observed", num_requests=5, wall_s=None, command_line="",
                   kind="observed")
    console = Console(width=80, record=True, color_system=None)
    render_runs([info], console, db_label="prod.duckdb", options={})
    text = console.export_text()
    assert "imported from sglang" in text and "?" not in text and "observed" in text
