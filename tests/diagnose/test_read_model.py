"""The read model of a run (diagnose/read/): typed request rows, the run parsed once, one view
per run kind, and the named queries, against the store's own rows."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.diagnose.read.rows import fetch_dicts
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read.kind import OBSERVED, REPLAY, view_of
from tierdiag.diagnose.read.requests import COLUMNS, RequestRow
from tierdiag.diagnose.read.run import Run, parse
from tierdiag.errors import NotFoundError
from tierdiag.store.reader import RunInfo, RunKind, open_store, resolve_run, run_kind
from tierdiag.store.schema import TABLES

_PY = {"VARCHAR": str, "BIGINT": int, "INTEGER": int, "DOUBLE": float}

# Values a hand-made or damaged row may hold: NULLs, huge and negative numbers, odd strings.
hostile_values = st.one_of(st.none(), st.integers(min_value=-2**63, max_value=2**63 - 1),
                           st.floats(allow_nan=True), st.text(max_size=20), st.booleans())


def test_request_row_is_the_requests_table():
    """Every column of `requests`, in the table's order, with its SQL type's Python type."""
    assert COLUMNS == tuple(TABLES["requests"])
    for f in fields(RequestRow):
        assert f.type == f"{_PY[TABLES['requests'][f.name]].__name__} | None", f.name


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(COLUMNS), hostile_values),
       st.dictionaries(st.text(max_size=12).filter(lambda k: k not in COLUMNS), hostile_values, max_size=3))
def test_of_takes_any_dict_of_columns(columns, extra):
    """A dict's columns become attributes, missing ones None, keys that are no column left out;
    a RequestRow is taken as it is."""
    row = RequestRow.of({**columns, **extra})
    for name in COLUMNS:
        value = getattr(row, name)
        assert value is columns[name] if name in columns else value is None
    assert not any(hasattr(row, k) for k in extra if k.isidentifier() and k not in dir(RequestRow))
    assert RequestRow.of(row) is row
    assert RequestRow.of(row.to_dict()) == row


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.sampled_from(["", "replay", "observed", "Replay", "twin", " observed"]),
                 st.text(max_size=16)))
def test_run_kind_of_a_stored_kind(stored):
    kind = run_kind(stored)
    if not stored:
        assert kind is RunKind.REPLAY  # recorded before kinds
    elif stored in ("replay", "observed"):
        assert kind is RunKind(stored) and kind == stored
    else:
        assert type(kind) is str and kind == stored  # a newer tierdiag's kind: kept, never guessed
    assert json.dumps(kind) == json.dumps(str(kind))


def _info(**kw) -> RunInfo:
    base = dict(run_id="20261201-120000-abcdef", name="r", created_at="2026-12-01 12:00:00", status="complete",
                tierdiag_version="0", trace_path="t.jsonl", trace_sha256="0" * 64, config={}, hardware={},
                data_plane={}, timing="modelled", num_requests=1, wall_s=None, command_line="")
    return RunInfo(**{**base, **kw})


dp_values = st.one_of(st.none(), st.integers(min_value=-10, max_value=10**6), st.booleans(), st.floats(),
                      st.text(max_size=6), st.lists(st.integers(), max_size=2))


@settings(max_examples=60, deadline=None)
@given(dp=dp_values, rules=st.one_of(st.none(), st.just(""), st.sampled_from(["0.5.9", "0.5.23"]), st.text(max_size=8)),
       back=st.one_of(st.none(), st.just(""), st.text(max_size=12), st.integers()),
       kind=st.one_of(st.none(), st.sampled_from(["replay", "observed", "later"])))
def test_parse_reads_the_config_once_whatever_it_holds(dp, rules, back, kind):
    config = {"dp": dp, "sglang_rules": rules, "sglang_switched_back": back}
    info = _info(config=config, kind=run_kind(kind))
    run = parse(info)
    assert isinstance(run, Run) and parse(run) is run
    assert run.to_json() == info.to_json()  # the runs view is the runs row's, extras aside
    counts = isinstance(dp, int) and not isinstance(dp, bool) and dp >= 1
    assert run.ranks == (dp if counts else 1)
    engine = kind in (None, "replay")
    assert run.engine_parts is engine and view_of(run).engine_parts is engine
    assert run.rules == ((str(rules) if rules else "0.5.9") if engine else None)
    assert run.rules_recorded == (str(rules) if rules else None)
    assert run.switched_back == (back if isinstance(back, str) and back else None)


def test_view_of_a_run_without_a_kind_is_a_replay_and_an_unknown_kind_a_servers():
    assert view_of(object()) is REPLAY
    assert view_of(_info(kind="observed")) is OBSERVED
    assert view_of(_info(kind="later")) is OBSERVED


@pytest.fixture
def store(planted):
    con = open_store(planted.path)
    yield con, resolve_run(con, None)
    con.close()


def test_request_is_the_whole_row(store):
    con, run = store
    for want in fetch_dicts(con, "SELECT * FROM requests WHERE run_id = ?", [run.run_id]):
        got = queries.request(con, run, want["req_id"])
        assert isinstance(got, RequestRow) and got.to_dict() == want


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=24))
def test_request_not_there_names_it(store, req_id):
    con, run = store
    if req_id in {r[0] for r in con.execute("SELECT req_id FROM requests").fetchall()}:
        return
    with pytest.raises(NotFoundError) as err:
        queries.request(con, run, req_id)
    assert repr(req_id) in str(err.value) and "\n" not in str(err.value)


def test_slowest_ranks_by_excess_with_the_sql_cause(store):
    con, run = store
    rows = queries.slowest(con, run, top=100)
    from tierdiag.diagnose.request.causes import TtftParts

    excess = [TtftParts.from_row(r).excess_ns for r, _ in rows]
    assert excess == sorted(excess, reverse=True) and all(e > 0 for e in excess)
    for r, cause in rows:
        assert cause == TtftParts.from_row(queries.request(con, run, r.req_id)).primary_cause(), r.req_id


def test_span_starts_at_the_first_arrival(store):
    con, run = store
    assert queries.span_ns(con, run)[0] == con.execute(
        "SELECT min(arrival_ns) FROM requests WHERE run_id = ?", [run.run_id]).fetchone()[0]


def test_slow_gives_routing_its_part_of_the_excess(tmp_path):
    """A request whose primary cause is routing: `slow` names routing and gives it the part of
    the excess routing owns (causes.TtftParts), as `explain` does. It gave 0 ms while
    `queries.slowest` read no routing columns (found on a --dp 2 replay of the conversation
    trace: every `slow --cause routing` row said cause 0 ms)."""
    from tests.diagnose.conftest import CONFIG, MS, US, RunBuilder
    from tierdiag.diagnose.request.causes import TtftParts
    from tierdiag.diagnose.request.explain import explain_request
    from tierdiag.diagnose.request.slow import slow_requests

    b = RunBuilder(tmp_path / "dp.duckdb", config={**CONFIG, "dp": 2})
    row = b.request("lost", arrival_ns=0, input_tokens=2048, recomputed=1024, recompute_ns=8 * MS, compute_ns=900 * US,
                    ideal_ttft_ns=900 * US)
    # Rank 0 held 1,024 tokens of its prefix at arrival; the router sent it to rank 1, which held none.
    row.update(dp_rank=1, best_rank=0, best_rank_device_tokens=1024, best_rank_host_tokens=0,
               arrival_device_tokens=0, arrival_host_tokens=0)
    b.request("other", arrival_ns=50 * MS, input_tokens=512, compute_ns=200 * US)["dp_rank"] = 0
    b.write()
    con = open_store(b.path)
    run = resolve_run(con, None)
    parts = TtftParts.from_row(queries.request(con, run, "lost"))
    assert parts.primary_cause() == "routing" and parts.routing_ns > 0
    (slow,) = slow_requests(con, run, top=1, cause="routing")
    assert slow.req_id == "lost" and slow.primary_cause == "routing"
    assert slow.cause_ns == min(parts.excess_parts_ns()["routing"], parts.excess_ns) > 0
    assert explain_request(con, run, "lost").primary_cause == "routing"
    con.close()
