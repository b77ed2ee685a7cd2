"""The page: self-contained, Plotly inlined once, data round-trips, written atomically."""

from __future__ import annotations

import base64
import errno
import json
import html
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fake_run import write_fake_run
from tierdiag.errors import OutputError
from tierdiag.report import series as rd
from tierdiag.report import html as rh

_DTYPES = {"f8": np.float64, "f4": np.float32, "i4": np.int32, "i2": np.int16, "i1": np.int8, "u1": np.uint8}
_FIGURE_JSON = re.compile(r'<script type="application/json" data-plot="([^"]+)">(.*?)</script>', re.S)


def _decode(v):
    """Inverse of the typed-array encoding, recursively (what Plotly.js does in the browser)."""
    if isinstance(v, dict) and set(v) >= {"dtype", "bdata"}:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=_DTYPES[v["dtype"]])
        return a.reshape([int(n) for n in v["shape"].split(",")]) if "shape" in v else a
    if isinstance(v, dict):
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    write_fake_run(tmp / "run.duckdb", 300, 5)
    result = rh.build_report(tmp / "run.duckdb", None, tmp / "out" / "r.html")
    return result, result.path.read_text(encoding="utf-8")


def test_plotly_js_inlined_exactly_once_and_nothing_fetched(built):
    result, page = built
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1
    assert "<script src" not in page.lower()
    assert not re.search(r"""<(?:link|img|iframe)[^>]+(?:src|href)\s*=\s*["']?(?:https?:)?//""", page, re.I)
    assert result.bytes == len(page.encode("utf-8"))


def test_every_figure_has_a_div_and_its_data(built):
    result, page = built
    blocks = _FIGURE_JSON.findall(page)
    assert len(blocks) == result.figures >= 4
    for div_id, text in blocks:
        assert f'id="{div_id}"' in page
        fig = json.loads(text)
        assert fig["data"] and "layout" in fig


def test_figure_data_round_trips_through_typed_arrays(built, tmp_path_factory):
    _, page = built
    blocks = dict(_FIGURE_JSON.findall(page))
    scatter = _decode(json.loads(blocks["fig-ttft-vs-host-share"]))
    y = np.concatenate([t["y"] for t in scatter["data"]])
    db = tmp_path_factory.getbasetemp() / "html0" / "run.duckdb"
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        pts = rd.load_points(con, resolve_run(con, None))
    assert np.allclose(np.sort(y), np.sort(pts.ttft_ns / 1e6))


def test_sections_headline_and_how_to_read(built):
    _, page = built
    for section in ("headline", "time", "requests", "distributions", "decomposition", "slowest"):
        assert f'<section id="{section}">' in page
    # One "how to read this" per section and per figure.
    assert page.count('<p class="how">') >= 6 + 8
    assert "Slowest cached requests" in page and 'class="verdict"' in page


@given(hnp.arrays(st.sampled_from([np.int64, np.int32, np.uint8, np.float64, np.float32, np.bool_]),
                  hnp.array_shapes(min_dims=1, max_dims=2, max_side=20),
                  elements={"allow_nan": False, "allow_infinity": False}))
def test_typed_array_round_trip(a):
    decoded = _decode(json.loads(rh.encode_figure({"x": a}))["x"])
    assert np.array_equal(np.asarray(decoded, dtype=np.float64).reshape(a.shape), a.astype(np.float64))


def test_script_closing_tags_in_strings_are_escaped():
    evil = "</script><script>alert(1)</script>"
    text = rh.encode_figure({"data": [{"text": [evil], "x": np.array(["a", evil], dtype=object)}]})
    assert "</script" not in text.lower()
    fig = json.loads(text)
    assert fig["data"][0]["text"] == [evil] and fig["data"][0]["x"] == ["a", evil]


def test_hostile_request_ids_are_escaped_in_the_page(tmp_path: Path):
    ids = [f"<b>r{i}</b></script>" for i in range(120)]
    write_fake_run(tmp_path / "run.duckdb", 120, 9, ids=ids)
    page = rh.build_report(tmp_path / "run.duckdb", None, tmp_path / "r.html").path.read_text()
    # Table cells and hover text escape; JSON blocks escape "</" so no script ends early.
    assert not re.search(r"<b>r\d", page)
    assert "&lt;b&gt;r" in page


def test_sampled_run_says_so(tmp_path: Path, monkeypatch):
    write_fake_run(tmp_path / "run.duckdb", 300, 4)
    monkeypatch.setattr(rd, "MAX_SCATTER_POINTS", 100)
    monkeypatch.setattr(rd, "SLOWEST_ALWAYS_KEPT", 20)
    result = rh.build_report(tmp_path / "run.duckdb", None, tmp_path / "r.html")
    assert result.sampled
    page = result.path.read_text()
    assert "sampled: 100 of 298 requests" in page


# --- atomic write -----------------------------------------------------------------------------

def test_write_atomic_creates_folders_and_respects_umask(tmp_path: Path):
    path = tmp_path / "a" / "b" / "r.html"
    old = os.umask(0o027)
    try:
        n = rh.write_atomic(path, "héllo")
    finally:
        os.umask(old)
    assert path.read_text(encoding="utf-8") == "héllo" and n == len("héllo".encode())
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.html"]


@pytest.mark.parametrize("fail_at", ["write", "replace"])
def test_failed_write_keeps_the_old_report_and_leaves_no_temp(tmp_path: Path, monkeypatch, fail_at):
    path = tmp_path / "r.html"
    path.write_text("old report")
    disk_full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def boom(*_a, **_k):
        raise disk_full

    if fail_at == "write":
        monkeypatch.setattr(rh.os, "fsync", boom)
    else:
        monkeypatch.setattr(rh.os, "replace", boom)
    with pytest.raises(OutputError) as info:
        rh.write_atomic(path, "new report")
    assert "No space left" in info.value.one_line() and "\n" not in info.value.one_line()
    assert path.read_text() == "old report"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_unwritable_paths_are_one_line_output_errors(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file" / "r.html", tmp_path / "file" / "deeper" / "r.html", tmp_path):
        with pytest.raises(OutputError) as info:
            rh.write_atomic(bad, "x")
        assert "\n" not in info.value.one_line()
    assert (tmp_path / "file").read_text() == "x"


def test_default_output_is_under_reports_and_filesystem_safe(tmp_path: Path):
    w = write_fake_run(tmp_path / "run.duckdb", 20, 1, name="my run/../x")
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(tmp_path / "run.duckdb") as con:
        path = rh.default_output(resolve_run(con, None))
    assert path.parent == Path("reports")
    assert path.name == f"my_run_.._x-{w.run_id}.html"


# --- run verdict, slowest groups, config panel ---------------------------------------------

def _section(page: str, key: str) -> str:
    start = page.index(f'<section id="{key}">')
    return page[start:page.index("</section>", start)]


def test_verdict_names_summary_dominant_cause_first(built, tmp_path_factory):
    _, page = built
    db = tmp_path_factory.getbasetemp() / "html0" / "run.duckdb"
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        data = rd.load_report_data(con, resolve_run(con, None))
    v = data.verdict
    head = _section(page, "headline")
    # The verdict is the first thing in the report, before the stat cards.
    assert head.index('id="verdict"') < head.index('class="stats"')
    lead = re.search(r'<p class="lead">(.*?)</p>', head, re.S).group(1)
    assert f'<span class="cause {v.dominant}">{v.dominant}</span> dominated excess TTFT' in lead
    from tierdiag.units import fmt_pct

    assert f"<b>{fmt_pct(v.share)}</b>" in lead
    assert head.count('class="cause-row"') == len(v.ranked)
    # The real diagnosis (RunSummary.diagnosis, issue 12) fills the verdict's slot, and only it:
    # there is no second diagnosis section.
    assert v.finding and html.escape(v.finding, quote=True) in head
    advice = re.search(r'<div class="advice"><h4>Advice</h4><ol>(.*?)</ol></div>', head, re.S).group(1)
    assert advice.count("<li>") == len(v.advice) > 0
    assert page.count('class="advice"') == 1 and "Diagnosis and advice" not in page


def test_verdict_renders_diagnosis_advice_when_summary_has_it(tmp_path: Path, monkeypatch):
    write_fake_run(tmp_path / "run.duckdb", 120, 2)
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Advice:
        option: str
        value: str
        reason: str
        verification: str

    from tierdiag.diagnose.run import summary as ds

    real = ds.run_summary

    def with_diagnosis(con, run, **kw):  # kw: the report hands its run context on (ctx=)
        sm = real(con, run, **kw)
        object.__setattr__(sm, "diagnosis", {"advice": [Advice("--device-tokens", "196608", "<b>evictions</b>",
                                                               "replay again and compare")]})
        return sm

    monkeypatch.setattr(rd, "run_summary", with_diagnosis)
    page = rh.build_report(tmp_path / "run.duckdb", None, tmp_path / "r.html").path.read_text()
    advice = _section(page, "headline")
    assert "<h4>Advice</h4>" in advice and "<code>--device-tokens = 196608</code>" in advice
    assert "&lt;b&gt;evictions&lt;/b&gt;" in advice and "check: replay again and compare" in advice


def test_slowest_table_has_one_row_per_group_with_the_verdict_first(built, tmp_path_factory):
    _, page = built
    db = tmp_path_factory.getbasetemp() / "html0" / "run.duckdb"
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        data = rd.load_report_data(con, resolve_run(con, None))
    table = _section(page, "slowest")
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S)
    assert len(rows) == len(data.slow_groups) >= 2
    for row, g in zip(rows, data.slow_groups):
        first_cell = re.match(r'<td class="(\w+)"', row).group(1)
        assert first_cell == "verdict" and f'<span class="cause {g.cause}">' in row
        assert f"<b>{len(g.requests):,}</b>" in row and g.requests[0].req_id in row


def test_config_panel_reads_as_sizes_and_rates(built):
    _, page = built
    panel = page[page.index('<details class="card cfg">'):page.index("</details>", page.index('<details class="card cfg">'))]
    # 200,000 tokens at the fake run's 128 KiB per token.
    assert "200,000 tokens (24.4 GiB)" in panel and "800,000 tokens (97.7 GiB)" in panel
    assert "50.0 GB/s" in panel
    assert not re.search(r"\d{7,}\.0\b", panel)  # never "50000000000.0"
    assert "<dd>write_through</dd>" in panel
