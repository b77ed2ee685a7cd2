"""A big run store for timing the readers, built by copying rows: a stand-in for a 1M replay.

It measures readers (`summary`, `explain`, `slow`, `report`), not the engine. A real 1M-request
replay costs 5-10 minutes of one core; this copies one recorded run (a 20k-request `tierdiag
synth` replay, sessions included) COPIES times inside DuckDB, into a new store holding one run:

    .venv/bin/python benchmarks/big_store.py SOURCE.duckdb OUT.duckdb [--copies 50] [--run RUN]
    .venv/bin/python benchmarks/big_store.py --build OUT.duckdb [--requests 20000] [--copies 50]

(--build: synth and replay the source first, in a temporary folder.) Copy k (0-based) of every
table's rows is the source's, shifted so that the copies follow one another and nothing collides:

  times      + k x SPAN (every *_ns instant: arrival, first token, finish, a batch's / transfer's
             start and end, an eviction's and a pool sample's t_ns, the trace's own arrival);
             SPAN is the source's last instant rounded up to a whole second, plus a second
  ids        req_id and session_id get the suffix "@c<k>" (k >= 1; copy 0 keeps the source's
             ids, so the source's request names still explain); seq, batch_id, eviction_id,
             transfer_id and node_id + k x (the source's largest + 1); a request's first_batch_id
             and the eviction / request link follow
  durations  unchanged (queue, load-back, compute: each copy's requests waited as the source's did)

The run's row says how it was made (name `big-store-xK`, command line), counts COPIES x the source's
requests, and points at a trace written beside OUT (OUT.jsonl: the source trace's lines copied the
same way, hash ids shifted past the source's largest so the copies share no prefix), so that the
size curves read a trace that matches the rows. Its run evidence is then computed and stored as
a replay's close does (diagnose/run/evidence.py `record_run_evidence`): readers find the stored row
as they would on a real run. Each copy is a cold start of the same workload; a real 1M replay
would carry a warm cache across: the rows are plausible, not what the engine would have recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tierdiag.store.schema import EVENT_TABLES as TABLES_COPIED  # noqa: E402 - every event table, copy by copy

SUFFIX = "@c"  # req_id / session_id of copy k >= 1: the source's + "@c<k>"

# Per table: column -> how copy k's value is made from the source row (`k` the copy, SPAN / *_N
# the offsets, bound below). Columns not named are copied as they are.
_TIME = "{c} + k * {span}"


def _renamed(col: str) -> str:
    return f"CASE WHEN k = 0 OR {col} IS NULL THEN {col} ELSE {col} || '{SUFFIX}' || k END"


def _shifted(col: str, n: str) -> str:
    return f"{col} + k * {n}"


def _recipes(span: int, n: dict[str, int]) -> dict[str, dict[str, str]]:
    def t(c: str) -> str:
        return _TIME.format(c=c, span=span)

    return {
        "requests": {"req_id": _renamed("req_id"), "seq": _shifted("seq", str(n["seq"])),
                     "arrival_ns": t("arrival_ns"), "first_token_ns": t("first_token_ns"),
                     "finish_ns": t("finish_ns"), "trace_arrival_ns": t("trace_arrival_ns"),
                     "first_batch_id": _shifted("first_batch_id", str(n["batch_id"])),
                     "session_id": _renamed("session_id")},
        "evictions": {"eviction_id": _shifted("eviction_id", str(n["eviction_id"])), "t_ns": t("t_ns"),
                      "node_id": _shifted("node_id", str(n["node_id"])), "cause_req_id": _renamed("cause_req_id"),
                      "owner_req_id": _renamed("owner_req_id"), "node_last_access_ns": t("node_last_access_ns")},
        "request_evictions": {"req_id": _renamed("req_id"),
                              "eviction_id": _shifted("eviction_id", str(n["eviction_id"]))},
        "transfers": {"transfer_id": _shifted("transfer_id", str(n["transfer_id"])),
                      "t_start_ns": t("t_start_ns"), "t_end_ns": t("t_end_ns"), "req_id": _renamed("req_id")},
        "batches": {"batch_id": _shifted("batch_id", str(n["batch_id"])),
                    "t_start_ns": t("t_start_ns"), "t_end_ns": t("t_end_ns")},
        "pool_samples": {"t_ns": t("t_ns")},
    }


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def copy_trace(src: Path, dst: Path, copies: int, span_ns: int, time_scale: float) -> str:
    """The source trace's lines, copied as the rows are; the new file's sha256."""
    lines = [json.loads(s) for s in src.read_text().splitlines() if s.strip()]
    top_hash = max((h for rec in lines for h in rec.get("hash_ids") or ()), default=-1) + 1
    step_ms = span_ns / 1e6 / (time_scale or 1.0)  # the trace's timestamps are ms before time_scale
    digest = hashlib.sha256()
    with open(dst, "wb") as out:
        for k in range(copies):
            for rec in lines:
                if k:
                    rec = dict(rec)
                    for key in ("id", "session", "session_id"):
                        if rec.get(key) is not None:
                            rec[key] = f"{rec[key]}{SUFFIX}{k}"
                    if "timestamp" in rec:
                        ts = rec["timestamp"] + k * step_ms
                        rec["timestamp"] = int(ts) if float(ts).is_integer() else ts
                    if rec.get("hash_ids"):
                        rec["hash_ids"] = [h + k * top_hash for h in rec["hash_ids"]]
                line = (json.dumps(rec) + "\n").encode()
                out.write(line)
                digest.update(line)
    return digest.hexdigest()


def build(source: Path, out: Path, copies: int, run: str | None = None, *, evidence: bool = True) -> dict:
    """Copy `run` of `source` (its newest complete run when None) `copies` times into a new store `out`."""
    import duckdb

    from tierdiag.store.schema import TABLES, new_run_id
    from tierdiag.store.writer import init_store

    if copies < 1:
        raise ValueError(f"--copies must be at least 1, not {copies}")
    if out.exists():
        raise FileExistsError(f"{out} exists: big_store writes a new store only")
    t0 = time.perf_counter()
    con = duckdb.connect(str(out))
    try:
        init_store(con, path_for_errors=str(out))
        con.execute(f"ATTACH '{str(source.resolve())}' AS src (READ_ONLY)")
        if run is None:
            got = con.execute("SELECT run_id FROM src.runs WHERE status = 'complete' "
                              "ORDER BY created_at DESC LIMIT 1").fetchone()
            if got is None:
                raise ValueError(f"{source} holds no complete run")
            run = got[0]
        (runs_row,) = con.execute("SELECT * FROM src.runs WHERE run_id = ?", [run]).fetchall() or [None]
        if runs_row is None:
            raise ValueError(f"{source} holds no run {run!r}")
        cols = list(TABLES["runs"])
        src_run = dict(zip([d[0] for d in con.description], runs_row))
        # The copies' offsets: the source's last instant, its largest ids.
        last = max(v or 0 for v in con.execute(
            "SELECT (SELECT max(greatest(arrival_ns, coalesce(finish_ns, 0), coalesce(first_token_ns, 0))) "
            "        FROM src.requests WHERE run_id = $r), "
            "(SELECT max(t_end_ns) FROM src.batches WHERE run_id = $r), "
            "(SELECT max(t_end_ns) FROM src.transfers WHERE run_id = $r), "
            "(SELECT max(t_ns) FROM src.evictions WHERE run_id = $r), "
            "(SELECT max(t_ns) FROM src.pool_samples WHERE run_id = $r)", {"r": run}).fetchone())
        span = (last // 10**9 + 2) * 10**9
        n = dict(zip(("seq", "batch_id", "eviction_id", "transfer_id", "node_id"), (int(v or 0) + 1 for v in con.execute(
            "SELECT (SELECT max(seq) FROM src.requests WHERE run_id = $r), "
            "(SELECT max(batch_id) FROM src.batches WHERE run_id = $r), "
            "(SELECT greatest((SELECT max(eviction_id) FROM src.evictions WHERE run_id = $r), "
            "                 (SELECT max(eviction_id) FROM src.request_evictions WHERE run_id = $r))), "
            "(SELECT max(transfer_id) FROM src.transfers WHERE run_id = $r), "
            "(SELECT max(node_id) FROM src.evictions WHERE run_id = $r)", {"r": run}).fetchone())))
        new_id = new_run_id()
        config = json.loads(src_run.get("config_json") or "{}")
        trace_out = out.with_suffix(".jsonl")
        sha = None
        if src_run.get("trace_path") and os.path.isfile(src_run["trace_path"]):
            sha = copy_trace(Path(src_run["trace_path"]), trace_out, copies, span,
                             float(config.get("time_scale") or 1.0))
        recipes = _recipes(span, n)
        con.execute("BEGIN")
        row = {**src_run, "run_id": new_id, "name": f"big-store-x{copies}",
               "num_requests": (src_run.get("num_requests") or 0) * copies,
               "command_line": f"benchmarks/big_store.py {source} {out} --copies {copies} --run {run}",
               "trace_path": str(trace_out.resolve()) if sha else src_run.get("trace_path"),
               "trace_sha256": sha or src_run.get("trace_sha256")}
        con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                    [row[c] for c in cols])
        counts = {}
        for table in TABLES_COPIED:
            exprs = [f"'{new_id}'" if c == "run_id" else f"{recipes.get(table, {}).get(c, c)}" for c in TABLES[table]]
            # Copy by copy, each in the source's own row order (the order its writer appended).
            con.execute(f"INSERT INTO {table} ({', '.join(TABLES[table])}) "
                        f"SELECT {', '.join(exprs)} FROM (SELECT *, rowid AS _row FROM src.{table} WHERE run_id = ?) s, "
                        f"range({copies}) c(k) ORDER BY k, _row", [run])
            counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        con.execute("COMMIT")
        con.execute("DETACH src")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    copied_s = time.perf_counter() - t0
    _say(f"big_store: {counts['requests']:,} requests ({copies} copies of run {run}) in {copied_s:.1f} s")
    evidence_s = None
    if evidence:
        from tierdiag.diagnose.run.evidence import record_run_evidence

        t1 = time.perf_counter()
        warning = record_run_evidence(out, new_id)
        evidence_s = time.perf_counter() - t1
        _say(f"big_store: run evidence {'not stored: ' + warning if warning else 'stored'} in {evidence_s:.1f} s")
    return {"db": str(out), "run_id": new_id, "source_run": run, "copies": copies, "rows": counts,
            "requests": counts["requests"], "copy_s": copied_s, "evidence_s": evidence_s,
            "trace": str(trace_out) if sha else None}


def build_from_synth(out: Path, requests: int, copies: int, tmp: Path | None = None) -> dict:
    """`tierdiag synth` (sessions included) of `requests`, replayed, then copied `copies` times."""
    with tempfile.TemporaryDirectory(prefix="tierdiag-bigstore-", dir=tmp) as d:
        trace, db = Path(d) / f"synth-{requests}.jsonl", Path(d) / f"synth-{requests}.duckdb"
        cli = [sys.executable, "-c", "import tierdiag.cli.main as m; m.entry()"]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        subprocess.run(cli + ["synth", str(trace), "--requests", str(requests)], check=True, env=env,
                       capture_output=True)
        _say(f"big_store: replaying {requests:,} synth requests")
        subprocess.run(cli + ["replay", str(trace), "--db", str(db), "--verify", "off", "--json"], check=True,
                       env=env, capture_output=True)
        return build(db, out, copies)  # the trace is copied beside `out` before the folder goes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, nargs="?", help="a run store to copy (not with --build)")
    ap.add_argument("out", type=Path, help="the new store (must not exist); its trace goes beside it (.jsonl)")
    ap.add_argument("--build", action="store_true", help="synth and replay the source first")
    ap.add_argument("--requests", type=int, default=20_000, help="--build: the source's requests (default 20,000)")
    ap.add_argument("--copies", type=int, default=50, help="copies of the source run (default 50)")
    ap.add_argument("--run", default=None, help="the source's run id (default: its newest complete run)")
    ap.add_argument("--json", action="store_true", help="print what was built as JSON")
    args = ap.parse_args(argv)
    if args.build == (args.source is not None):
        ap.error("give SOURCE.duckdb, or --build without it")
    if args.copies < 1 or args.requests < 1:
        ap.error("--copies and --requests must be at least 1")
    if args.build:
        res = build_from_synth(args.out, args.requests, args.copies)
    else:
        res = build(args.source, args.out, args.copies, args.run)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
