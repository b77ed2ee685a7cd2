"""benchmarks/targets41.py's sessions (issue 41): --sessions/--gap/--repeats refuse hostile values
in one line with exit 2; each row's verdict is made from the median over sessions of each
session's ratio, min and max beside it; a session failing midway names the row (and the replay's
mode) that failed and keeps the sessions measured before it in the JSON. No replay runs here:
the launcher and the floor are faked."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
# This folder is the package `scale` in pytest's rootdir mode; targets41 imports benchmarks/scale.py
# by that name: import it with the package out of the way, then put the package back.
_package = sys.modules.pop("scale", None)
import targets41  # noqa: E402
import targets41_sessions as ts  # noqa: E402

if _package is not None:
    sys.modules["scale"] = _package

FAST = settings(deadline=None, max_examples=150)


def _parse(*argv: str):
    """parse_args's namespace, or (exit code, stderr) where it refuses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return targets41.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code, err.getvalue()


def _refused(out, option: str) -> None:
    assert isinstance(out, tuple), out
    code, err = out
    assert code == 2
    assert err.count("\n") == 1 and err.endswith("\n"), err  # one line, no usage block
    assert option in err


@FAST
@given(text=st.one_of(st.text(max_size=12), st.integers(-10**30, 10**30).map(str),
                      st.floats(allow_nan=True, allow_infinity=True).map(repr)))
@pytest.mark.parametrize("option,most", [("--sessions", ts.MAX_SESSIONS), ("--repeats", ts.MAX_REPEATS)])
def test_counts_take_whole_numbers_in_range_and_refuse_the_rest_in_one_line(option, most, text):
    out = _parse(f"{option}={text}")
    s = text.strip()
    valid = s.isascii() and s.isdigit() and len(s) <= 6 and 1 <= int(s) <= most
    if valid:
        assert getattr(out, option[2:]) == int(s)
    else:
        _refused(out, option)


@pytest.mark.parametrize("text", ["0", "-1", "-3", "21", "1000000000000", "1.5", "2e1", "nan", "inf", "", " ", "three",
                                  "\u0663", "1_0", "0x3"])
def test_sessions_hostile_values(text):
    _refused(_parse(f"--sessions={text}"), "--sessions")


@FAST
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20)),
       text=st.text(max_size=10))
def test_gap_takes_finite_seconds_in_range(value, text):
    out = _parse(f"--gap={value!r}")
    if math.isfinite(value) and 0 <= value <= ts.MAX_GAP_S:
        assert out.gap == float(value)
    else:
        _refused(out, "--gap")
    out = _parse(f"--gap={text}")
    try:
        parsed = float(text)
    except ValueError:
        parsed = math.nan
    if math.isfinite(parsed) and 0 <= parsed <= ts.MAX_GAP_S:
        assert out.gap == parsed
    else:
        _refused(out, "--gap")


@pytest.mark.parametrize("text", ["-1", "-0.5", "nan", "NaN", "inf", "-inf", "1e300", "3600.5", "", "soon"])
def test_gap_hostile_values(text):
    _refused(_parse(f"--gap={text}"), "--gap")


def test_a_json_path_without_its_folder_is_refused_before_any_session(tmp_path):
    _refused(_parse("--json", str(tmp_path / "absent" / "t.json")), "--json")
    assert _parse("--json", str(tmp_path / "t.json")).json == tmp_path / "t.json"


def test_defaults_are_one_session():
    args = _parse()
    assert args.sessions == 1 and args.gap == ts.DEFAULT_GAP_S and args.repeats is None


# --- the median over sessions -------------------------------------------------------------------
ROWS = [("floor", "<=", 10.0, "x"), ("probe_overhead", "<=", 1.05, "overhead"), ("kernels", ">=", 0.6, "x"),
        ("1m", "<=", 100.0, "s")]
ratio = st.floats(0.01, 1000, allow_nan=False)


def _row(key: str, op: str, limit: float, unit: str, value: float | None, cpu: float | None) -> dict:
    if value is None:
        return {"key": key, "row": key, "measured": None, "target": f"{op} {limit}", "ok": None,
                "note": f"{key} failed: exited 1", "checks": [], "cpu": None}
    checks = [ts.check("ratio", value, op, limit, unit)]
    return {"key": key, "row": key, "measured": str(value), "target": f"{op} {limit}", "ok": ts.passes(checks),
            "note": "", "checks": checks, "cpu": None if cpu is None else ts.check("cpu", cpu, op, limit, unit)}


sessions_st = st.lists(st.lists(st.tuples(st.one_of(st.none(), ratio), st.one_of(st.none(), ratio)),
                                min_size=len(ROWS), max_size=len(ROWS)), min_size=1, max_size=7)


def _tables(sessions) -> list[list[dict]]:
    return [[_row(*spec, v, c) for spec, (v, c) in zip(ROWS, s)] for s in sessions]


@FAST
@given(sessions=sessions_st)
def test_each_row_is_judged_on_the_median_over_the_sessions_that_measured_it(sessions):
    combined = {r["key"]: r for r in ts.combine(_tables(sessions))}
    assert list(combined) == [k for k, *_ in ROWS]
    for j, (key, op, limit, unit) in enumerate(ROWS):
        r = combined[key]
        values = [s[j][0] for s in sessions if s[j][0] is not None]
        assert r["measured_in"] == [i + 1 for i, s in enumerate(sessions) if s[j][0] is not None]
        if not values:
            assert r["ok"] is None and r["measured"] is None and "failed" in r["note"]
            continue
        c = r["checks"][0]
        assert c["value"] == statistics.median(values) and (c["min"], c["max"]) == (min(values), max(values))
        assert c["min"] <= c["value"] <= c["max"]
        assert r["ok"] == ts.OPS[op](statistics.median(values), limit)
        assert ("of %d sessions" % len(sessions) in r["note"]) == (len(values) < len(sessions))
        cpus = [s[j][1] for s in sessions if s[j][0] is not None and s[j][1] is not None]
        assert (r["cpu"] is None) == (not cpus)
        if cpus:
            assert r["cpu"]["value"] == statistics.median(cpus) and r["cpu"]["ok"] == ts.OPS[op](statistics.median(cpus), limit)


@FAST
@given(sessions=sessions_st, seed=st.randoms())
def test_the_median_does_not_depend_on_the_sessions_order(sessions, seed):
    shuffled = list(sessions)
    seed.shuffle(shuffled)
    a, b = ts.combine(_tables(sessions)), ts.combine(_tables(shuffled))
    for ra, rb in zip(a, b):
        assert ra["ok"] == rb["ok"]
        assert [c["value"] for c in ra["checks"]] == [c["value"] for c in rb["checks"]]


@FAST
@given(values=st.lists(st.tuples(ratio, st.one_of(st.none(), ratio)), min_size=len(ROWS), max_size=len(ROWS)))
def test_one_session_is_its_own_verdict(values):
    table = _tables([values])[0]
    for r, c in zip(ts.combine([table]), table):
        assert r["ok"] == c["ok"] and r["checks"][0]["value"] == c["checks"][0]["value"] and r["note"] == ""


def test_a_row_shown_but_not_judged_keeps_the_last_sessions_value_and_no_verdict():
    quick = [{"key": "1m", "row": "1M requests (quick: 20,000)", "measured": f"{s:.1f} s", "target": "<= 100 s",
              "ok": None, "note": "quick: not the 1M run", "checks": [], "cpu": None} for s in (2.0, 3.0)]
    (r,) = ts.combine([[quick[0]], [quick[1]]])
    assert r["measured"] == "3.0 s" and r["ok"] is None and r["note"] == "quick: not the 1M run" and r["measured_in"] == []


def test_the_loop_sleeps_the_gap_between_sessions_and_keeps_them_when_one_raises():
    slept, written = [], []

    def measure(i: int) -> dict:
        if i == 2:
            raise KeyboardInterrupt
        return {"load_before": 0.5, "floor_wall_s": 0.2 + i}

    def table(res: dict) -> list[dict]:
        return [_row("floor", "<=", 10.0, "x", 5.0 + res["floor_wall_s"], None)]
    with pytest.raises(KeyboardInterrupt):
        ts.run_sessions(4, 7.5, measure, table, on_session=lambda doc: written.append(json.dumps(doc)),
                        sleep=slept.append, say=lambda msg: None)
    assert slept == [7.5, 7.5]
    last = json.loads(written[-1])
    assert [s["session"] for s in last["sessions"]] == [1, 2, 3] and "KeyboardInterrupt" in last["sessions"][2]["error"]
    assert last["table"][0]["measured_in"] == [1, 2] and last["table"][0]["checks"][0]["value"] == 5.7
    assert len(written) == 3


# --- a replay failing midway, end to end through main() with the launcher faked ------------------
@pytest.fixture
def fake_runs(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n')
    monkeypatch.setattr(targets41, "CONVERSATION", trace)
    monkeypatch.setattr(targets41, "prepare", lambda: None)
    session = itertools.count(1)
    state = {"session": 0, "fail": ("storage", 2)}
    collect = targets41.collect

    def counted(*args, **kwargs):
        state["session"] = next(session)
        return collect(*args, **kwargs)

    def lru(_trace):
        return {"wall_s": 0.1 * state["session"], "cpu_s": 0.1, "hits": 1, "blocks": 2, "loop_s": 0.01}

    def run(args, **_):
        mode = "storage" if "--storage-tokens" in args else "dp8" if "--dp" in args else (
            "no_probes" if "--no-probes" in args else "probes")
        if (mode, state["session"]) == state["fail"]:
            raise RuntimeError(f"tierdiag replay {args[1]} --db ... exited 1: boom")
        wall = {"probes": 1.2, "no_probes": 1.0, "storage": 1.5, "dp8": 1.4}[mode]
        return {"wall_s": wall, "cpu_s": 2 * wall, "rss_bytes": 1, "stdout": json.dumps({"num_requests": 1})}
    monkeypatch.setattr(targets41, "collect", counted)
    monkeypatch.setattr(targets41, "_lru", lru)
    monkeypatch.setattr(targets41.scale, "run", run)
    return state


def test_a_replay_failing_in_session_two_names_its_row_and_mode_and_keeps_the_others(tmp_path, fake_runs, capsys):
    out = tmp_path / "t.json"
    assert targets41.main(["--only", "replay", "--repeats", "1", "--sessions", "3", "--gap", "0", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [s["session"] for s in doc["sessions"]] == [1, 2, 3]
    why = doc["sessions"][1]["failed"]["replay"]
    assert "replay failed: mode storage, round 1 of 1" in why and "boom" in why
    assert doc["sessions"][0]["failed"] == {} and doc["sessions"][2]["failed"] == {}
    rows = {r["key"]: r for r in doc["table"]}
    assert rows["storage"]["measured_in"] == [1, 3] and "session 2: replay failed: mode storage" in rows["storage"]["note"]
    assert rows["storage"]["checks"][0]["value"] == pytest.approx(1.25) and rows["storage"]["ok"] is True
    assert rows["probe_overhead"]["ok"] is False and rows["probe_overhead"]["cpu"]["value"] == pytest.approx(1.2)
    assert [s["floor_wall_s"] for s in doc["sessions"]] == pytest.approx([0.1, 0.2, 0.3])
    assert all("table" in s and "load_at_start" in s for s in doc["sessions"])
    assert "failed" in capsys.readouterr().out


def test_one_session_keeps_todays_json(tmp_path, fake_runs):
    fake_runs["fail"] = None
    out = tmp_path / "t.json"
    assert targets41.main(["--only", "replay", "--repeats", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "sessions" not in doc and doc["replay"]["available"] and doc["floor_wall_s"] == pytest.approx(0.1)
    rows = {r["key"]: r for r in doc["table"]}
    assert rows["dp"]["ratio"] == pytest.approx(1.4 / 1.2) and rows["dp"]["ok"] is True
    assert rows["floor"]["cpu"]["value"] == pytest.approx(2.4 / 0.1)
    assert rows["sweep"]["ok"] is None and rows["sweep"]["note"] == "not selected"


@pytest.mark.parametrize("argv", [["--sessions=0"], ["--sessions=-2"], ["--sessions=2.5"], ["--gap=nan"], ["--gap=-1"],
                                  ["--gap=inf"]])
def test_run_py_refuses_the_same_values_before_it_runs_anything(argv):
    import run  # benchmarks/run.py: its targets section takes --sessions and --gap

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        run.main(argv)
    assert exc.value.code == 2 and f"argument {argv[0].split('=')[0]}: must be" in err.getvalue()


@FAST
@given(name=st.text(min_size=1, max_size=24).filter(lambda t: "\x00" not in t and "/" not in t))
def test_readers_db_refuses_a_path_that_is_no_store_in_one_line(tmp_path_factory, name):
    """--readers-db is checked before any row runs (it raised a traceback after the sweep and the
    kernels had been measured): a missing path, a folder, a file of text, a DuckDB file without a
    recorded run: one line, exit 2."""
    import duckdb

    folder = tmp_path_factory.mktemp("readers")
    missing = folder / name
    text = folder / "text.duckdb"
    text.write_text("not a store\n")
    empty = folder / "empty.duckdb"
    with duckdb.connect(str(empty)) as con:
        con.execute("CREATE TABLE runs (num_requests BIGINT, created_at TIMESTAMP)")
    for path in (missing, folder, text, empty):
        _refused(_parse("--readers-db", str(path)), "--readers-db")


def test_readers_db_takes_a_store_with_a_run(tmp_path):
    import duckdb

    db = tmp_path / "run.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE runs (num_requests BIGINT, created_at TIMESTAMP)")
        con.execute("INSERT INTO runs VALUES (3, now())")
    assert _parse("--readers-db", str(db)).readers_db == db
