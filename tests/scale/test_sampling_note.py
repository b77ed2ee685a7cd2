"""A big run's report draws a sample of its requests, and says which and how many."""

from __future__ import annotations

from pathlib import Path

from tests.report.fake_run import write_fake_run
from tierdiag.diagnose.read.series import FINISHED_WHERE
from tierdiag.diagnose.request.causes import excess_sql
from tierdiag.report import series as rd
from tierdiag.report import html as rh
from tierdiag.store.reader import open_store, resolve_run


def test_the_scatter_keeps_the_slowest_samples_the_rest_uniformly_and_says_so(tmp_path: Path):
    db = tmp_path / "run.duckdb"
    write_fake_run(db, 400, 3)
    with open_store(db) as con:
        run = resolve_run(con, None)
        pts = rd.load_points(con, run, max_points=120, keep_slowest=20)
        again = rd.load_points(con, run, max_points=120, keep_slowest=20)
        (total,) = con.execute(f"SELECT count(*) FROM requests WHERE {FINISHED_WHERE}", {"run": run.run_id}).fetchone()
        slowest = {r[0] for r in con.execute(
            f"SELECT req_id, {excess_sql()} AS x FROM requests WHERE {FINISHED_WHERE} ORDER BY x DESC, req_id LIMIT 20",
            {"run": run.run_id}).fetchall()}
    assert pts.sampled and len(pts.req_id) == 120 and pts.total == total > 120
    assert slowest <= set(pts.req_id)  # the point of the plot is never sampled away
    assert list(pts.req_id) == list(again.req_id)  # same run, same sample
    assert pts.sampling_note == (
        f"sampled: 120 of {total:,} requests shown — the 20 slowest by excess TTFT all kept, the other 100 "
        f"sampled uniformly from the remaining {total - 20:,} by a hash of the request id "
        "(the same run draws the same sample)")
    with open_store(db) as con:
        small = rd.load_points(con, resolve_run(con, None), max_points=10_000)
    assert not small.sampled and small.sampling_note == "" and len(small.req_id) == total


def test_the_report_page_carries_the_note(tmp_path: Path, monkeypatch):
    db = tmp_path / "run.duckdb"
    write_fake_run(db, 300, 4)
    monkeypatch.setattr(rd, "MAX_SCATTER_POINTS", 100)
    monkeypatch.setattr(rd, "SLOWEST_ALWAYS_KEPT", 10)
    page = rh.build_report(db, None, tmp_path / "r.html").path.read_text()
    assert "requests shown — the 10 slowest by excess TTFT all kept, the other 90 sampled uniformly" in page
