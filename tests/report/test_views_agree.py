"""One definition per metric: replay's closing table, `summary` and the report print the same
numbers for the same run, and every percentile is the nearest rank (DuckDB's quantile_disc).

The trace starts late (its first request at 1,178,625 ms, like a slice of a longer trace), so
a view that counted the idle lead-in in the run's span would disagree here.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tierdiag.cli.main import app
from tierdiag.diagnose.read.quantile import QUANTILE_SQL, nearest_rank
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.report import series as rd
from tierdiag.report import html as rh
from tierdiag.store.reader import open_store, resolve_run

runner = CliRunner()
FIRST_ARRIVAL_MS = 1_178_625


def _trace(path: Path, n: int = 90) -> Path:
    """Sessions that share system prompts and come back, arriving from FIRST_ARRIVAL_MS on."""
    rng = random.Random(7)
    lines = []
    for i in range(n):
        system = [1000 + (i % 17) % 3]  # three shared system prompts, one block each
        session = [5000 + 10 * (i % 17) + k for k in range(1 + i // 17)]  # grows as a session returns
        lines.append(json.dumps({"timestamp": FIRST_ARRIVAL_MS + 40 * i + rng.randint(0, 30),
                                 "input_length": 64 * (len(system) + len(session) - 1) + rng.randint(1, 64),
                                 "output_length": rng.randint(1, 8), "hash_ids": system + session}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agree")
    db = tmp / "run.duckdb"
    rep = runner.invoke(app, ["replay", str(_trace(tmp / "late.jsonl")), "--db", str(db), "--model", "tiny",
                              "--gpu", "cpu", "--block-size", "64", "--device-tokens", "1024",
                              "--host-tokens", "4096", "--json"])
    assert rep.exit_code == 0, rep.output
    summ = runner.invoke(app, ["summary", "--db", str(db), "--json"])
    assert summ.exit_code == 0, summ.output
    with open_store(db) as con:
        run = resolve_run(con, None)
        data = rd.load_report_data(con, run)
        summary = run_summary(con, run)
    return json.loads(rep.stdout), json.loads(summ.stdout), data, summary, db


def test_replay_and_summary_percentiles_agree(views):
    replay, summary, _, _, _ = views
    all_ = next(c for c in summary["classes"] if c["hit_class"] == "all")
    assert replay["num_requests"] == all_["num_requests"] > 50
    for q in ("p50", "p90", "p99"):
        assert replay[f"ttft_{q}_ms"] == all_[f"ttft_{q}_ms"], q


def test_span_starts_at_the_first_arrival_in_every_view(views):
    replay, summary, data, sm, _ = views
    # Not the 1,178 s of idle lead-in before the first request.
    assert replay["virtual_s"] * 1e3 == pytest.approx(summary["span_ms"], rel=1e-6)
    assert summary["span_ms"] < 60_000
    assert FIRST_ARRIVAL_MS * 1_000_000 <= data.headline.t0_ns < (FIRST_ARRIVAL_MS + 40) * 1_000_000
    assert data.timeline.t_min_s == 0 and data.timeline.t_max_s == pytest.approx(sm.span_ns / 1e9, rel=1e-6)
    # Busy shares over that span agree between replay and the report's load lane.
    assert data.load.prefill_busy_share == pytest.approx(replay["prefill_busy_share"], rel=1e-6)


def test_report_headline_is_summary(views):
    _, summary, data, sm, db = views
    assert data.summary == sm
    by_class = {c["hit_class"]: c for c in summary["classes"]}
    for box in data.headline.ttft:
        assert box.p50_ns / 1e6 == pytest.approx(by_class[box.hit_class]["ttft_p50_ms"], abs=1e-6)
        assert box.p99_ns / 1e6 == pytest.approx(by_class[box.hit_class]["ttft_p99_ms"], abs=1e-6)
    split = data.headline.tier_split["all"]
    assert split["device"] == summary["tokens"]["device_tokens"]
    assert split["new"] + split["recomputed"] == summary["tokens"]["computed_tokens"]
    # The page prints summary's numbers, formatted the one way.
    from tierdiag.units import fmt_ms

    page = rh.build_report(db, None, db.parent / "r.html").path.read_text(encoding="utf-8")
    assert fmt_ms(sm.classes[-1].ttft_p50_ns) in page
    assert f"{sm.num_requests:,}" in page


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 99, 100, 101, 700, 1001])
def test_nearest_rank_is_duckdb_quantile_disc(n):
    rng = random.Random(n)
    values = [rng.randint(0, 10**9) for _ in range(n)]
    qs = [0.0, 0.01, 0.1, 0.25, 0.29, 0.5, 0.57, 0.75, 0.9, 0.99, 0.999, 1.0] + [rng.random() for _ in range(20)]
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT unnest(?) AS x", [values])
    for q in qs:
        (expect,) = con.execute(f"SELECT {QUANTILE_SQL}(x, {q!r}) FROM t").fetchone()
        assert nearest_rank(values, q) == expect, (n, q)
    assert nearest_rank([], 0.5) is None
