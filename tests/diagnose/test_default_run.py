"""The default run (what a command without --run reads) is the newest run the user made:
a replay or an import, never a candidate `sweep` or `advise` recorded after it (issue 34)."""

from __future__ import annotations

import json

import duckdb

from tierdiag.store.reader import open_store, resolve_run

from .conftest import RunBuilder
from .test_cli import run_cli_here


def _three_runs(tmp_path):
    """'mine' (a replay), then an advise candidate of it, then a sweep run: oldest first."""
    path = tmp_path / "runs.duckdb"
    ids = []
    for name in ("mine", "advise: host_tokens=8192", "sweep: page_size=128"):
        b = RunBuilder(path, name=name)
        b.request("r1", arrival_ns=0, input_tokens=128)
        b.write()
        ids.append(b.run_id)
    con = duckdb.connect(str(path))
    con.execute("UPDATE runs SET sweep_id = ? WHERE run_id = ?", [f"advise-{ids[0]}", ids[1]])
    con.execute("UPDATE runs SET sweep_id = 'sweep-1' WHERE run_id = ?", [ids[2]])
    con.close()
    return path, ids


def test_default_run_is_the_newest_the_user_made_and_runs_marks_it(tmp_path):
    path, ids = _three_runs(tmp_path)
    with open_store(path) as con:
        assert resolve_run(con, None).run_id == ids[0]
        assert resolve_run(con, ids[2]).run_id == ids[2]  # --run still reaches every run
    code, out, err = run_cli_here("runs", "--db", str(path), "--json")
    assert code == 0, err
    assert {r["run_id"]: r["default"] for r in json.loads(out)} == {ids[0]: True, ids[1]: False, ids[2]: False}
    code, text, err = run_cli_here("runs", "--db", str(path))
    assert code == 0, err
    table = text.split("config: model on GPU")[0]  # the legend below the table says what (default) means
    assert table.count("(default)") == 1 and table.index(ids[0]) < table.index("(default)") < table.index(ids[1])
    code, out, err = run_cli_here("summary", "--db", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["run_id"] == ids[0]


def test_a_store_of_sweep_runs_only_defaults_to_the_newest_that_is_not_an_advise_candidate(tmp_path):
    path, ids = _three_runs(tmp_path)
    con = duckdb.connect(str(path))
    con.execute("UPDATE runs SET sweep_id = 'sweep-0' WHERE run_id = ?", [ids[0]])
    con.execute("UPDATE runs SET sweep_id = ? WHERE run_id = ?", [f"advise-{ids[0]}", ids[2]])
    con.close()
    with open_store(path) as con:
        assert resolve_run(con, None).run_id == ids[0]
