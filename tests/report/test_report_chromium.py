"""The report renders in headless Chromium: every figure drawn, no console errors, no network.

Skipped only where Debian's `chromium` is absent (CI installs it; see .ci/run). Playwright
drives the system browser; it never downloads one of its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fake_run import write_fake_run
from tierdiag.report import html as rh

from tests.support.replays import shared_replay

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
CONVERSATION = TRACES / "conversation_trace.jsonl"
MAX_REPORT_BYTES = 25 * 1024 * 1024

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]

# Playwright makes a fresh temporary profile (--user-data-dir) for every launch.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

_DRAWN = """() => Array.from(document.querySelectorAll('.plot')).map(d => ({
    id: d.id,
    svg: d.querySelectorAll('.main-svg').length,
    gl: d.querySelectorAll('canvas').length,
    traces: (d._fullData || []).length,
    gltraces: (d._fullData || []).filter(t => t.type === 'scattergl').length,
    svgmarks: d.querySelectorAll('.point, .bars path, .boxlayer path, .scatterlayer .trace').length,
    // WebGL draws no SVG marks: count the pixels it painted into its context canvas.
    glpixels: Array.from(d.querySelectorAll('canvas.gl-canvas-context')).reduce((n, c) => {
        const o = document.createElement('canvas'); o.width = c.width; o.height = c.height;
        const ctx = o.getContext('2d'); ctx.drawImage(c, 0, 0);
        const px = ctx.getImageData(0, 0, o.width, o.height).data;
        for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
        return n;
    }, 0),
}))"""


_LAYOUT = """() => {
    const vw = document.documentElement.clientWidth;
    const box = el => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, w: r.width}; };
    const ticks = id => Array.from(document.querySelectorAll('#' + id + ' .ytick text, #' + id + ' .xtick text'))
        .map(t => t.textContent);
    return {
        vw: vw, scrollWidth: document.documentElement.scrollWidth,
        verdictCard: document.getElementById('verdict') ? box(document.getElementById('verdict')) : null,
        verdictCells: Array.from(document.querySelectorAll('#slowest td.verdict')).map(box),
        scatterTicks: ticks('fig-ttft-vs-host-share'), latencyTicks: ticks('fig-loadback-latency'),
    };
}"""


def render(path: Path, width: int = 1400, screenshot: Path | None = None) -> dict:
    from playwright.sync_api import sync_playwright

    console_errors: list[str] = []
    page_errors: list[str] = []
    fetched: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))

            def route(r):
                if r.request.url.startswith("file://"):
                    r.continue_()
                else:  # the report must work offline: any other fetch is a failure
                    fetched.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            # Generous limits: on a loaded 2-vCPU machine (load ~30) the page's load passed
            # Playwright's default 30 s (session 23, h41test3); a real failure still fails.
            page.goto(path.resolve().as_uri(), timeout=120_000)
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.plot')).every(d => d.querySelector('.main-svg'))",
                timeout=120_000)
            drawn = page.evaluate(_DRAWN)
            layout = page.evaluate(_LAYOUT)
            visible_text = page.inner_text("body")
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return {"drawn": drawn, "console_errors": console_errors, "page_errors": page_errors, "fetched": fetched,
            "text": visible_text, "layout": layout}


def _assert_rendered(result: dict, expected_figures: int) -> None:
    drawn = result["drawn"]
    assert len(drawn) == expected_figures >= 4
    for fig in drawn:
        assert fig["svg"] >= 1 and fig["traces"] >= 1, fig
        if fig["gltraces"]:
            assert fig["gl"] >= 1 and fig["glpixels"] > 0, fig
        else:
            assert fig["svgmarks"] >= 1, fig
    assert result["console_errors"] == [] and result["page_errors"] == []
    assert result["fetched"] == []


@pytest.mark.slow
def test_large_fake_run_renders_sampled(tmp_path: Path):
    # Past MAX_SCATTER_POINTS finished requests, so the scatter is sampled and says so.
    write_fake_run(tmp_path / "run.duckdb", 24_000, 21)
    report = rh.build_report(tmp_path / "run.duckdb", None, tmp_path / "big.html")
    assert report.sampled and report.bytes < MAX_REPORT_BYTES
    result = render(report.path)
    _assert_rendered(result, report.figures)
    assert "sampled: 20,000 of 23,998 requests" in result["text"]


@pytest.mark.shared
@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces/conversation_trace.jsonl")
def test_conversation_trace_report(tmp_path: Path, tmp_path_factory):
    """The issue's bar: the full Mooncake conversation-trace run (12,031 requests)."""
    # the one default replay of the trace this run (test_replay_cli checks its rows); read only
    db, replay = shared_replay(tmp_path_factory, CONVERSATION, "--json")
    assert replay.returncode == 0, replay.stderr[-2000:]
    report = rh.build_report(db, None, tmp_path / "reports" / "conv.html")
    assert report.bytes < MAX_REPORT_BYTES and report.figures >= 4
    page = report.path.read_text(encoding="utf-8")
    assert "12,031" in page  # the headline counts every request
    _assert_rendered(render(report.path), report.figures)


@pytest.mark.parametrize("width", [1400, 800])
def test_new_figures_and_verdict_at_laptop_and_narrow_widths(tmp_path: Path, width: int):
    write_fake_run(tmp_path / "run.duckdb", 400, 12)
    report = rh.build_report(tmp_path / "run.duckdb", None, tmp_path / "r.html")
    result = render(report.path, width, screenshot=tmp_path / f"r-{width}.png")
    _assert_rendered(result, report.figures)
    ids = {d["id"] for d in result["drawn"]}
    assert {"fig-load", "fig-reuse-over-time", "fig-ttft-over-time", "fig-timeline"} <= ids
    lay = result["layout"]
    # Nothing wider than the window; the verdict card and every verdict cell of the table on screen.
    assert lay["scrollWidth"] <= lay["vw"]
    assert lay["verdictCard"] and lay["verdictCard"]["right"] <= lay["vw"]
    assert lay["verdictCells"] and all(c["left"] >= 0 and c["right"] <= lay["vw"] and c["w"] > 150
                                       for c in lay["verdictCells"])
    assert "dominated excess TTFT" in result["text"]
    # Log axes: round values with units, and the latency histogram has several ticks.
    assert lay["scatterTicks"] and any(t.endswith(" ms") for t in lay["scatterTicks"])
    assert sum(t.endswith(("ms", "µs", " s")) for t in lay["latencyTicks"]) >= 3
