"""Every figure is a valid Plotly figure and draws what the data says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from fake_run import LINK_BYTES_PER_S, write_fake_run
from tierdiag.units import fmt_pct
from tierdiag.report import series as rd
from tierdiag.report.figures import build_figures, log_ticks, ttft_unit
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


def test_load_timeline_lanes(figures, report_data):
    fig = figures["load"].figure
    names = {t["name"] for t in fig["data"]}
    assert {"waiting (no batch yet)", "prefilling", "decoding", "queued prefill tokens", "GPU: new tokens"} <= names
    assert {t["yaxis"] for t in fig["data"]} == {"y", "y2", "y3"} and {t["xaxis"] for t in fig["data"]} == {"x"}
    gpu = [t for t in fig["data"] if t["name"].startswith("GPU: ") and "stackgroup" in t]
    stacked = np.sum([t["y"] for t in gpu], axis=0)
    assert stacked == pytest.approx(report_data.load.busy_total * 100)
    # Decode is GPU time too: its own line over the prefill stack (the model overlaps the two).
    decode, = (t for t in fig["data"] if t["name"] == "GPU: decoding (any request)")
    assert "stackgroup" not in decode and decode["yaxis"] == "y3"
    assert decode["y"] == pytest.approx(report_data.load.busy_decode * 100)
    title = fig["layout"]["annotations"][2]["text"]
    assert "GPU busy in prefill" in title and f"decoding {fmt_pct(report_data.load.decode_busy_share)}" in title


def test_reuse_and_ttft_over_time(figures, report_data):
    reuse = figures["reuse-over-time"].figure["data"]
    assert [t["stackgroup"] for t in reuse] == ["tokens"] * len(rd.TIER_PARTS)
    shares = np.sum([t["y"] for t in reuse], axis=0)
    assert shares == pytest.approx(np.full(len(shares), 100.0))
    ttft = figures["ttft-over-time"].figure
    unit = ttft_unit(report_data)
    p50, p99 = (t["y"] for t in ttft["data"])
    assert p50 == pytest.approx(report_data.decomposition.bin_p50_ns / unit.ns)
    assert np.all(p50 <= p99)


@pytest.mark.parametrize("lo,hi,expect", [
    (4e6, 650e6, ["5 ms", "10 ms", "20 ms", "50 ms", "100 ms", "200 ms", "500 ms"]),
    (1e6, 30e9, ["1 ms", "10 ms", "100 ms", "1 s", "10 s"]),
    (11e6, 19e6, ["11 ms", "19 ms"]),  # narrower than one 1..9 step: the two ends
    (12e6, 45e6, ["20 ms", "30 ms", "40 ms"]),
    (2e9, 2.2e12, ["10 s", "100 s", "1,000 s"]),
    (3e3, 9e5, ["5 µs", "10 µs", "20 µs", "50 µs", "100 µs", "200 µs", "500 µs"]),
])
def test_log_ticks_are_round_values_with_units(lo, hi, expect):
    vals, text = log_ticks(lo, hi)
    assert text == expect and len(vals) >= 2
    assert all(lo * 0.999 <= v <= hi * 1.001 for v in vals)


def test_no_axis_uses_plotly_default_log_ticks(figures):
    # Plotly's log ticks label 2 and 5 without their decade ("5, 2, 100, 5"): every log axis
    # carries its own round tick values, labelled with units.
    for spec in figures.values():
        for key, axis in spec.figure["layout"].items():
            if key.startswith(("xaxis", "yaxis")) and axis.get("type") == "log":
                assert len(axis["tickvals"]) >= 2 and all(" " in t for t in axis["ticktext"]), (spec.key, key)
    latency = figures["loadback-latency"].figure["layout"]["xaxis"]
    assert len(latency["tickvals"]) >= 3 and all(t.endswith(("ms", "µs", "s")) for t in latency["ticktext"])


def test_saturated_evictions_are_drawn_as_a_rate(tmp_path: Path, monkeypatch):
    db = tmp_path / "r.duckdb"
    write_fake_run(db, 400, 3)
    with open_store(db) as con:
        run = resolve_run(con, None)
        sparse = rd.load_report_data(con, run)
        monkeypatch.setattr(rd, "TIME_BINS", 20)  # every bin now has evictions
        dense = rd.load_report_data(con, run)
    ticks = {f.key: f for f in build_figures(sparse)}["timeline"].figure["data"]
    assert sparse.timeline.eviction_bins_share("device") <= 1 / 3
    assert any(t["name"] == "device evictions" for t in ticks)
    assert dense.timeline.eviction_bins_share("device") > 1 / 3
    fig = {f.key: f for f in build_figures(dense)}["timeline"].figure
    assert not any(t["name"] == "device evictions" for t in fig["data"])
    rate = next(t for t in fig["data"] if t["name"] == "device evicted tokens/s")
    m = dense.timeline.evictions[0]
    # The rate integrates back to every evicted token.
    assert np.sum(rate["y"]) * dense.timeline.bin_s == pytest.approx(m.tokens.sum())
    go.Figure(fig)
