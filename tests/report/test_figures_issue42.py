"""Issue 42 item 6: the two figures a newcomer found hard to read, checked as data and, where
Debian's chromium is installed, as rendered at the browser's default window size.

- The session-pause chart: TTFT p50/p99 on a log axis of their own with round ticks, so the p50
  line (often 100x below p99) is not flat on zero.
- The TTFT-vs-host-share scatter: requests with no host share (device hits and misses alike sit at
  x = 0) get a strip a class, jittered, left of the host-share panel, so neither hides the other.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli.cli_helpers import cli_here
from tierdiag.report.figures import STRIP_JITTER, build_figures
from tierdiag.report.html import build_report
from tierdiag.report.series import load_report_data
from tierdiag.report.sessions_figure import survival_figure
from tierdiag.store.reader import open_store, resolve_run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SAMPLES = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples"


@pytest.fixture(scope="module")
def session_run(tmp_path_factory):
    """The demo sample (sessions, agents, shared prompts): every class, host shares of 0 and more."""
    tmp = tmp_path_factory.mktemp("fig42")
    db = tmp / "r.duckdb"
    r = cli_here("replay", SAMPLES / "demo.jsonl", "--db", db, "--device-tokens", 98304, "--verify", "off")
    assert r.returncode == 0, r.stderr
    with open_store(db) as con:
        data = load_report_data(con, resolve_run(con, None))
    return tmp, db, data


def test_scatter_strips_keep_classes_apart(session_run):
    _, _, data = session_run
    fig = {f.key: f for f in build_figures(data)}["ttft-vs-host-share"].figure
    strips = [t for t in fig["data"] if t["xaxis"] == "x"]
    shares = [t for t in fig["data"] if t["xaxis"] == "x2"]
    assert {t["name"] for t in strips} >= {"device hit", "miss"}
    ticks = fig["layout"]["xaxis"]["ticktext"]
    for t in strips:  # each class in its own strip: around its tick, never reaching the next
        i = ticks.index(t["name"])
        x = np.asarray(t["x"], dtype=float)
        assert np.all(np.abs(x - i) <= STRIP_JITTER) and np.ptp(x) > 0
        assert all(row[4] == 0 for row in t["customdata"])  # host share 0, said in the hover
    for t in shares:
        assert np.all(np.asarray(t["x"], dtype=float) > 0)
    # one legend entry a class, though a class may have points in both panels
    names = [t["name"] for t in fig["data"] if t["showlegend"]]
    assert len(names) == len(set(names))
    # deterministic: the same report twice is the same file
    again = {f.key: f for f in build_figures(data)}["ttft-vs-host-share"].figure
    assert [list(t["x"]) for t in again["data"]] == [list(t["x"]) for t in fig["data"]]


def test_session_chart_ttft_on_a_log_axis_with_round_ticks(session_run):
    _, _, data = session_run
    fig = survival_figure(data.summary.sessions).figure
    y2 = fig["layout"]["yaxis2"]
    assert y2["type"] == "log" and y2["overlaying"] == "y"
    assert y2["ticktext"] and all(re.fullmatch(r"[\d,]+ (µs|ms|s)", t) for t in y2["ticktext"]), y2["ticktext"]
    p50 = next(t for t in fig["data"] if t["name"] == "TTFT p50")
    values = [v for v in p50["y"] if v is not None]
    assert values and min(values) > 0  # on a log axis: above the floor, not at zero
    lo, hi = min(y2["tickvals"]), max(y2["tickvals"])
    assert lo <= max(values) and min(values) <= hi * 10  # the line is inside the ticks' span



_FIGURE = """(id) => {
    const d = document.getElementById(id);
    const ticks = sel => Array.from(d.querySelectorAll(sel)).map(t => t.textContent);
    const gl = Array.from(d.querySelectorAll('canvas.gl-canvas-context')).reduce((n, c) => {
        const o = document.createElement('canvas'); o.width = c.width; o.height = c.height;
        const ctx = o.getContext('2d'); ctx.drawImage(c, 0, 0);
        const px = ctx.getImageData(0, 0, o.width, o.height).data;
        for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
        return n;
    }, 0);
    const lines = Array.from(d.querySelectorAll('.scatterlayer .trace')).map(tr => {
        const pts = Array.from(tr.querySelectorAll('.point')).map(p => p.getBoundingClientRect().top);
        return pts;
    });
    const r = d.getBoundingClientRect();
    return {x: ticks('.xtick text'), x2: ticks('.x2tick text'), y2: ticks('.y2tick text'), gl: gl,
            lines: lines, top: r.top, height: r.height, width: r.width};
}"""


@pytest.mark.slow
@pytest.mark.chromium
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_figures_render_at_the_default_window_size(session_run):
    from playwright.sync_api import sync_playwright

    tmp, db, _ = session_run
    report = build_report(db, None, tmp / "report.html").path
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()  # Playwright's default window: 1280 x 720
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.resolve().as_uri())
            page.wait_for_function("() => document.querySelectorAll('.plot .main-svg').length > 0")
            shots = {}
            for fid in ("fig-ttft-vs-host-share", "fig-session-survival"):
                el = page.query_selector("#" + fid)
                el.scroll_into_view_if_needed()
                page.wait_for_timeout(300)
                shots[fid] = tmp / f"{fid}.png"
                el.screenshot(path=str(shots[fid]))
                shots[fid + ":dom"] = page.evaluate(_FIGURE, fid)
        finally:
            browser.close()
    assert not errors, errors
    scatter = shots["fig-ttft-vs-host-share:dom"]
    assert "device hit" in scatter["x"] and "miss" in scatter["x"]  # the strip panel's two classes
    assert "100 %" in scatter["x2"] or "100 %" in " ".join(scatter["x2"])
    assert scatter["gl"] > 500  # WebGL painted the points
    assert scatter["width"] <= 1280
    chart = shots["fig-session-survival:dom"]
    assert chart["y2"] and all(re.fullmatch(r"[\d,]+ (µs|ms|s)", t) for t in chart["y2"]), chart["y2"]
    # the p50 line's points are not all on the floor: they sit at different heights
    p50_points = [pts for pts in chart["lines"] if len(pts) >= 2]
    assert p50_points and any(max(pts) - min(pts) > 5 for pts in p50_points)
    for fid in ("fig-ttft-vs-host-share", "fig-session-survival"):
        assert shots[fid].stat().st_size > 10_000  # a drawn figure, not a blank box
