"""`advise` end to end on a small synth workload (issue 34): the smallest sufficient size, and a
proposal the replay did not bear out.

The workload: `tierdiag synth --kind system-prompt` (200 requests at 0.5/s) on pools too small
for its shared prompts (8,192 tokens of device and host). Its diagnosis proposes a host pool
(capacity: 32,768 tokens keep 90 % of the re-referenced deleted tokens under LRU) and
eviction_policy lfu (the hot re-references' live volume fits the pools). `advise --budget 6`
replays both, then spends what the budget has left bisecting the confirmed host pool between
the run's 8,192 and 32,768 tokens, in whole pages, for the smallest whose TTFT p50 keeps at
least 90 % of 32,768's gain.

1. Smallest sufficient size: every point of the gain curve (value, TTFT p50, share of the gain)
   is recomputed from its run's rows (nearest rank); the smallest sufficient value is the
   smallest point at >= 90 %, the point below it fell short, and the two are within one page
   unless the budget ran out. summary, explain, --json and the report HTML print it.
2. A proposal the replay refutes or leaves flat: lfu's prediction counts the hot re-references
   the removal rows show, but not the hits on content never removed that competes with them
   under LFU; the replay keeps the recompute share and TTFT where they were (no_effect). It is
   listed under "tried, not advised" with its numbers in summary, explain, their --json and the
   report HTML, and never as advice nor "verified".
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tierdiag.store.reader import open_store

from .test_run_claims import RECOMPUTE

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke as _invoke, invoke_json as _json  # noqa: E402

BUDGET = 6
PAGE = 64


def _flat(text: str) -> str:
    """Terminal text with its panel borders and wrapping undone."""
    return " ".join(text.replace("│", " ").split())


@pytest.fixture(scope="module")
def advised(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("advise_sizing")
    trace, db = folder / "system_prompt.jsonl", folder / "run.duckdb"
    _invoke("synth", str(trace), "--kind", "system-prompt", "--requests", "200", "--rate", "0.5")
    _invoke("replay", str(trace), "--db", str(db), *RECOMPUTE)
    return db, _json("advise", "--db", str(db), "--budget", str(BUDGET), "--jobs", "1")


def _p50_ms(db: Path, run_id: str) -> float:
    """Nearest rank over the run's finished TTFTs (docs/contract.md: every percentile)."""
    with open_store(db) as con:
        ttfts = sorted(t for (t,) in con.execute(
            "SELECT ttft_ns FROM requests WHERE run_id = ? AND coalesce(status, 'finished') = 'finished' "
            "AND ttft_ns IS NOT NULL", [run_id]).fetchall())
    return ttfts[max(math.ceil(0.5 * len(ttfts)) - 1, 0)] / 1e6


def _item(items: list[dict], kind: str) -> dict:
    found = [a for a in items if a["kind"] == kind]
    assert len(found) == 1, [a["kind"] for a in items]
    return found[0]


# --------------------------------------------------------------------------- 1. the smallest sufficient size


def test_the_gain_curve_is_the_runs_and_its_smallest_sufficient_value(advised):
    db, j = advised
    cap = _item(j["advice"], "capacity")
    assert cap["status"] == "confirmed" and cap["changes"] == {"host_tokens": 32768}
    s = cap["sizing"]
    assert s is not None and s["option"] == "host_tokens" and s["largest"] == 32768
    points = s["points"]
    values = [p["value"] for p in points]
    assert values == sorted(values) and values[0] == 8192 and values[-1] == 32768
    assert all(v % PAGE == 0 for v in values) and len(values) > 2  # sizes between were replayed
    base_ms, top_ms = points[0]["ttft_p50_ms"], points[-1]["ttft_p50_ms"]
    assert base_ms == pytest.approx(_p50_ms(db, j["baseline"]["run_id"]))
    assert top_ms == pytest.approx(_p50_ms(db, cap["verified"]["run_id"]))
    for p in points:
        assert p["ttft_p50_ms"] == pytest.approx(_p50_ms(db, p["run_id"]))
        assert p["gain_share"] == pytest.approx((base_ms - p["ttft_p50_ms"]) / (base_ms - top_ms))
    enough = [p["value"] for p in points if p["gain_share"] >= 0.9]
    assert s["smallest_sufficient"] == min(enough) < 32768
    below = [p for p in points if p["value"] < s["smallest_sufficient"]]
    assert s["short_of"] == below[-1]["value"] and below[-1]["gain_share"] < 0.9
    # Every replay within the budget: the two proposals, then the size search.
    with open_store(db) as con:
        size_runs = con.execute("SELECT count(*) FROM runs WHERE sweep_id = ?",
                                ["advise-size-" + j["baseline"]["run_id"]]).fetchone()[0]
    assert len(j["candidates"]) + size_runs <= BUDGET and size_runs == len(points) - 2
    # Bisection converged to a page, or spent the budget trying.
    assert s["smallest_sufficient"] - s["short_of"] <= PAGE or len(j["candidates"]) + size_runs == BUDGET


def test_every_view_prints_the_smallest_sufficient_value(advised, tmp_path):
    db, j = advised
    s = _item(j["advice"], "capacity")["sizing"]
    words = f"smallest sufficient host_tokens = {s['smallest_sufficient']:_}"
    curve = ", ".join(f"{p['value']:_}" if p["value"] >= 10_000 else f"{p['value']}" for p in s["points"])
    summary = _json("summary", "--db", str(db))["diagnosis"]
    assert _item(summary["advice"], "capacity")["sizing"] == s
    for text in (_flat(_invoke("summary", "--db", str(db))), _flat(_invoke("explain", "sys4-q1", "--db", str(db)))):
        assert words in text
        shown = re.findall(r"([\d_]+): [\d.,]+ (?:µs|ms|s), [\d.<> ]+ %", text[text.index("gain curve"):])
        assert ", ".join(shown) == curve, (shown, curve)
    explain = _json("explain", "sys4-q1", "--db", str(db))
    assert _item(explain["advice"], "capacity")["sizing"] == s
    html = tmp_path / "report.html"
    _invoke("report", "--db", str(db), "--output", str(html))
    assert words in html.read_text()


# --------------------------------------------------------------------------- 2. tried, not advised


def test_a_proposal_the_replay_left_flat_is_tried_not_advised_everywhere(advised, tmp_path):
    db, j = advised
    lfu = _item(j["tried_not_advised"], "eviction_policy")
    assert lfu["status"] in ("no_effect", "refuted") and lfu["prediction"]  # proposed for a predicted gain
    v = lfu["verified"]
    assert v["ttft_p50_ms_before"] == pytest.approx(_p50_ms(db, j["baseline"]["run_id"]))
    assert v["ttft_p50_ms_after"] == pytest.approx(_p50_ms(db, v["run_id"]))
    assert v["ttft_p50_ms_after"] > 0.95 * v["ttft_p50_ms_before"]  # not the 5 % a change must win by
    assert not [a for a in j["advice"] if a["kind"] == "eviction_policy"]
    run = v["run_id"]
    for view in (_json("summary", "--db", str(db))["diagnosis"], _json("explain", "sys4-q1", "--db", str(db))):
        assert [a["kind"] for a in view["tried_not_advised"]] == ["eviction_policy"]
        seen = _item(view["tried_not_advised"], "eviction_policy")["verified"]
        assert (seen["run_id"], seen["ttft_p50_ms_before"], seen["ttft_p50_ms_after"]) == (
            run, v["ttft_p50_ms_before"], v["ttft_p50_ms_after"])
        assert "eviction_policy" not in [a["kind"] for a in view["advice"]]
    before, after = (f"{x:,.1f} ms" for x in (v["ttft_p50_ms_before"], v["ttft_p50_ms_after"]))
    html = tmp_path / "report.html"
    _invoke("report", "--db", str(db), "--output", str(html))
    texts = {"summary": _flat(_invoke("summary", "--db", str(db))),
             "explain": _flat(_invoke("explain", "sys4-q1", "--db", str(db))),
             "report": html.read_text().replace("&quot;", '"')}
    for name, text in texts.items():
        tried = text[text.lower().index("tried, not advised"):]
        advice = text[:text.lower().index("tried, not advised")]
        # Listed with its numbers: its run, TTFT p50 before -> after ...
        assert f'eviction_policy = "lfu" (eviction_policy)' in tried and run in tried, name
        assert f"TTFT p50 {before} → {after}" in tried, name
        # ... and never as advice, nor "verified".
        assert 'eviction_policy = "lfu":' not in advice and "set eviction_policy" not in advice, name
        assert not re.search(r"verified[^.]*" + re.escape(run), text), name
