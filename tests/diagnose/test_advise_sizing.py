"""`advise` end to end on a small synth workload (issues 34, 40): a size from the one-pass curve's
knee confirmed by one replay, and a proposal the replay did not bear out.

The workload: `tierdiag synth --kind system-prompt` (200 requests at 0.5/s) on pools too small
for its shared prompts (8,192 tokens of device and host). Its diagnosis proposes a host pool at
the host size curve's knee (diagnose/run/size_curves.py: the smallest pool adding 90 % of what an
unbounded one would add) and eviction_policy lfu (the hot re-references' live volume fits the
pools). `advise --budget 6` replays each once.

1. The size: the capacity item sets host_tokens to the knee of `summary --json`'s host curve, its
   one replay confirms it, and its `sizing` puts the curve's prediction (at the knee and at the
   run's own size) beside what the replay's and the run's rows found; no other replay sized it.
   summary, explain, --json and the report print it.
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


# --------------------------------------------------------------------------- 1. the size, from the curve, one replay


def _found_share(db: Path, run_id: str) -> float:
    """Device + host hits over the finished requests' input, from the run's rows."""
    with open_store(db) as con:
        found, total = con.execute(
            "SELECT sum(device_hit_tokens + host_hit_tokens), sum(input_tokens) FROM requests WHERE run_id = ? "
            "AND coalesce(status, 'finished') = 'finished' AND ttft_ns IS NOT NULL", [run_id]).fetchone()
    return found / total


def test_the_host_pool_is_the_curves_knee_confirmed_by_one_replay(advised):
    db, j = advised
    curves = _json("summary", "--db", str(db))["size_curves"]
    host = curves["tiers"]["host"]
    knee = -(-(host["knee_tokens"] + curves["slack_tokens"]) // PAGE) * PAGE  # the knee + slack, whole pages
    assert 8192 < knee < 32768  # not the old power of two above the p90 reuse distance
    cap = _item(j["advice"], "capacity")
    assert cap["status"] == "confirmed" and cap["changes"] == {"host_tokens": knee}
    s = cap["sizing"]
    at = {p["size_tokens"]: p["reused_share"] for p in host["points"]}
    assert (s["option"], s["tier"], s["value"], s["knee_tokens"], s["slack_tokens"], s["curve_size_tokens"]) == (
        "host_tokens", "host", knee, host["knee_tokens"], curves["slack_tokens"], knee)
    assert s["predicted_share"] == pytest.approx(at[knee])
    assert s["run_size_tokens"] == 8192 and s["run_predicted_share"] == pytest.approx(at[8192])
    assert s["run_found_share"] == pytest.approx(_found_share(db, j["baseline"]["run_id"]))
    # What the one replay found, from its rows; the disagreement flag is the tolerance's.
    assert s["replay_run_id"] == cap["verified"]["run_id"]
    assert s["replayed_share"] == pytest.approx(_found_share(db, cap["verified"]["run_id"]))
    assert s["disagrees"] == (abs(s["replayed_share"] - s["predicted_share"]) > s["tolerance"])
    # One replay an item: no size search anywhere, every replay a candidate, within the budget.
    with open_store(db) as con:
        sweeps = {r[0] for r in con.execute("SELECT DISTINCT sweep_id FROM runs WHERE sweep_id IS NOT NULL").fetchall()}
    assert sweeps == {"advise-" + j["baseline"]["run_id"]}
    assert len(j["candidates"]) <= BUDGET and [c["changes"] for c in j["candidates"]].count({"host_tokens": knee}) == 1


def test_every_view_prints_the_prediction_beside_the_replay(advised, tmp_path):
    db, j = advised
    s = _item(j["advice"], "capacity")["sizing"]
    from tierdiag.diagnose.advice.types import _toml  # TOML a user can paste: 8192, 30_016

    words = (f"one-pass size curve (LRU): at host_tokens = {_toml(s['value'])} (the knee {_toml(s['knee_tokens'])} + "
             f"the median request's prefix {_toml(s['slack_tokens'])}) device and host find")
    found = f"the replay found {s['replayed_share'] * 100:,.0f} %"
    summary = _json("summary", "--db", str(db))["diagnosis"]
    assert _item(summary["advice"], "capacity")["sizing"] == s
    for text in (_flat(_invoke("summary", "--db", str(db))), _flat(_invoke("explain", "sys4-q1", "--db", str(db)))):
        assert words in text and found in text
        assert ("they disagree by" in text) == s["disagrees"]
    explain = _json("explain", "sys4-q1", "--db", str(db))
    assert _item(explain["advice"], "capacity")["sizing"] == s
    html = tmp_path / "report.html"
    _invoke("report", "--db", str(db), "--output", str(html))
    import html as markup

    text = html.read_text()
    assert words in markup.unescape(text) and found in text and 'id="fig-size-curves"' in text


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
