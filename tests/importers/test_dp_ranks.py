"""Observed data-parallel runs (issue 31): `import sglang` keeps each request's `dp_rank` (SGLang
0.5.23's meta_info key, `TokenizerManager._handle_batch_output` setting it from the scheduler's
`get_parallel().dp_rank` that `OutputStreamer`'s accumulator puts on every batch), counts the ranks
(the twin's --dp), and `compare` / `explain` of the observed run against its twin give the twin's
TTFT error per server rank.

Six requests, three on each of two ranks; the twin is a tiny-model replay of `--trace-out`
(pools far larger than the workload). Every per-rank number is recomputed here from the two
runs' rows.
"""

from __future__ import annotations

import json
import math

import duckdb

from tests.diagnose.test_cli import run_cli, run_cli_here
from tests.importers.sglang_export import record, write_export

SYS = list(range(1000, 1064))


def toks(n: int, salt: int) -> list[int]:
    return SYS + [salt * 1000 + i for i in range(n - len(SYS))]


def _export(tmp_path, ranks=(0, 1, 0, 1, 0, 1)):
    export = tmp_path / "export"
    write_export(export, "20251201_09", [
        record(f"r{i}", prompt=100 + 10 * i, device=64 if i else 0, tokens=toks(100 + 10 * i, i), arrival_s=float(i),
               ttft_s=0.010 + 0.004 * i, queue_s=0.001, dp_rank=rank)
        for i, rank in enumerate(ranks)])
    return export


def _import(tmp_path, export, *extra):
    db, trace = tmp_path / "runs.duckdb", tmp_path / "twin.jsonl"
    code, out, err = run_cli_here("import", "sglang", str(export), "--db", str(db), "--run-name", "prod",
                                  "--trace-out", str(trace), "--json", *extra)
    assert code == 0, err
    return db, trace, json.loads(out)


def _nearest(values, q):
    v = sorted(values)
    return v[max(math.ceil(q * len(v)), 1) - 1]


def test_import_keeps_dp_rank_and_counts_the_ranks(tmp_path):
    db, _, s = _import(tmp_path, _export(tmp_path))
    assert s["dp_ranks"] == 2
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute("SELECT req_id, dp_rank FROM requests").fetchall())
    cfg = json.loads(con.execute("SELECT config_json FROM runs").fetchone()[0])
    con.close()
    assert rows == {f"r{i}": i % 2 for i in range(6)}
    assert cfg["dp_ranks"] == 2
    code, out, err = run_cli_here("import", "sglang", str(_export(tmp_path / "b")), "--db", str(tmp_path / "b.duckdb"))
    assert code == 0 and "a twin replays with --dp 2" in " ".join(out.split())


def test_an_export_without_ranks_leaves_them_null(tmp_path):
    # null: no data-parallel controller; absent: an export from before 0.5.23's key.
    for ranks, name in (((None,) * 6, "null"), (("absent",) * 6, "absent")):
        db, _, s = _import(tmp_path / name, _export(tmp_path / name, ranks))
        assert s["dp_ranks"] is None
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT count(*) FROM requests WHERE dp_rank IS NOT NULL").fetchone()[0] == 0
        con.close()


def test_a_negative_rank_is_a_bad_line(tmp_path):
    export = _export(tmp_path, (0, 1, -1, 1, 0, 1))
    code, _, err = run_cli_here("import", "sglang", str(export), "--db", str(tmp_path / "x.duckdb"))
    assert code == 3 and ":3:" in err and "'dp_rank' is negative (-1)" in err


def test_compare_and_explain_give_the_twins_error_per_server_rank(tmp_path):
    db, trace, _ = _import(tmp_path, _export(tmp_path))
    code, _, err = run_cli_here("replay", str(trace), "--db", str(db), "--run-name", "twin", "--model", "tiny",
                                "--gpu", "cpu", "--page-size", "16", "--device-tokens", "4096", "--host-tokens", "8192")
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    pairs = con.execute("""SELECT o.dp_rank, o.ttft_ns, t.ttft_ns, t.dp_rank FROM requests o
                           JOIN runs ro ON ro.run_id = o.run_id AND ro.name = 'prod'
                           JOIN runs rt ON rt.name = 'twin' JOIN requests t ON t.run_id = rt.run_id AND t.req_id = o.req_id
                           ORDER BY o.req_id""").fetchall()
    con.close()
    code, out, err, heavy = run_cli("compare", "prod", "twin", "--db", str(db), "--json")
    assert code == 0, err
    ranks = json.loads(out)["twin_error"]["ranks"]
    assert [r["dp_rank"] for r in ranks] == [0, 1]
    for r in ranks:
        mine = [(o, t, tr) for rank, o, t, tr in pairs if rank == r["dp_rank"]]
        assert r["num_requests"] == len(mine) == 3
        assert r["median_abs_ms"] == _nearest([abs(t - o) / 1e6 for o, t, _ in mine], 0.5)
        assert r["p90_rel"] == _nearest([abs(t - o) / o for o, t, _ in mine], 0.9)
        assert r["same_rank"] == sum(tr == r["dp_rank"] for _, _, tr in mine)
    code, out, err = run_cli_here("compare", "prod", "twin", "--db", str(db))
    assert code == 0 and "per server dp_rank" in out
    code, out, err, heavy = run_cli("explain", "r3", "--run", "prod", "--db", str(db), "--json")
    assert code == 0, err
    e = json.loads(out)
    assert e["dp_rank"] == 1 and e["twin_rank_error"] == ranks[1]
    assert "dp_rank 1 served" in " ".join(e["verdict"].split()) or any(
        "dp_rank 1 served" in " ".join(s["finding"].split()) for s in e["steps"])
    assert heavy == []


def test_the_twin_of_a_ranked_import_defaults_to_its_rank_count(tmp_path):
    from tierdiag.app.replay import twin_dp

    db, trace, _ = _import(tmp_path, _export(tmp_path, (0, 1, 2, 0, 1, 2)))
    assert twin_dp(db, trace) == 3
    other = tmp_path / "other.jsonl"
    other.write_text(trace.read_text() + trace.read_text().splitlines()[0] + "\n")
    assert twin_dp(db, other) is None  # not the trace the import wrote
    assert twin_dp(tmp_path / "none.duckdb", trace) is None and twin_dp(None, trace) is None
    db2, trace2, _ = _import(tmp_path / "plain", _export(tmp_path / "plain", (None,) * 6))
    assert twin_dp(db2, trace2) is None  # the export named no rank


def test_the_twin_replays_on_the_servers_ranks_unless_told(tmp_path):
    db, trace, _ = _import(tmp_path, _export(tmp_path, (0, 1, 2, 0, 1, 2)))
    small = ["--model", "tiny", "--gpu", "cpu", "--page-size", "16", "--device-tokens", "4096", "--host-tokens", "8192"]
    for name, extra, want in (("twin", [], 3), ("one", ["--dp", "1"], 1)):
        code, _, err = run_cli_here("replay", str(trace), "--db", str(db), "--run-name", name, *small, *extra)
        assert code == 0, err
        con = duckdb.connect(str(db), read_only=True)
        cfg = json.loads(con.execute("SELECT config_json FROM runs WHERE name = ?", [name]).fetchone()[0])
        ranks = con.execute("SELECT count(DISTINCT t.dp_rank) FROM requests t JOIN runs r USING (run_id) "
                            "WHERE r.name = ?", [name]).fetchone()[0]
        con.close()
        assert cfg["dp"] == want and ranks <= want
    # A config file's dp is the user's word, above the import's.
    toml = tmp_path / "c.toml"
    toml.write_text("dp = 2\n")
    code, _, err = run_cli_here("replay", str(trace), "--db", str(db), "--run-name", "file", "--config", str(toml), *small)
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    assert json.loads(con.execute("SELECT config_json FROM runs WHERE name = 'file'").fetchone()[0])["dp"] == 2
    con.close()
