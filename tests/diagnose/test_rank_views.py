"""The per-rank views of a data-parallel run (issue 31): summary's load, reuse and TTFT by rank
and the imbalance, explain's routing step (every sentence a claim checked against the row),
`slow --by rank`, the deployment line of `runs` and `summary`, and a one-rank run (and a v3
store) that reads exactly as before.

The ranked runs are one-rank replays with the v4 columns planted on them (tests/support/ranks.py),
so every number here is checked against the rows as stored, whatever engine wrote them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.support.cli import tierdiag_in_process
from tests.support.ranks import REUSE_POOLS, plant_ranks, reuse_lines, rows
from tests.support.traces import write_trace
from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.diagnose.dp.ranks import rank_summary, slow_by_rank
from tierdiag.diagnose.dp.routing import routing_step
from tierdiag.diagnose.request.slow import slow_requests
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

DP = 4


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """Three replays of one trace: `solo` (one rank), `ca` (4 ranks, cache_aware, round-robin
    placement planted) and `rr` (4 ranks, round_robin, every request planted on rank seq % 3:
    rank 3 idle; a host pool of 16,384 tokens, not 200,000, so that its requests' TTFTs differ)."""
    folder = tmp_path_factory.mktemp("ranks")
    trace = write_trace(folder / "reuse.jsonl", reuse_lines())
    path = folder / "run.duckdb"
    ids = {}
    for name in ("solo", "ca", "rr"):
        pools = REUSE_POOLS if name != "rr" else ("--device-tokens", "16384", "--host-tokens", "16384")
        cli("replay", trace, "--db", path, "--run-name", name, *pools)
        with open_store(path) as con:
            ids[name] = resolve_run(con, name).run_id
    plant_ranks(path, ids["ca"], dp=DP, router="cache_aware")
    plant_ranks(path, ids["rr"], dp=DP, router="round_robin", rank_of=lambda row: int(row["seq"]) % 3)
    return path


def finished(r: dict) -> bool:
    return (r["status"] or "finished") == "finished" and r["ttft_ns"] is not None


# --- summary: per rank, from the rows -----------------------------------------------------------

@pytest.mark.parametrize("name", ["ca", "rr"])
def test_per_rank_numbers_are_the_rows(db, name):
    reqs, batches = rows(db, name), rows(db, name, "batches")
    with open_store(db) as con:
        s = rank_summary(con, resolve_run(con, name))
    assert (s.dp, s.router) == (DP, {"ca": "cache_aware", "rr": "round_robin"}[name])
    done = [r for r in reqs if finished(r)]
    start = min(r["arrival_ns"] for r in done)
    end = max(r["finish_ns"] or r["first_token_ns"] or r["arrival_ns"] for r in done)
    assert s.span_ns == end - start
    assert [k.dp_rank for k in s.ranks] == list(range(DP))  # rr's idle rank 3 is listed too
    busy = {}
    for b in batches:
        busy[b["dp_rank"]] = busy.get(b["dp_rank"], 0) + b["t_end_ns"] - b["t_start_ns"]
    for k in s.ranks:
        mine = [r for r in reqs if r["dp_rank"] == k.dp_rank]
        fin = [r for r in mine if finished(r)]
        assert (k.num_requests, k.num_finished) == (len(mine), len(fin))
        for field, col in (("input_tokens", "input_tokens"), ("computed_tokens", "computed_tokens"),
                           ("device_hit_tokens", "device_hit_tokens"), ("host_hit_tokens", "host_hit_tokens"),
                           ("storage_hit_tokens", "storage_hit_tokens")):
            assert getattr(k, field) == sum(r[col] for r in fin), (k.dp_rank, field)
        inp = sum(r["input_tokens"] for r in fin)
        assert k.device_share == (sum(r["device_hit_tokens"] for r in fin) / inp if inp else None)
        assert k.host_share == (sum(r["host_hit_tokens"] for r in fin) / inp if inp else None)
        ttfts = [r["ttft_ns"] for r in fin]
        assert (k.ttft_p50_ns, k.ttft_p90_ns) == (nearest_rank(ttfts, 0.5), nearest_rank(ttfts, 0.9))
        assert k.prefill_busy_ns == busy.get(k.dp_rank, 0)
        assert k.prefill_busy_share == busy.get(k.dp_rank, 0) / s.span_ns  # an idle rank: 0 %
    own = [busy.get(k, 0) for k in range(DP)]
    assert s.busy_max_ns == max(own) and s.busiest_rank == own.index(max(own))
    assert s.imbalance == pytest.approx(max(own) / (sum(own) / DP))
    if name == "rr":  # three ranks did the work of four: the busiest ran well above the mean
        assert s.ranks[3].num_requests == 0 and s.ranks[3].prefill_busy_ns == 0 and s.imbalance > 1.2


def test_routing_totals_follow_ranks_json(db):
    """to best rank / held elsewhere, recomputed from every request's per-rank prefix at arrival
    with the contract's rule for the best rank (most device + host; ties: its own, else the lowest)."""
    reqs = rows(db, "ca")
    to_best = elsewhere = 0
    for r in reqs:
        ranks = json.loads(r["ranks_json"])
        held = [x["device_tokens"] + x["host_tokens"] for x in ranks]
        own = r["dp_rank"]
        best = own if held[own] == max(held) else held.index(max(held))
        assert best == r["best_rank"], r["req_id"]
        to_best += best == own
        elsewhere += held[best] - held[own]
    with open_store(db) as con:
        s = rank_summary(con, resolve_run(con, "ca"))
    assert (s.num_routed, s.to_best_rank, s.held_elsewhere_tokens) == (len(reqs), to_best, elsewhere)
    assert 0 < to_best < len(reqs) and elsewhere > 0  # the planted run has both kinds
    assert s.to_best_rank_share == to_best / len(reqs)


def test_summary_terminal_and_json_show_the_ranks(db):
    out = cli("summary", "--db", db, "--run", "ca")
    assert "deployment: 4 data-parallel ranks behind router cache_aware" in out
    assert "load by rank (4 ranks, router cache_aware)" in out and "reuse and TTFT by rank" in out
    with open_store(db) as con:
        s = rank_summary(con, resolve_run(con, "ca"))
    assert f"imbalance {s.imbalance:.2f}: busiest rank {s.busiest_rank}'s prefill busy" in out
    assert f"routing: {s.to_best_rank:,} of {s.num_routed:,} requests" in out
    tables = out.split("load by rank", 1)[1].split("routing:", 1)[0]
    for line in tables.splitlines():  # the per-rank tables fit 80 columns; their sentences wrap
        assert len(line) <= 80 or line.startswith("imbalance"), line
    d = json.loads(cli("summary", "--db", db, "--run", "ca", "--json"))
    assert d["ranks"]["dp"] == DP and d["ranks"]["router"] == "cache_aware"
    assert [k["dp_rank"] for k in d["ranks"]["per_rank"]] == list(range(DP))
    assert d["ranks"]["per_rank"][0]["prefill_busy_ms"] == s.ranks[0].prefill_busy_ns / 1e6
    assert d["ranks"]["imbalance"] == s.imbalance and d["ranks"]["held_elsewhere_tokens"] == s.held_elsewhere_tokens


def test_runs_shows_the_deployment_of_ranked_runs_only(db):
    out = cli("runs", "--db", db)
    assert out.count("4 ranks · router cache_aware") == 1 and out.count("4 ranks · router round_robin") == 1
    assert "dp=" not in out and "router=" not in out  # its own line, not again as an option


# --- explain: the routing step --------------------------------------------------------------------

def _numbers(text: str) -> list[int]:
    return [int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", text)]


def test_routing_claims_are_the_rows(db):
    """Every request's routing step, sentence by sentence, against its row."""
    with open_store(db) as con:
        run = resolve_run(con, "ca")
    seen = set()
    for r in rows(db, "ca"):
        step = routing_step(run, r, 5)
        claims = {c.name: c.text for c in step.claims}
        assert step.finding == " ".join(c.text for c in step.claims)
        own, ranks = r["dp_rank"], json.loads(r["ranks_json"])
        assert [x.rank for x in step.evidence.ranks] == [x["rank"] for x in ranks]
        routed = claims["routed"]
        assert routed.startswith(f"The cache_aware router sent it to rank {own} of {DP} by its {r['route_branch']} rule")
        assert f'("{r["route_reason"]}")' in routed
        assert routed.endswith(f"the deciding number, {r['route_score_name']}, was {r['route_score']:,.4g}.")
        d, h = r["arrival_device_tokens"], r["arrival_host_tokens"]
        assert (d, h) == (ranks[own]["device_tokens"], ranks[own]["host_tokens"])
        at = claims["at_arrival"]
        assert at.startswith(f"At its arrival rank {own} held ")
        assert ("none of its prefix" in at) == (d == h == 0)
        assert _numbers(at.split(" held ", 1)[1]) == [n for n in (d, h) if n]
        holders = sorted(((x["device_tokens"], x["rank"]) for x in ranks if x["rank"] != own and x["device_tokens"]),
                         key=lambda t: (-t[0], t[1]))
        text = claims["elsewhere"]
        if not holders:
            assert text == f"No other rank of the {DP} held any of it on device."
            seen.add("none elsewhere")
        elif len(holders) == 1:
            assert text.startswith(f"Rank {holders[0][1]} held {holders[0][0]:,} tokens of this prefix on device")
        else:
            listed = ", ".join(f"rank {k} {n:,}" for n, k in holders)
            assert text.startswith(f"{len(holders)} other ranks held up to {holders[0][0]:,} tokens") and listed in text
        if holders and holders[0][0] > d:
            assert text.endswith("which held none on device." if d == 0 else f"which held {d:,} on device.")
            seen.add("more elsewhere, none here" if d == 0 else "more elsewhere")
        elif holders:
            assert text.endswith(f"none more than rank {own}.")
            seen.add("no more elsewhere")
        best = r["best_rank"]
        assert ("best_rank" in claims) == (best != own)
        if best != own:
            bd, bh = r["best_rank_device_tokens"], r["best_rank_host_tokens"]
            assert _numbers(claims["best_rank"]) == [best, bd, bh, bd + bh - d - h, own]
            seen.add("best elsewhere")
        assert list(claims) == ["routed", "at_arrival", "elsewhere"] + (["best_rank"] if best != own else [])
    assert seen >= {"none elsewhere", "more elsewhere, none here", "no more elsewhere", "best elsewhere"}, seen


def test_explain_adds_the_routing_step_last_in_terminal_and_json(db):
    req = next(r for r in rows(db, "ca") if r["best_rank"] != r["dp_rank"])["req_id"]
    with open_store(db) as con:
        expl = explain_request(con, resolve_run(con, "ca"), req)
    assert expl.steps[-1].name == "routing" and expl.steps[-1].step == len(expl.steps)
    d = json.loads(cli("explain", req, "--db", db, "--run", "ca", "--json"))
    last = d["steps"][-1]
    assert last["name"] == "routing" and [c["name"] for c in last["claims"]][-1] == "best_rank"
    assert last["finding"] == " ".join(c["text"] for c in last["claims"])
    assert last["evidence"]["dp_rank"] is not None and len(last["evidence"]["ranks"]) == DP
    assert all("claims" not in s for s in d["steps"][:-1])
    out = cli("explain", req, "--db", db, "--run", "ca")
    assert f"{len(expl.steps)} · routing" in out
    assert re.search(r"rank\s+device\s+host\s+in flight\s+score", out)


# --- slow --by rank --------------------------------------------------------------------------------

def test_slow_by_rank_is_slow_cut_by_rank(db):
    reqs = {r["req_id"]: r for r in rows(db, "ca")}
    with open_store(db) as con:
        run = resolve_run(con, "ca")
        groups = slow_by_rank(con, run, top=3)
        everyone = slow_requests(con, run, top=1000)
    assert [g.dp_rank for g in groups] == list(range(DP))
    for g in groups:
        mine = [s for s in everyone if reqs[s.req_id]["dp_rank"] == g.dp_rank]
        assert g.num_slow == len(mine) and g.excess_total_ns == sum(s.excess_ns for s in mine)
        assert g.num_requests == sum(1 for r in reqs.values() if r["dp_rank"] == g.dp_rank and finished(r))
        assert [s.req_id for s in g.requests] == [s.req_id for s in mine[:3]]
        assert [s.rank for s in g.requests] == list(range(1, len(g.requests) + 1))
    d = json.loads(cli("slow", "--db", db, "--run", "ca", "--by", "rank", "--top", "3", "--json"))
    assert d["by"] == "rank" and [g["num_slow"] for g in d["groups"]] == [g.num_slow for g in groups]
    assert [[r["req_id"] for r in g["requests"]] for g in d["groups"]] == [[s.req_id for s in g.requests]
                                                                          for g in groups]
    ids = cli("slow", "--db", db, "--run", "ca", "--by", "rank", "--top", "3", "--ids").split()
    assert ids == [s.req_id for g in groups for s in g.requests]
    out = cli("slow", "--db", db, "--run", "ca", "--by", "rank", "--top", "3")
    for g in groups:
        assert f"rank {g.dp_rank}: {g.num_requests:,} finished, {g.num_slow:,} slower than their ideal" in out


def test_slow_by_rank_refuses_a_grouping_it_does_not_know(db):
    tierdiag_in_process("slow", "--db", db, "--by", "node").fails(2, "unknown --by grouping 'node'; known: rank")


# --- one rank: as before ------------------------------------------------------------------------------

def test_a_one_rank_run_reads_as_before(db):
    with open_store(db) as con:
        run = resolve_run(con, "solo")
        assert rank_summary(con, run) is None and run_summary(con, run, diagnose=False).ranks is None
        req = rows(db, "solo")[0]
        assert routing_step(run, req, 5) is None
        groups = slow_by_rank(con, run, top=5)
        plain = slow_requests(con, run, top=5)
    d = json.loads(cli("summary", "--db", db, "--run", "solo", "--json"))
    assert "ranks" not in d
    out = cli("summary", "--db", db, "--run", "solo")
    assert "by rank" not in out and "deployment" not in out
    e = json.loads(cli("explain", req["req_id"], "--db", db, "--run", "solo", "--json"))
    assert [s["name"] for s in e["steps"]][-1] != "routing" and all("claims" not in s for s in e["steps"])
    # slow --by rank: one group, rank 0 (the contract's rank of a one-rank replay), slow's own rows.
    assert [g.dp_rank for g in groups] == [0] and [s.req_id for s in groups[0].requests] == [s.req_id for s in plain]


def test_a_v3_store_reads_without_ranks(tmp_path):
    """A store written before the data-parallel columns: no per-rank section, no routing step,
    slow --by rank one group."""
    trace = write_trace(tmp_path / "reuse.jsonl", reuse_lines(12))
    db = tmp_path / "v3.duckdb"
    cli("replay", trace, "--db", db, *REUSE_POOLS)
    with duckdb.connect(str(db)) as con:  # as tierdiag wrote it before v4
        for table, cols in (("requests", ("dp_rank", "route_branch", "route_reason", "route_score",
                                          "route_score_name", "arrival_device_tokens", "arrival_host_tokens",
                                          "best_rank", "best_rank_device_tokens", "best_rank_host_tokens",
                                          "ranks_json")),
                            ("evictions", ("dp_rank",)), ("transfers", ("dp_rank",)), ("batches", ("dp_rank",)),
                            ("pool_samples", ("dp_rank",))):
            for col in cols:
                con.execute(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {col}")
        con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    assert "ranks" not in json.loads(cli("summary", "--db", db, "--json"))
    assert [s["name"] for s in json.loads(cli("explain", "3", "--db", db, "--json"))["steps"]][-1] != "routing"
    d = json.loads(cli("slow", "--db", db, "--by", "rank", "--json"))
    assert [g["dp_rank"] for g in d["groups"]] == [0]
    assert [r["req_id"] for r in d["groups"][0]["requests"]] == [
        r["req_id"] for r in json.loads(cli("slow", "--db", db, "--json"))["requests"]]


# --- compare ---------------------------------------------------------------------------------------------

def test_compare_shows_ranks_and_routing_for_ranked_runs(db):
    d = json.loads(cli("compare", "solo", "ca", "rr", "--db", db, "--json"))
    by_name = {r["name"]: r for r in d["runs"]}
    assert "ranks" not in by_name["solo"]
    assert by_name["ca"]["ranks"]["router"] == "cache_aware" and by_name["rr"]["ranks"]["router"] == "round_robin"
    assert "router" in d["varied"] and "dp" in d["varied"]
    with open_store(db) as con:
        ca = rank_summary(con, resolve_run(con, "ca"))
    assert by_name["ca"]["ranks"]["to_best_rank"] == ca.to_best_rank
    out = CliRunner().invoke(app, ["compare", "solo", "ca", "rr", "--db", str(db)], env={"COLUMNS": "200"}).output
    table = out.split("ranks and routing", 1)[1]
    assert "ca " in table and "rr " in table and "solo" not in table
    assert f"{ca.imbalance:.2f}" in table


def test_compare_requests_names_the_serving_ranks(db):
    ranks = {name: {r["req_id"]: r["dp_rank"] for r in rows(db, name)} for name in ("ca", "rr")}
    d = json.loads(cli("compare", "ca", "rr", "--db", db, "--requests", "--top", "5", "--json"))
    listed = d["gains"] + d["losses"] + d["changed"]
    assert listed
    for x in listed:
        assert (x["rank_a"], x["rank_b"]) == (ranks["ca"][x["req_id"]], ranks["rr"][x["req_id"]])
    # Against a run of one rank: its side is rank 0; two runs of one rank: no rank keys at all.
    d = json.loads(cli("compare", "solo", "ca", "--db", db, "--requests", "--json"))
    assert all(x["rank_a"] == 0 for x in d["gains"] + d["losses"] + d["changed"])
    with open_store(db) as con:
        from tierdiag.diagnose.comparison.compare import compare_requests

        solo = resolve_run(con, "solo")
        same = compare_requests(con, solo, solo)
    assert all("rank_a" not in x.to_json() for x in same.gains + same.losses + same.changed)
    out = CliRunner().invoke(app, ["compare", "ca", "rr", "--db", str(db), "--requests"], env={"COLUMNS": "200"}).output
    assert "rank A → B" in out
