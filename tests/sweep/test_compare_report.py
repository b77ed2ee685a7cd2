"""The comparison report (`report --sweep`, `report --compare A B`): valid figures, every run on
the page with its name escaped, and the page drawn in headless Chromium without errors or fetches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import plotly.graph_objects as go
import pytest

from tests.sweep.sweep_helpers import NAMES, cli_here, one_line_error
from tierdiag.report.compare_figures import cdf_points, pareto_front

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
HOSTILE = "<script>alert(1)</script>[bold]x"


def test_cdf_points_keep_both_ends_and_are_monotone():
    ns = np.sort(np.random.default_rng(1).integers(1, 10**9, 10_000))
    x, y = cdf_points(ns, points=50)
    assert len(x) <= 50 and x[0] == ns[0] and x[-1] == ns[-1] and y[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    x, y = cdf_points(np.array([5, 7]))
    assert list(x) == [5, 7] and list(y) == [0.5, 1.0]


def test_pareto_front_is_the_runs_nothing_beats():
    #          A: small+slow  B: dominated  C: big+fast  D: same memory as C, slower
    points = [(1.0, 300.0), (2.0, 400.0), (4.0, 100.0), (4.0, 150.0)]
    assert pareto_front(points) == [0, 2]


@pytest.fixture
def hostile_db(tmp_path, swept) -> Path:
    """A copy of the sweep's store where one run's name is markup."""
    db = tmp_path / "copy.duckdb"
    shutil.copy(swept, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET name = ? WHERE name = 'host_tokens=16k,write_policy=write_back'", [HOSTILE])
    return db


def _page(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_sweep_report_names_every_run_and_escapes_them(tmp_path, hostile_db):
    out = tmp_path / "reports" / "sweep.html"
    proc = cli_here("report", "--sweep", "sweep-", "--db", hostile_db, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["path"] == str(out) and len(result["run_ids"]) == 4 and result["figures"] == 7
    page = _page(out)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;[bold]x" in page
    for name in NAMES - {"host_tokens=16k,write_policy=write_back"}:
        assert name in page
    assert "Largest TTFT gains" in page and "Memory vs TTFT p99" in page
    # Every figure dict is a valid Plotly figure.
    import re

    for block in re.findall(r'<script type="application/json" data-plot="[^"]+">(.*?)</script>', page, re.S):
        spec = json.loads(block.replace("<\\/", "</"))
        go.Figure(data=spec["data"], layout=spec["layout"])


def test_report_compare_two_runs_and_its_errors(tmp_path, swept):
    a, b = "host_tokens=16k,write_policy=write_through", "host_tokens=64k,write_policy=write_back"
    out = tmp_path / "ab.html"
    proc = cli_here("report", "--compare", a, b, "--db", swept, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert f"A = <b>{a}</b>" in _page(out)
    one_line_error(cli_here("report", "--sweep", "sweep-", "--run", a, "--db", swept), 2, "give one of them")
    one_line_error(cli_here("report", "--sweep", "nosuch", "--db", swept), 4, "is not a sweep")


@pytest.mark.chromium
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_sweep_report_renders_in_chromium(tmp_path, swept):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "sweep.html"
    assert cli_here("report", "--sweep", "sweep-", "--db", swept, "-o", out).returncode == 0
    errors, fetched = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                       else (fetched.append(r.request.url), r.abort()))
            page.goto(out.resolve().as_uri())
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.plot')).every(d => d.querySelector('.main-svg'))",
                timeout=60_000)
            drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.plot')).map(d => ({
                id: d.id, traces: (d._fullData || []).length,
                marks: d.querySelectorAll('.scatterlayer .trace path, .bars path, .point').length}))""")
            text = page.inner_text("body")
            page.screenshot(path=str(tmp_path / "sweep.png"), full_page=True)
        finally:
            browser.close()
    assert errors == [] and fetched == []
    assert {d["id"] for d in drawn} == {"fig-cdf-all", "fig-cdf-device_hit", "fig-cdf-tiered_hit", "fig-cdf-miss",
                                        "fig-reuse-bars", "fig-pareto-p50", "fig-pareto-p99"}
    for d in drawn:
        assert d["traces"] >= 1 and d["marks"] >= 1, d
    cdf = next(d for d in drawn if d["id"] == "fig-cdf-all")
    assert cdf["traces"] == 4  # one curve per run
    assert "Largest TTFT gains" in text and "Verdicts that changed" in text
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
