"""Every figure is a valid Plotly figure and draws what the data says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from fake_run import LINK_BYTES_PER_S, write_fake_run
from tierdiag.report import data as rd
from tierdiag.report.figures import build_figures, ttft_unit
from tierdiag.store.reader import open_store, resolve_run


@pytest.fixture(scope="module")
def report_data(tmp_path_factory):
    db = tmp_path_factory.mktemp("fig") / "run.duckdb"
    write_fake_run(db, 500, 7)
    with open_store(db) as con:
        return rd.load_report_data(con, resolve_run(con, None))


@pytest.fixture(scope="module")
def figures(report_data):
    return {f.key: f for f in build_figures(report_data)}


def test_every_figure_is_valid_plotly(figures):
    assert len(figures) >= 4
    for spec in figures.values():
        # Validation catches misspelt attributes that Plotly.js would silently ignore.
        go.Figure(spec.figure)
        assert spec.how_to_read and "\n" not in spec.how_to_read, spec.key
        assert not spec.empty, spec.key


def test_sections_cover_the_issue(figures):
    sections = {f.section for f in figures.values()}
    assert {"headline", "time", "requests", "distributions", "decomposition"} <= sections


def test_tier_split_bars_sum_to_100(figures):
    fig = figures["tier-split"].figure
    x = np.array([t["x"] for t in fig["data"]])  # parts x classes
    assert np.allclose(x.sum(axis=0), 100)


def test_scatter_has_every_point_with_id_and_verdict(figures, report_data):
    traces = figures["ttft-vs-host-share"].figure["data"]
    assert all(t["type"] == "scattergl" for t in traces)
    ids = [row[0] for t in traces for row in t["customdata"]]
    assert sorted(ids) == sorted(report_data.points.req_id.tolist())
    causes = {row[1] for t in traces for row in t["customdata"]}
    assert causes <= {"none", "queueing", "load_back", "storage_fetch", "recompute", "compute"}
    assert all("%{customdata[0]}" in t["hovertemplate"] and "verdict" in t["hovertemplate"] for t in traces)


def test_timeline_rows_share_one_x_axis(figures):
    fig = figures["timeline"].figure
    assert {t["xaxis"] for t in fig["data"]} == {"x"}
    yaxes = {t["yaxis"] for t in fig["data"]}
    assert yaxes == {"y", "y2", "y3"}  # device, host, bandwidth
    peak = [t for t in fig["data"] if t["name"] == "link peak"]
    assert peak and peak[0]["y"][0] == pytest.approx(LINK_BYTES_PER_S / 1e9)
    assert any(t["name"] == "device evictions" for t in fig["data"])


def test_histograms_count_every_load_back(figures, report_data):
    n = len(report_data.transfers.bytes)
    latency = figures["loadback-latency"].figure["data"][0]
    assert latency["y"].sum() == n
    bw = figures["loadback-bandwidth"].figure["data"][0]
    assert bw["y"].sum() == n
    shapes = figures["loadback-bandwidth"].figure["layout"]["shapes"]
    assert shapes[0]["x0"] == pytest.approx(LINK_BYTES_PER_S / 1e9)


def test_decomposition_stacks_to_mean_ttft(figures, report_data):
    fig = figures["decomposition-class"].figure
    total = np.sum([t["x"] for t in fig["data"]], axis=0)
    d = report_data.decomposition
    classes = [c for c in rd.CLASSES if c in d.by_class][::-1]
    unit = ttft_unit(report_data)
    for cls, value in zip(classes, total):
        assert value == pytest.approx(sum(d.by_class[cls].values()) / unit.ns)


def test_no_load_backs_gives_empty_distribution_figures(tmp_path: Path):
    db = tmp_path / "r.duckdb"
    write_fake_run(db, 40, 2)
    import duckdb

    with duckdb.connect(str(db)) as rw:
        rw.execute("DELETE FROM transfers")
    with open_store(db) as con:
        data = rd.load_report_data(con, resolve_run(con, None))
    figs = {f.key: f for f in build_figures(data)}
    assert figs["loadback-latency"].empty and figs["loadback-bandwidth"].empty
    assert not figs["ttft-vs-host-share"].empty
