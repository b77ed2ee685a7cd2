"""Every view's clock starts at the run's first arrival: a trace sliced from a longer one (its
first request at 1,000,000 ms here) shows times since then, never since the engine's zero."""

from __future__ import annotations

import json
import re

from tests.cli.cli_helpers import FIRST_ARRIVAL_MS, REPLAY_ARGS, cli_here, write_late_trace

LATE_NS = FIRST_ARRIVAL_MS * 1_000_000


def test_replay_progress_counts_from_the_first_arrival(tmp_path):
    from tierdiag.config.engine import load_config
    from tierdiag.app.replay import replay

    trace = write_late_trace(tmp_path / "late.jsonl")
    opts = dict(zip(REPLAY_ARGS[::2], REPLAY_ARGS[1::2]))
    cfg = load_config(None, {"model": opts["--model"], "gpu": opts["--gpu"], "time_scale": 2.0,
                             "device_tokens": opts["--device-tokens"], "host_tokens": opts["--host-tokens"]})
    seen = []
    summary = replay(trace, cfg, db=None, run_name=None, probes=False, skip_bad=False,
                     progress=lambda done, t_ns, stats: seen.append((done, t_ns)))
    assert seen, "the progress callback was never called"
    # 256 requests arrive 300 ms apart (600 ms at --time-scale 2): the clock is near 153 s, not
    # near 2,000 s (the scaled lead-in), and never past the run's span.
    done, t_ns = seen[0]
    assert done == 256
    assert 255 * 600e6 <= t_ns <= summary.virtual_s * 1e9


def test_explain_times_are_since_the_first_arrival(late_run):
    res = cli_here("slow", "--db", late_run, "--class", "tiered_hit", "--ids", "--top", "1")
    assert res.returncode == 0, res.stderr
    req = res.stdout.split()[0]
    res = cli_here("explain", req, "--db", late_run, "--json")
    assert res.returncode == 0, res.stderr
    e = json.loads(res.stdout)
    assert e["run_start_ms"] == FIRST_ARRIVAL_MS
    span_ms = 300 * 300  # the arrivals' own span, well under the lead-in
    assert 0 <= e["arrival_ms"] <= span_ms
    transfers = e["steps"][2]["evidence"]["transfers"]
    events = e["steps"][3]["evidence"]["events"]
    assert transfers and events
    assert all(0 <= t["t_start_ms"] <= span_ms for t in transfers)
    assert all(0 <= ev["t_ms"] <= span_ms for ev in events)
    # The terminal view shows the same times (seconds since the first arrival).
    # (The lead-in alone is 16.7 min: no time in this run's view reaches a minute.)
    text = cli_here("explain", req, "--db", late_run, columns=120).stdout
    assert "transfers" in text and "events" in text
    assert re.search(r"\d min\b", text) is None, text


def test_slow_json_arrivals_are_since_the_first_arrival(late_run):
    res = cli_here("slow", "--db", late_run, "--json", "--top", "300")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["run_start_ms"] == FIRST_ARRIVAL_MS
    arrivals = sorted(r["arrival_ms"] for r in out["requests"])
    assert 0 <= arrivals[0] and arrivals[-1] <= 300 * 300
