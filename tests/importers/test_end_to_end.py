"""import -> --trace-out -> replay (tiny model) -> compare -> explain, through the real CLI.

Four requests a second apart share a 64-token system prompt; the server reported a miss for the
first and a 64-token device hit for the others, which is what the engine does with pools far
larger than the workload, so the twin agrees on every split.
"""

from __future__ import annotations

import json

from tests.diagnose.test_cli import run_cli, run_cli_here
from tests.importers.sglang_export import record, write_export
from tierdiag.diagnose.twin.observed import agreement
from tierdiag.store.reader import open_store, resolve_run

SYS = list(range(1000, 1064))


def toks(n: int, salt: int) -> list[int]:
    return SYS + [salt * 1000 + i for i in range(n - len(SYS))]


def test_import_replay_compare_explain(tmp_path):
    export = tmp_path / "export"
    write_export(export, "20251201_09", [
        record("r1", prompt=100, tokens=toks(100, 1), arrival_s=0.0, ttft_s=0.030, queue_s=0.001),
        record("r2", prompt=120, device=64, tokens=toks(120, 2), arrival_s=1.0, ttft_s=0.020, queue_s=0.015),
    ])
    write_export(export, "20251201_10", [
        record("r3", prompt=90, device=64, tokens=toks(90, 3), arrival_s=2.0, ttft_s=0.010, stream=True),
        record("r4", prompt=130, device=64, tokens=toks(130, 4), arrival_s=3.0, ttft_s=0.012),
        record("txt", prompt=70, device=64, text="only text", arrival_s=3.5),
    ], gz=True)
    db, trace = tmp_path / "runs.duckdb", tmp_path / "twin.jsonl"

    code, out, err = run_cli_here("import", "sglang", str(export), "--db", str(db), "--run-name", "prod",
                                  "--trace-out", str(trace), "--json")
    assert code == 0, err
    imported = json.loads(out)
    assert (imported["num_requests"], imported["trace_requests"], imported["trace_text_only"]) == (5, 4, 1)
    assert "exported as text only" in err and "--skip-tokenizer-init" in err

    code, _, err = run_cli_here("replay", str(trace), "--db", str(db), "--run-name", "twin", "--model", "tiny",
                                "--gpu", "cpu", "--page-size", "16", "--device-tokens", "4096",
                                "--host-tokens", "8192")
    assert code == 0, err

    with open_store(db) as con:
        obs, rep = resolve_run(con, "prod"), resolve_run(con, "twin")
        a = agreement(con, obs, rep)
    assert (a.num_matched, a.num_observed, a.num_replayed, a.page_tokens) == (4, 5, 4, 16)
    assert (a.num_split_known, a.num_split_match) == (4, 4)
    assert a.num_ttft_pairs == 4 and a.ttft_abs_error_p50_ns is not None

    code, out, err, heavy = run_cli("compare", "prod", "twin", "--requests", "--db", str(db), "--json")
    assert code == 0, err
    c = json.loads(out)
    assert (c["num_matched"], c["num_split_match"], c["observed_run_name"]) == (4, 4, "prod")
    assert len(c["requests"]) == 4 and all(p["split_match"] for p in c["requests"])
    assert heavy == [], f"compare imported {heavy}"
    code, out, err = run_cli_here("compare", "twin", "prod", "--db", str(db))  # either order
    assert code == 0 and "matches within one page (16 tokens per tier) for 4 of 4" in " ".join(out.split())

    code, out, err, heavy = run_cli("explain", "r2", "--run", "prod", "--db", str(db), "--json")
    assert code == 0, err
    e = json.loads(out)
    assert [s["source"] for s in e["steps"]] == ["server", "server", "replayed twin", "replayed twin"]
    assert e["twin"]["matched_by"] == "trace_sha256" and e["tokens"]["device"] == 64
    assert "Its tier split matches the server's within one page" in e["steps"][2]["finding"]
    assert (e["primary_cause"], e["primary_cause_source"]) == ("queueing", "server")  # 15 of 20 ms
    assert heavy == [], f"explain of an observed run imported {heavy}"

    for args in (("summary",), ("slow",)):
        code, out, err, heavy = run_cli(*args, "--run", "prod", "--db", str(db))
        assert code == 0, (args, err)
        assert heavy == [], f"{args} imported {heavy}"
    assert "r2" in out and "ranked by TTFT itself" in out.replace("\n", " ")  # slow's observed view
    from tierdiag.diagnose.twin.observed import observed_summary
    from tierdiag.report.html import build_report

    with open_store(db) as con:
        s = observed_summary(con, obs)
    assert s.agreement.num_split_match == 4 and s.twin.run_id == rep.run_id
    build_report(db, "prod", tmp_path / "r.html")
    assert "not reported by the server" in (tmp_path / "r.html").read_text()
