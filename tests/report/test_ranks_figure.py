"""The report's load-and-reuse-per-rank figure: drawn for a data-parallel run (planted on a
replay, tests/support/ranks.py) from summary's per-rank numbers, absent for a run of one rank,
and rendered by headless Chromium (where Debian's chromium is installed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.ranks import REUSE_POOLS, plant_ranks, reuse_lines
from tests.support.traces import write_trace
from tierdiag.diagnose.dp.ranks import rank_summary
from tierdiag.report import html as rh
from tierdiag.report.ranks_figure import ranks_figure
from tierdiag.report.ranks_view import imbalance_line, routing_line
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ranks-report")
    trace = write_trace(folder / "reuse.jsonl", reuse_lines())
    path = folder / "run.duckdb"
    for name in ("solo", "ca"):
        result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(path), "--run-name", name, *REUSE_POOLS])
        assert result.exit_code == 0, result.output
    with open_store(path) as con:
        rid = resolve_run(con, "ca").run_id
    plant_ranks(path, rid, dp=4, router="cache_aware")
    return path


def test_the_figure_is_summary_per_rank_numbers(db):
    with open_store(db) as con:
        s = rank_summary(con, resolve_run(con, "ca"))
        assert ranks_figure(rank_summary(con, resolve_run(con, "solo"))) is None
    spec = ranks_figure(s)
    assert spec.key == "ranks" and spec.section == "headline"
    bars = [t for t in spec.figure["data"] if t["type"] == "bar"]
    line, = (t for t in spec.figure["data"] if t["type"] == "scatter")
    assert [t["name"] for t in bars] == ["device tokens", "host tokens", "storage tokens", "computed tokens"]
    for i, k in enumerate(s.ranks):
        assert bars[0]["customdata"][i] == k.device_hit_tokens and bars[1]["customdata"][i] == k.host_hit_tokens
        assert sum(t["customdata"][i] for t in bars) == k.input_tokens
        assert sum(t["y"][i] for t in bars) == pytest.approx(100.0)
        assert line["y"][i] == pytest.approx(100 * k.prefill_busy_share)
    assert spec.note == f"{imbalance_line(s)} · {routing_line(s)}"


def test_the_report_has_it_for_a_ranked_run_only(db, tmp_path):
    ranked = rh.build_report(db, "ca", tmp_path / "ca.html").path.read_text(encoding="utf-8")
    solo = rh.build_report(db, "solo", tmp_path / "solo.html").path.read_text(encoding="utf-8")
    assert 'id="fig-ranks"' in ranked and "Load and reuse per rank (4 ranks, router cache_aware)" in ranked
    assert 'id="fig-ranks"' not in solo and "per rank" not in solo


@pytest.mark.chromium
def test_chromium_draws_it(db, tmp_path):
    from test_report_chromium import CHROMIUM, _assert_rendered, render

    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    report = rh.build_report(db, "ca", tmp_path / "ca.html")
    result = render(report.path)
    _assert_rendered(result, report.figures)
    fig = next(f for f in result["drawn"] if f["id"] == "fig-ranks")
    assert fig["traces"] == 5 and fig["svgmarks"] >= 4
    assert "Load and reuse per rank" in result["text"]
