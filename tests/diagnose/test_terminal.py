"""The Rich views render every planted case, verdict first, with numbers in units."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.request.slow import slow_requests
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.report.terminal import render_explanation, render_slow, render_summary
from tierdiag.store.reader import open_store, resolve_run

from .conftest import RunBuilder


def _render(fn, *args, **kwargs) -> str:
    buf = io.StringIO()
    fn(*args, Console(file=buf, width=100, color_system=None), **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("req_id", ["tier", "dev", "miss", "stor", "recomp", "skip", "queued", "chunky", "rej"])
def test_explain_renders_verdict_then_steps(planted, req_id):
    with open_store(planted.path) as con:
        e = explain_request(con, resolve_run(con, None), req_id)
    text = _render(render_explanation, e)
    assert text.index("verdict:") < text.index("1 · host_hit_length") < text.index("4 · eviction")
    # The headline is wrapped to the panel; its first words sit on the first line inside it.
    assert e.headline.split(";")[0].split()[0] in text.splitlines()[1]


def test_slow_and_summary_render(planted):
    with open_store(planted.path) as con:
        run = resolve_run(con, None)
        rows = slow_requests(con, run, top=3)
        summary = run_summary(con, run)
    text = _render(render_slow, rows, run_label="planted")
    assert "tier" in text and "load_back" in text and "8.00 ms" in text
    assert "0 / 2,048 / 0 / 64" in text  # device / host / storage / computed
    text = _render(render_summary, summary)
    assert "token-weighted" in text and "18,488" in text and "below_threshold" in text
    assert _render(render_slow, [], run_label="planted").startswith("no request slower than its ideal")


def test_empty_run_renders(tmp_path):
    b = RunBuilder(tmp_path / "empty.duckdb")
    b.write()
    with open_store(b.path) as con:
        summary = run_summary(con, resolve_run(con, None))
    assert "0 requests" in _render(render_summary, summary)
