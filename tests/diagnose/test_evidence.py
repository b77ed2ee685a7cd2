"""Run evidence stored at the run's close (diagnose/run/evidence.py): what readers read back is what
they would compute from the rows, they fall back to computing it wherever it is missing, stale
or unreadable, deleting a run deletes it, and a failure to store it never costs the run anything."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.diagnose.conftest import RunBuilder, plant_scenarios
from tests.diagnose.test_cli import run_cli
from tierdiag.diagnose.request.causes import CAUSES
from tierdiag.diagnose.run import evidence as E
from tierdiag.diagnose.run import facts as F
from tierdiag.diagnose.run import stored as S
from tierdiag.diagnose.run.runcontext import LossEvidence, RunContext, TransferEvidence, compute_run_context
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.session.session_pool import session_pauses
from tierdiag.diagnose.session.sessions import session_summary
from tierdiag.diagnose.dp.ranks import rank_summary
from tierdiag.diagnose.run.miss_reasons import run_miss_reasons
from tierdiag.diagnose.run.size_curves import size_curves
from tierdiag.diagnose.run.totals import RunTotals, run_totals
from tierdiag.diagnose.run.summary import compute_run_summary, run_summary
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402
from tierdiag.diagnose.run.close import after_commit


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """A real replay (200 mixed synthetic requests) on pools small enough to lose prefixes, with a
    late-prefetching storage tier and a load-back threshold: every section has something in it."""
    folder = tmp_path_factory.mktemp("evidence")
    trace = folder / "mixed.jsonl"
    assert CliRunner().invoke(app, ["synth", str(trace), "--requests", "200", "--rate", "8"]).exit_code == 0
    db = folder / "run.duckdb"
    result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--model", "llama3-8b", "--gpu", "h100",
                                      "--device-tokens", "65536", "--host-tokens", "98304",
                                      "--storage-tokens", "1048576", "--load-back-threshold", "1024",
                                      # late prefetches need best_effort: 0.5.23's default, timeout,
                                      # waits longer than any read here
                                      "--prefetch-policy", "best_effort"])
    assert result.exit_code == 0, (result.output, result.exception)
    return db


def _run(con):
    return resolve_run(con, None)


def _sample_ids(con, run_id: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT req_id FROM (SELECT req_id, row_number() OVER (ORDER BY ttft_ns - ideal_ttft_ns DESC) AS a, "
        "row_number() OVER (ORDER BY recomputed_tokens DESC) AS b, "
        "row_number() OVER (ORDER BY host_hit_tokens + storage_hit_tokens DESC) AS c, seq FROM requests "
        "WHERE run_id = ?) WHERE a <= 4 OR b <= 4 OR c <= 4 OR seq < 3 ORDER BY seq", [run_id]).fetchall()]


def _views(db: Path) -> dict:
    """What the readers print (--json): summary with its diagnosis, explain of a sample."""
    with open_store(db) as con:
        run = _run(con)
        out = {"summary": run_summary(con, run).to_json()}
        for req in _sample_ids(con, run.run_id):
            out[req] = explain_request(con, run, req).to_json()
    return out


def _copy(db: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copy(db, dst)
    return dst


def _sql(db: Path, *statements: str) -> None:
    with duckdb.connect(str(db)) as con:
        for s in statements:
            con.execute(s)


@pytest.mark.parametrize("which", ["replayed", "planted"])
def test_stored_evidence_is_what_the_rows_give(request, which):
    db = request.getfixturevalue(which)
    db = db if isinstance(db, Path) else db.path
    with open_store(db) as con:
        run = _run(con)
        stored = F.stored_evidence(con, run)
        assert stored is not None, "the writer stores the evidence when it closes the run"
        computed = compute_run_context(con, run)
        assert stored.context(run) == computed
        assert stored.summary(run) == compute_run_summary(con, run)
        assert stored.totals() == run_totals(con, run.run_id)
        assert stored.sessions() == (True, session_pauses(con, run))
        assert stored.size_curves() == (True, size_curves(con, run))
        assert stored.session_summary() == (True, session_summary(con, run))
        assert stored.rank_summary() == (True, rank_summary(con, run))
        assert stored.miss_reasons() == (True, run_miss_reasons(con, run.run_id))
        assert run_context(con, run) == computed  # what every reader gets
    if which == "replayed":  # the real run has all of it: a split queue, losses, load-backs
        assert computed.queue_attribution and computed.losses.recomputed_tokens > 0
        assert computed.losses.removed_reuse_deciles_tokens and computed.transfers.num_loadbacks > 0


@pytest.fixture(scope="module")
def replayed_views(replayed) -> dict:
    """`_views` of the unspoiled run, once for every spoil below (the store is only read)."""
    return _views(replayed)


@pytest.mark.parametrize("spoil", ["no table", "old version", "config edited", "not JSON", "another class"])
def test_readers_fall_back_to_the_rows_and_say_the_same(replayed, replayed_views, tmp_path, spoil):
    base = replayed_views
    db = _copy(replayed, tmp_path, "spoiled.duckdb")
    _sql(db, {
        "no table": "DROP TABLE run_evidence",  # a store written before the table existed
        "old version": f"UPDATE run_evidence SET evidence_version = {S.EVIDENCE_VERSION - 1}",
        # the numbers were computed from another config (a key no view reads, so they agree)
        "config edited": "UPDATE runs SET config_json = replace(config_json, '{', '{\"note\": \"edited\", ')",
        "not JSON": "UPDATE run_evidence SET evidence_json = '{\"context\": '",
        "another class": "UPDATE run_evidence SET evidence_json = replace(evidence_json, "
                         "'\"__dataclass__\":\"LossEvidence\"', '\"__dataclass__\":\"Gone\"')",
    }[spoil])
    with open_store(db) as con:
        run = _run(con)
        stored = F.stored_evidence(con, run)
        if spoil == "another class":  # the row is read, that one section is not: computed instead
            assert stored is not None and stored.context(run) is None and stored.totals() is not None
        elif spoil == "config edited":
            assert stored is None and run.config["note"] == "edited"
        else:
            assert stored is None
    assert _views(db) == base


def test_runs_delete_works_on_a_store_made_before_the_table(planted, tmp_path):
    from tierdiag.store.delete import delete_run

    db = _copy(planted.path, tmp_path, "old.duckdb")
    _sql(db, "DROP TABLE run_evidence")
    gone = delete_run(db, planted.run_id)
    assert "run_evidence" not in gone.rows and gone.rows["requests"] == len(planted.requests)
    # ... and in a current store the row goes with the run (tests/cli/test_runs.py checks the CLI's count)
    gone = delete_run(planted.path, planted.run_id)
    assert gone.rows["run_evidence"] == 1
    with duckdb.connect(str(planted.path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM run_evidence").fetchone()[0] == 0


def _counts(db: Path, run_id: str) -> dict:
    from tierdiag.store.schema import EVENT_TABLES

    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
                for t in EVENT_TABLES}


@pytest.mark.parametrize("failure", ["compute", "write", "busy"])
def test_a_failure_storing_the_evidence_keeps_the_run_whole(tmp_path, monkeypatch, capsys, planted, failure):
    if failure == "compute":
        def boom(con, run):
            raise RuntimeError("no evidence today\x1b[2J")
        monkeypatch.setattr(E, "compute_evidence", boom)
    elif failure == "write":  # inside the evidence transaction: a value the column cannot hold
        monkeypatch.setattr(E, "EVIDENCE_VERSION", "not a number")
    b = plant_scenarios(RunBuilder(tmp_path / "failing.duckdb"))
    b.write()
    if failure == "busy":
        # The standalone path (the writer's close computes it on its own connection, which no
        # other process can hold): another process holds the file when the evidence would be
        # written.
        import tierdiag.store.reader as reader

        with duckdb.connect(str(b.path)) as con:
            con.execute("DELETE FROM run_evidence")
        capsys.readouterr()
        real = reader.connect_with_retry

        def held(path, *, read_only, wait_s=3.0):
            if not read_only:
                raise duckdb.IOException(f'Could not set lock on file "{path}": Conflicting lock is held in '
                                         f'python (PID 4242)')
            return real(path, read_only=read_only, wait_s=wait_s)
        monkeypatch.setattr(reader, "connect_with_retry", held)
        assert E.record_run_evidence(b.path, b.run_id) is not None
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("tierdiag: warning: run ") and "\x1b" not in lines[0], err
    assert "recorded in full" in lines[0] and "computes it from the rows and stores it" in lines[0]
    monkeypatch.undo()
    with open_store(b.path) as con:
        run = _run(con)
        assert run.status == "complete" and run.num_requests == len(b.requests)
        assert F.stored_evidence(con, run) is None
    assert _counts(b.path, b.run_id) == _counts(planted.path, planted.run_id)  # every row, as planted
    with open_store(b.path) as con, open_store(planted.path) as con2:
        e1 = explain_request(con, _run(con), "tier").to_json()
        e2 = explain_request(con2, _run(con2), "tier").to_json()
    for e in (e1, e2):
        e.pop("run_id"), e.pop("run_name")
    assert e1 == e2
    # The store takes the next run as usual, with its evidence.
    b2 = plant_scenarios(RunBuilder(b.path, name="second"))
    b2.write()
    with open_store(b.path) as con:
        assert F.stored_evidence(con, resolve_run(con, b2.run_id)) is not None


def test_interrupted_runs_get_evidence_failed_and_observed_ones_do_not(tmp_path):
    from tierdiag.store.writer import RunWriter

    db = tmp_path / "statuses.duckdb"
    ids = {}
    for status, kind in (("interrupted", "replay"), ("failed", "replay"), ("complete", "observed")):
        b = plant_scenarios(RunBuilder(db, name=f"{status}-{kind}"))
        w = RunWriter(db, name=b.name, trace_path="t.jsonl", trace_sha256="", config=b.config, hardware={},
                      data_plane={}, timing="modelled", kind=kind)
        w.append({"requests": {k: [r.get(k) for r in b.requests] for k in b.requests[0]}})
        w.finish(status, after_commit=after_commit)  # as a replay closes it
        ids[status] = w.run_id
    with open_store(db) as con:
        rows = dict(con.execute("SELECT run_id, evidence_version FROM run_evidence").fetchall())
    assert rows == {ids["interrupted"]: S.EVIDENCE_VERSION}


def test_a_sweep_merge_carries_the_evidence(planted, tmp_path):
    from tierdiag.store.copy_run import read_run_tables, write_run_tables

    merged = tmp_path / "sweep.duckdb"
    write_run_tables(merged, read_run_tables(planted.path), {"sweep_id": "sweep-1", "trace_path": "/elsewhere.jsonl"})
    with open_store(merged) as con, open_store(planted.path) as con0:
        run, run0 = _run(con), _run(con0)
        stored = F.stored_evidence(con, run)
        assert stored is not None and run.trace_path == "/elsewhere.jsonl"
        assert stored.summary(run) == compute_run_summary(con, run)  # the trace path is the merged row's
        assert stored.context(run) == F.stored_evidence(con0, run0).context(run0)


def test_a_row_written_before_summarys_read_time_sections_reads_and_computes_them(replayed, replayed_views,
                                                                              tmp_path):
    """A v10 row from before issue 41 has no `session_summary`, `rank_summary`, `miss_reasons`: the
    rest of it is used, those are computed from the rows, and every view says the same."""
    db = _copy(replayed, tmp_path, "older-row.duckdb")
    with duckdb.connect(str(db)) as con:
        (raw,) = con.execute("SELECT evidence_json FROM run_evidence").fetchone()
        sections = json.loads(raw)
        assert sections["session_summary"] is not None, "the mixed synth trace has sessions"
        assert sections["miss_reasons"] is not None
        for late in ("session_summary", "rank_summary", "miss_reasons"):  # the sections issue 41 added
            del sections[late]
        con.execute("UPDATE run_evidence SET evidence_json = ?", [json.dumps(sections)])
    with open_store(db) as con:
        run = _run(con)
        stored = F.stored_evidence(con, run)
        assert stored is not None and stored.session_summary() == (False, None)
        assert stored.rank_summary() == (False, None) and stored.miss_reasons() == (False, None)
        assert stored.totals() is not None
        facts = F.RunFacts(con, run)
        assert facts.session_summary() == session_summary(con, run) is not None
        assert facts.miss_reasons() == run_miss_reasons(con, run.run_id) is not None
    assert _views(db) == replayed_views


@pytest.mark.parametrize("args", [("explain", "tier"), ("explain", "recomp", "--json"), ("summary",),
                                  ("summary", "--json"), ("slow", "--json")])
def test_with_stored_evidence_explain_and_summary_need_no_numpy(planted, args):
    """No numpy (the evidence is stored), and no Rich where the output is JSON."""
    code, _, err, mods = run_cli(*args, "--db", str(planted.path), watch=("numpy", "torch", "pandas", "rich"))
    assert code == 0, err
    assert mods == ([] if "--json" in args else ["rich"]), f"{args[0]} imported {mods}"


# The stored classes, field by field. Changing one changes what a stored row means: bump
# EVIDENCE_VERSION (old rows are then ignored, not misread) and update this list.
STORED_FIELDS = {
    "RunContext": ["run_id", "span_ns", "num_finished", "prefill_busy_share", "prefill_compute_ns", "recompute_ns",
                   "recompute_share_of_prefill", "ttft_total_ns", "queue_total_ns", "queue_share_of_ttft",
                   "excess_total_ns", "queue_attribution", "losses", "transfers", "config", "kv_bytes_per_token",
                   "ttft_p50_ns", "ttft_p99_ns", "story", "capacity", "routing", "prefill_busy_ns"],
    "RoutingLoss": ["num_ranks", "router", "routed_requests", "routing_tokens", "recomputed_tokens",
                        "input_tokens", "routing_ns", "routing_cost_ns", "branch_tokens", "session_tokens",
                        "best_share_tokens", "miss_best_share_tokens"],
    "RunStory": ["excess_total_ns", "verdicts", "queued_excess_ns", "queued_busy_share", "queued_wait_ns",
                 "queued_wait_parts_ns", "caches_doing_excess_ns", "evicted_while_waiting_requests",
                 "evicted_while_waiting_excess_ns", "other_busy_share", "other_recompute_share",
                 "other_wait_parts_ns", "other_wait_ns", "evicted_while_waiting_tokens",
                 "max_running", "max_running_given", "queued_cap_share", "other_cap_share"],
    "VerdictShare": ["cause", "caches_doing", "num_requests", "excess_ns", "excess_share"],
    "Capacity": ["window_ns", "span_ns", "overloaded_share", "overload_factor", "peak_load", "material_load", "mean_load",
                 "offered_ns", "num_ranks"],
    "LossEvidence": ["input_tokens", "recomputed_tokens", "recomputed_share", "skipped_tokens",
                     "storage_unused_tokens", "lost_tokens", "deleted_from_host_tokens", "dropped_unbacked_tokens",
                     "hot_removed_tokens", "removed_reuse_p50_tokens", "removed_reuse_p90_tokens",
                     "removed_reuse_deciles_tokens", "device_capacity_tokens", "host_capacity_tokens",
                     "storage_capacity_tokens", "lost_request_deciles_tokens", "hot_competing_deciles_tokens",
                     "in_batch_tokens", "trace_arrival_spread_ns"],
    "TransferEvidence": ["num_loadbacks", "loadback_bytes", "loadback_busy_ns", "link_peak_share", "pages_per_run",
                         "bytes_per_run", "bytes_per_page", "loadback_ns", "recompute_instead_extra_ns",
                         "loadback_exposed_ns", "ttft_total_ns", "tiered_ttft_ns", "transfer_overhead_ns"],
    "SessionPauses": ["num_turns", "input_tokens", "reused_tokens", "device_tokens", "host_tokens", "storage_tokens",
                      "recomputed_tokens", "pause_p90_ms", "pool_p90_tokens", "kept_curve"],
    "SizeCurves": ["write_policy", "page_size", "num_ranks", "input_tokens", "looked_up_tokens", "slack_tokens", "curves",
                   "model", "sample_rate"],
    "SizeCurve": ["tier", "run_size_tokens", "held", "steps", "unbounded_reused_tokens", "knee_tokens",
                  "found_tokens"],
    "SessionSummary": ["arrivals", "num_sessions", "num_turns_with_predecessor", "survival", "num_ended_sessions",
                       "num_turns_not_served", "ended"],
    "PauseBucket": ["label", "min_think_ms", "max_think_ms", "num_turns", "reused_tokens", "device_share", "host_share",
                    "storage_share", "recomputed_share", "ttft_p50_ns", "ttft_p99_ns", "paused_lost_share",
                    "queued_lost_share"],
    "EndedSession": ["session_id", "rejected_req_id", "reject_reason", "turns_not_served"],
    "RankSummary": ["dp", "router", "span_ns", "ranks", "busy_max_ns", "busy_mean_ns", "busiest_rank", "imbalance",
                    "num_routed", "to_best_rank", "to_best_rank_share", "held_elsewhere_tokens",
                    "prefix_tokens_at_arrival"],
    "RankStats": ["dp_rank", "num_requests", "num_finished", "prefill_busy_ns", "prefill_busy_share", "computed_tokens",
                  "input_tokens", "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "device_share",
                  "host_share", "storage_share", "ttft_p50_ns", "ttft_p90_ns"],
    "Deployment": ["dp", "router"],
    "RunTotals": ["start_ns", "end_ns", "loadbacks", "loadback_bytes", "device_evictions", "device_evicted_tokens",
                  "device_rereferenced_tokens"],
    "RunSummary": ["run_id", "run_name", "status", "trace_path", "model", "gpu", "num_requests", "num_finished",
                   "num_rejected", "rejected_reasons", "span_ns", "tokens", "hit_requests", "hit_request_share",
                   "reused_token_share", "median_reused_tokens_per_hit", "classes", "load_back", "skipped",
                   "evictions", "most_evicted_from", "top_evictors", "time_by_cause", "ttft_total_ns",
                   "excess_total_ns", "diagnosis", "sessions", "ranks", "miss_reasons", "size_curves"],
    "TierSplit": ["input_tokens", "device_tokens", "host_tokens", "storage_tokens", "computed_tokens",
                  "recomputed_tokens", "loadback_skipped_tokens"],
    "ClassStats": ["hit_class", "num_requests", "input_tokens", "reused_tokens", "ttft_p50_ns", "ttft_p90_ns",
                   "ttft_p99_ns", "ttft_mean_ns", "ttft_max_ns"],
    "LoadBackTotals": ["num_requests", "num_transfers", "loaded_tokens", "bytes", "pages", "runs", "link_busy_ns",
                       "exposed_ns", "queued_ns", "achieved_bytes_per_s", "link_peak_bytes_per_s",
                       "link_peak_share", "loadbacks_per_s", "loadback_bytes_per_s", "num_prefetches",
                       "prefetch_bytes", "storage_wait_ns"],
    "SkipCount": ["tier", "reason", "num_requests", "tokens"],
    "EvictionCount": ["tier", "action", "num_events", "tokens"],
    "RequestCount": ["req_id", "num_events", "tokens"],
    "ReasonCount": ["reason", "num_requests", "tokens"],
    "CauseShare": ["cause", "num_requests", "ttft_part_ns", "ttft_share", "excess_part_ns", "excess_share"],
}


def test_the_stored_classes_are_the_ones_evidence_version_describes():
    classes = {}
    for section in ("context", "totals", "summary", "sessions", "size_curves", "session_summary", "rank_summary",
                    "miss_reasons"):
        classes.update(S.section_classes(section))
    assert sorted(classes) == sorted(STORED_FIELDS)
    for name, cls in classes.items():
        assert [f.name for f in dataclasses.fields(cls)] == STORED_FIELDS[name], (
            f"{name} changed: bump EVIDENCE_VERSION in diagnose/run/evidence.py and update STORED_FIELDS")
    assert [classes[c.__name__] for c in (RunContext, LossEvidence, TransferEvidence, RunTotals)] == [
        RunContext, LossEvidence, TransferEvidence, RunTotals]


def test_encoding_reads_back_as_itself_or_refuses():
    value = RunTotals(1, 2, 3, 4, 5, 6, 7)
    assert S.decode(json.loads(json.dumps(S.encode(value))), {"RunTotals": RunTotals}) == value
    nested = {"a": (1, 2.5, None, "x", [True, (3,)])}
    assert S.decode(json.loads(json.dumps(S.encode(nested))), {}) == nested
    for bad in ({1: "int key"}, {"__tuple__": 1}, object()):
        with pytest.raises(TypeError):
            S.encode(bad)
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError):
        S.encode(np.int64(3))


def test_advice_uses_the_cost_models_disk_rate():
    from tierdiag.diagnose.advice.rules.prefetch import DISK_BYTES_PER_S
    from tierdiag.engine.costmodel import DISK_BYTES_PER_S as MODEL

    assert DISK_BYTES_PER_S == MODEL


def test_a_data_parallel_runs_ranks_are_stored_and_read_back_as_computed(tmp_path):
    """`rank_summary` (issue 41): a --dp run's per-rank section is stored at close and reads back
    equal to what the rows give; summary says the same with the section gone."""
    trace = tmp_path / "mixed.jsonl"
    assert CliRunner().invoke(app, ["synth", str(trace), "--requests", "120", "--rate", "8"]).exit_code == 0
    db = tmp_path / "dp.duckdb"
    result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--dp", "2", "--router", "cache_aware"])
    assert result.exit_code == 0, (result.output, result.exception)
    with open_store(db) as con:
        run = _run(con)
        stored = F.stored_evidence(con, run)
        computed = rank_summary(con, run)
        assert computed is not None and len(computed.ranks) == 2
        assert stored is not None and stored.rank_summary() == (True, computed)
        before = run_summary(con, run).to_json()
    with duckdb.connect(str(db)) as con:
        (raw,) = con.execute("SELECT evidence_json FROM run_evidence").fetchone()
        sections = json.loads(raw)
        del sections["rank_summary"]
        con.execute("UPDATE run_evidence SET evidence_json = ?", [json.dumps(sections)])
    with open_store(db) as con:
        assert run_summary(con, _run(con)).to_json() == before


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("where", ["run_totals", "compute_run_context", "size_curves", "run_story", "session_pauses"])
def test_a_section_that_fails_on_any_of_the_evidence_threads_fails_the_evidence(replayed, monkeypatch, where, large):
    """The sections are computed several at a time (the size curves on the caller's thread, the
    others on threads of their own: four, or from LARGE_RUN_REQUESTS requests one, the story
    before the context that waits for it; issue 41): a failure on any of them is raised by
    compute_evidence on the caller's thread, once the others are done, as one after the other."""
    def boom(*args, **kwargs):
        raise RuntimeError(f"{where} failed")

    monkeypatch.setattr(E, where, boom)
    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        with pytest.raises(RuntimeError, match=f"{where} failed"):
            E.compute_evidence(con, run)
        import threading

        assert not [t for t in threading.enumerate() if t.name == "tierdiag-evidence"]


@pytest.mark.parametrize("large", [False, True])
def test_the_evidence_computed_four_at_a_time_is_each_section_computed_alone(replayed, monkeypatch, large):
    """Below LARGE_RUN_REQUESTS the sections on four threads, from it on one after another on
    one (the peak memory of a 1M-request close, issue 41): the same sections either way."""
    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        assert E.evidence_threads(run.num_requests) == (E.LARGE_RUN_THREADS if large else E.SMALL_RUN_THREADS)
        made: dict = {}
        got = E.compute_evidence(con, run, computed=made)
        alone = {"context": compute_run_context(con, run), "summary": compute_run_summary(con, run),
                 "totals": run_totals(con, run.run_id), "sessions": session_pauses(con, run),
                 "size_curves": size_curves(con, run), "session_summary": session_summary(con, run),
                 "rank_summary": rank_summary(con, run), "miss_reasons": run_miss_reasons(con, run.run_id)}
    assert list(got) == ["inputs", "context", "summary", "totals", "sessions", "size_curves", "session_summary",
                         "rank_summary", "miss_reasons"]
    for name, value in alone.items():
        assert got[name] == S.encode(value), name
        assert made[name] == value, name  # what the close's closing numbers take the summary from


@pytest.mark.parametrize("large", [False, True])
def test_the_miss_reasons_are_queried_once_for_the_context_and_their_section(replayed, monkeypatch, large):
    """The context's in-batch tokens are the miss reasons' `shared_in_batch`, also a section of
    their own: compute_evidence queries them once (issue 41, session 23: ~20 ms of the close's
    CPU on the conversation trace), whichever thread asks first, in either plan, and the context
    is the one computed alone (which queries them itself)."""
    from tierdiag.diagnose.run.miss_reasons import run_miss_reasons as real

    calls = []

    def counted(con, run_id, **given):  # given: their sums, the run's scan's (read/run_scan.py)
        calls.append(run_id)
        return real(con, run_id, **given)

    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    monkeypatch.setattr(E, "run_miss_reasons", counted)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        made: dict = {}
        E.compute_evidence(con, run, computed=made)
        assert len(calls) == 1
        assert made["miss_reasons"] == real(con, run.run_id) and made["miss_reasons"] is not None
        assert made["context"] == compute_run_context(con, run)
        assert made["context"].losses.in_batch_tokens == made["miss_reasons"]["shared_in_batch"]


@pytest.mark.parametrize("large", [False, True])
def test_the_run_wide_sums_are_scanned_once_for_every_section(replayed, monkeypatch, large):
    """The summary's, the context's, the totals' and the miss reasons' run-wide sums are one
    query (read/run_scan.py, issue 41 session 26), made once by whichever thread asks first, in
    either plan: each section is the one computed alone from its own queries."""
    from tierdiag.diagnose.read.run_scan import run_scan as real
    from tierdiag.diagnose.run.miss_reasons import run_miss_reasons
    from tierdiag.diagnose.run.numbers import compute_run_summary
    from tierdiag.diagnose.run.totals import run_totals

    calls = []

    def counted(con, run_id, **given):
        calls.append(run_id)
        return real(con, run_id, **given)

    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    monkeypatch.setattr(E, "run_scan", counted)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        made: dict = {}
        E.compute_evidence(con, run, computed=made)
        assert calls == [run.run_id]
        assert made["summary"] == compute_run_summary(con, run)
        assert made["context"] == compute_run_context(con, run)
        assert made["totals"] == run_totals(con, run.run_id)
        assert made["miss_reasons"] == run_miss_reasons(con, run.run_id)


def test_the_miss_reasons_handed_to_the_context_are_used_and_their_failure_raised(replayed):
    """compute_run_context(miss_reasons=...) takes the in-batch tokens from what it is handed
    (the context it computes alone where that is the run's), a run without reasons (None) has
    none, and what the provider raises is raised."""
    from tierdiag.diagnose.run.miss_reasons import run_miss_reasons

    with open_store(replayed) as con:
        run = resolve_run(con, None)
        alone = compute_run_context(con, run, attribution=False)
        assert compute_run_context(con, run, attribution=False,
                                   miss_reasons=lambda: run_miss_reasons(con, run.run_id)) == alone
        assert compute_run_context(con, run, attribution=False, miss_reasons=lambda: None).losses.in_batch_tokens == 0

        def boom():
            raise RuntimeError("the miss reasons failed")

        with pytest.raises(RuntimeError, match="the miss reasons failed"):
            compute_run_context(con, run, attribution=False, miss_reasons=boom)


def test_the_story_computed_beside_the_context_is_the_contexts_own(replayed):
    """evidence.py computes the run story on a cursor of its own while the rest of the context is
    computed (issue 41): handed to compute_run_context, the context is the one it computes
    alone; the story is asked for only where the context has one (a failure of it is raised
    only then), and once."""
    from tierdiag.diagnose.read.run_context import batch_recompute_sql
    from tierdiag.diagnose.run.story import run_story

    with open_store(replayed) as con:
        run = resolve_run(con, None)
        asked = []

        def story():
            asked.append(1)
            return run_story(con, run.run_id, batch_recompute_sql(con))

        alone = compute_run_context(con, run)
        assert alone.story is not None  # the replay has batches: a story to hand over
        assert compute_run_context(con, run, story=story) == alone
        assert asked == [1]

        def boom():
            raise RuntimeError("the story failed")

        assert compute_run_context(con, run, attribution=False, story=boom) == \
            compute_run_context(con, run, attribution=False)
        with pytest.raises(RuntimeError, match="the story failed"):
            compute_run_context(con, run, story=boom)


@pytest.mark.parametrize("stored", [True, False])
def test_the_closing_numbers_from_the_computed_summary_are_the_ones_read_back(replayed, tmp_path, monkeypatch,
                                                                              stored):
    """The close takes the replay's closing numbers from the summary the evidence just computed
    (issue 41: reading it back was ~15 ms of the close): the same numbers as read back from the
    store; where the evidence was not stored (a failure: one warning), nothing is handed on and
    they are read back (computed from the rows) as before."""
    from tierdiag.diagnose.run.close import closing_numbers

    db = _copy(replayed, tmp_path, "closing.duckdb")
    if not stored:
        monkeypatch.setattr(E, "EVIDENCE_VERSION", "not a number")  # the write fails, in its transaction
    with duckdb.connect(str(db)) as con:
        run_id = resolve_run(con, None).run_id
        con.execute("DELETE FROM run_evidence")
        computed: dict = {}
        assert (E.record_run_evidence(db, run_id, con=con, computed=computed) is None) == stored
        read_back = closing_numbers(con, run_id)
        assert read_back["span_ns"] > 0 and read_back["ttft_ns"] is not None
        if stored:
            assert closing_numbers(con, run_id, summary=computed["summary"]) == read_back
            assert after_commit(con, db, run_id, "complete") == read_back
        else:
            assert computed == {}
            assert after_commit(con, db, run_id, "complete") == read_back


def test_every_section_has_one_thread_and_the_story_comes_before_the_context_on_its_own():
    """Each plan runs every section once; where the story shares a thread with the context or the
    summary the story comes first (both wait for it, the summary for its requests by cause: the
    other way round would never end)."""
    sections = {"story", "context", "sessions", "summary", "totals", "session_summary", "rank_summary", "miss_reasons"}
    for n in (None, 0, 1, E.LARGE_RUN_REQUESTS - 1, E.LARGE_RUN_REQUESTS, 10**9):
        plan = E.evidence_threads(n)
        names = [name for thread in plan for name in thread]
        assert sorted(names) == sorted(sections), n
        for thread in plan:
            for waits in ("context", "summary"):
                if waits in thread and "story" in thread:
                    assert thread.index("story") < thread.index(waits), (n, waits)
    assert E.evidence_threads(None) == E.evidence_threads(0) == E.SMALL_RUN_THREADS
    assert E.evidence_threads(10**9) == E.LARGE_RUN_THREADS


@pytest.mark.parametrize("large", [False, True])
def test_the_one_thread_plan_lets_the_blocks_go_only_once_the_curves_are_made(replayed, monkeypatch, large):
    """From LARGE_RUN_REQUESTS (one sections' thread beside the curves) evidence.py calls
    store/duckdb_core.py `release_cached_blocks` after each section computed once the size curves
    are made, and once all are done (issue 41: a 1M close's peak); never while the curves' thread
    may run a query (the instance's limit is a megabyte for that statement), never in the four
    threads' plan. The sections are the same either way."""
    calls = []
    curving = []
    real_curves, real_release = E.size_curves, E.release_cached_blocks

    def curves(con, run):
        curving.append(True)
        try:
            return real_curves(con, run)
        finally:
            curving.clear()

    def release(con):
        calls.append(bool(curving))
        return real_release(con)

    monkeypatch.setattr(E, "size_curves", curves)
    monkeypatch.setattr(E, "release_cached_blocks", release)
    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        got = E.compute_evidence(con, run)
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 10**12)
        calls_then = list(calls)
        alone = E.compute_evidence(con, run)
    assert got == alone
    if large:
        assert calls_then and not any(calls_then)  # at least the last one; none during the curves
        assert len(calls_then) <= len(E.LARGE_RUN_THREADS[0]) + 1
    else:
        assert calls_then == []
    assert calls == calls_then  # the four threads' plan: none


@pytest.mark.parametrize("curves_fail", [False, True])
def test_the_one_thread_plan_starts_its_large_sections_once_the_curves_are_over(replayed, monkeypatch, curves_fail):
    """From LARGE_RUN_REQUESTS the sections' one thread runs its first LARGE_RUN_BESIDE_CURVES
    sections (the small ones) beside the size curves and the others (the story, the context, the
    session pauses, the summary: hundreds of MB each at 1M requests) only once the curves are
    made, or have failed (issue 41, session 24: the story beside the curves' pass was a 1M close's
    peak). The sections are the ones computed alone; a failure of the curves is raised and
    nothing waits for ever."""
    import threading
    import time

    log: list = []
    lock = threading.Lock()

    def note(what):
        with lock:
            log.append(what)

    def wrapped(name, real):
        def call(*args, **kwargs):
            note(("start", name))
            return real(*args, **kwargs)
        return call

    real_curves = E.size_curves

    def curves(con, run):
        note(("start", "curves"))
        try:
            time.sleep(0.3)  # the small sections' time to run beside them
            if curves_fail:
                raise RuntimeError("the curves failed")
            return real_curves(con, run)
        finally:
            note(("end", "curves"))

    monkeypatch.setattr(E, "size_curves", curves)
    sections = {"run_totals": "totals", "session_summary": "session_summary", "rank_summary": "rank_summary",
                "run_miss_reasons": "miss_reasons", "run_story": "story", "compute_run_context": "context",
                "session_pauses": "sessions", "compute_run_summary": "summary"}
    for attr, name in sections.items():
        monkeypatch.setattr(E, attr, wrapped(name, getattr(E, attr)))
    monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        if curves_fail:
            with pytest.raises(RuntimeError, match="the curves failed"):
                E.compute_evidence(con, run)
        else:
            got = E.compute_evidence(con, run)
            monkeypatch.undo()
            alone = E.compute_evidence(con, run)
            assert got == alone
    assert not [t for t in threading.enumerate() if t.name == "tierdiag-evidence"]
    over = log.index(("end", "curves"))
    plan = E.LARGE_RUN_THREADS[0]
    started = [what[1] for what in log if what[0] == "start" and what[1] != "curves"]
    assert started == list(plan)  # in the plan's order, each once (the miss reasons: the context's too)
    for name in plan[E.LARGE_RUN_BESIDE_CURVES:]:
        assert log.index(("start", name)) > over, name
    assert log.index(("start", plan[0])) < over  # the small ones beside the curves (0.3 s of them)


def test_the_one_thread_plans_small_sections_come_first():
    """LARGE_RUN_BESIDE_CURVES counts sections of the one-thread plan, and none of those it runs
    beside the curves is one of the large ones (issue 41: the story, the context, the session
    pauses, the summary; the story before the context and the summary, which wait for it)."""
    plan = E.LARGE_RUN_THREADS[0]
    assert len(E.LARGE_RUN_THREADS) == 1 and 0 <= E.LARGE_RUN_BESIDE_CURVES <= len(plan)
    assert not {"story", "context", "sessions", "summary"} & set(plan[:E.LARGE_RUN_BESIDE_CURVES])
    assert plan.index("story") < min(plan.index("context"), plan.index("summary"))


def _lookup_and_row(con, run_id):
    lookup = con.execute("SELECT bucket, req_id, seq FROM request_lookup WHERE run_id = ? ORDER BY rowid",
                         [run_id]).fetchall()
    row = con.execute("SELECT evidence_version, evidence_json FROM run_evidence WHERE run_id = ?", [run_id]).fetchall()
    return lookup, row


# "recycled": the first thread done with its sections (the one the lookup is written on) has ended
# before the last thread starts, which then runs the miss reasons (the context waits for them): a
# schedule a loaded machine makes (issue 41, session 35: 1 failure in ~220 runs), where the new
# thread may be given the ended one's `threading.get_ident()` (Python recycles them), so threads
# are told apart by their Thread objects.
@pytest.mark.parametrize("large,schedule", [(False, "as it comes"), (True, "as it comes"), (False, "recycled")])
def test_the_close_writes_the_request_lookup_beside_the_sections_in_the_rows_transaction(replayed, tmp_path,
                                                                                         monkeypatch, large, schedule):
    """The writer's close (`record_run_evidence` with the writer's connection) writes the request
    lookup's rows (a hash and a sort of every request id) on a cursor of its own while the
    sections' threads run, on the first thread to be done with its sections (issue 41: off the
    close's serial tail, where on the curves' thread after the curves it was ~6 ms of it), and
    the evidence's row then joins that transaction: the same rows, in
    the same order, as the lookup written after the sections (`replace_run_evidence`), and
    nothing left open (the close's checkpoint follows). From LARGE_RUN_REQUESTS (the plan that
    bounds the close's peak) the lookup comes after the sections, as before, in the same way."""
    import threading
    from contextlib import contextmanager

    db = _copy(replayed, tmp_path, "beside.duckdb")
    order = []  # (what, the Thread that did it): an ident may be a thread's that has ended
    real_curves, real_begin = E.size_curves, E.begin_run_evidence

    def curves(con, run):
        out = real_curves(con, run)
        order.append(("curves", threading.current_thread()))
        return out

    threads_then = []
    lookup_on = []  # the Thread the lookup was begun on
    looked_up = threading.Event()

    def begin(con, run_id):
        order.append(("lookup", threading.current_thread()))
        threads_then.append(con.execute("SELECT current_setting('threads')").fetchone()[0])
        out = real_begin(con, run_id)
        lookup_on.append(threading.current_thread())
        looked_up.set()
        return out

    sections_done = []
    real_miss = E.run_miss_reasons  # the last section of every plan's last thread
    real_pauses, real_story, real_context = E.session_pauses, E.run_story, E.compute_run_context
    real_ranks = E.rank_summary
    missed = threading.Event()

    def pauses(con, run):
        out = real_pauses(con, run)
        order.append(("pauses", threading.current_thread()))
        return out

    def story(*a, **k):
        out = real_story(*a, **k)
        order.append(("story", threading.current_thread()))
        return out

    def context(*a, **k):
        if schedule == "recycled":  # the miss reasons on the last thread, not asked for here first
            assert missed.wait(60)
        out = real_context(*a, **k)
        order.append(("context", threading.current_thread()))
        return out

    def miss(con, run_id, **given):  # given: their sums, the run's scan's (read/run_scan.py)
        out = real_miss(con, run_id, **given)
        sections_done.append([what for what, _ in order])  # what had been done by then
        order.append(("miss", threading.current_thread()))
        missed.set()
        return out

    def ranks(con, run):  # the rest's thread's last section: seen done where another made the miss reasons
        out = real_ranks(con, run)
        order.append(("ranks", threading.current_thread()))
        return out

    monkeypatch.setattr(E, "size_curves", curves)
    monkeypatch.setattr(E, "begin_run_evidence", begin)
    monkeypatch.setattr(E, "run_miss_reasons", miss)
    monkeypatch.setattr(E, "session_pauses", pauses)
    monkeypatch.setattr(E, "run_story", story)
    monkeypatch.setattr(E, "compute_run_context", context)
    monkeypatch.setattr(E, "rank_summary", ranks)
    if schedule == "recycled":
        real_cursor, cursors = E.second_cursor, []

        @contextmanager
        def cursor(con, catalog=None):
            # the lookup's cursor, then one per thread, each started once its cursor is made: the
            # last thread's waits for the thread the lookup was written on to have ended
            cursors.append(con)
            if len(cursors) == 1 + len(E.SMALL_RUN_THREADS):  # (the caller, blocked here, is not that thread)
                assert looked_up.wait(60)
                (ended,) = lookup_on
                ended.join(60)
                assert not ended.is_alive()
            with real_cursor(con, catalog) as cur:
                yield cur

        monkeypatch.setattr(E, "second_cursor", cursor)
    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with duckdb.connect(str(db)) as con:
        run_id = resolve_run(con, None).run_id
        con.execute("DELETE FROM run_evidence")
        con.execute("DELETE FROM request_lookup")
        had = con.execute("SELECT current_setting('threads')").fetchone()[0]
        assert E.record_run_evidence(db, run_id, con=con) is None
        caller = threading.current_thread()
        assert [what for what, _ in order].count("lookup") == 1
        if large:
            assert [o for o in order if o[0] in ("curves", "lookup")] == [("curves", caller), ("lookup", caller)]
            assert "lookup" not in sections_done[0], "the lookup was written beside a large run's sections"
            # alone then (the sections done): on the engine's idle core too, then back on one
            assert threads_then == [max(had, min(E.LOOKUP_THREADS, len(os.sched_getaffinity(0))))]
        else:  # on the first thread done with its sections (the caller's once the curves are made, or another)
            assert threads_then == [had]  # beside the sections' queries: as they are
            (thread,) = {t for what, t in order if what == "lookup"}
            mine = [what for what, t in order if t == thread]
            assert mine[-1] == "lookup" and len(mine) >= 2, order  # after that thread's sections
            if thread == caller:
                assert mine == ["curves", "lookup"]
            if schedule == "recycled":  # the schedule was the one asked for
                (last,) = {t for what, t in order if what == "miss"}
                assert thread is not caller and last is not thread and mine[-1] == "lookup", order
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == had  # as it was
        con.execute("CHECKPOINT")  # refused while any transaction is open
        beside = _lookup_and_row(con, run_id)
    monkeypatch.undo()
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM run_evidence")
        con.execute("DELETE FROM request_lookup")
        with open_store(replayed) as ro:
            sections = E.compute_evidence(ro, resolve_run(ro, run_id))
        E.write_evidence(con, run_id, sections)  # the lookup after the row, in one transaction, as before
        after = _lookup_and_row(con, run_id)
    assert len(beside[0]) == 200 and beside[0] == after[0]
    assert [v for v, _ in beside[1]] == [v for v, _ in after[1]]
    assert json.loads(beside[1][0][1]) == json.loads(after[1][0][1])


@pytest.mark.parametrize("failure", ["section", "row", "lookup", "threads", "start"])
def test_a_close_that_fails_after_the_lookup_began_stores_neither_and_leaves_nothing_open(
        replayed, tmp_path, monkeypatch, capsys, failure):
    """A section failing while the lookup's transaction is open (the section waits for it here),
    the evidence's row refused in it, the lookup's own write failing, (a large run's lookup, on
    two threads) the instance's threads not given back after it, or the last sections' thread not
    started (its cursor refused) while the others run, the lookup begun on one: one warning, no
    lookup rows and no evidence row (one transaction, rolled back), no section's thread left
    running, and the connection free for the close's checkpoint; the run's rows untouched."""
    import threading
    from contextlib import contextmanager

    db = _copy(replayed, tmp_path, f"fails-{failure}.duckdb")
    began = threading.Event()
    real_begin = E.begin_run_evidence

    def begin(con, run_id):
        if failure == "lookup":
            con.execute("BEGIN")
            E.rollback_run_evidence(con, run_id)
            raise duckdb.IOException("IO Error: No space left on device")
        real_begin(con, run_id)
        began.set()

    monkeypatch.setattr(E, "begin_run_evidence", begin)
    if failure == "section":
        def boom(con, run_id):
            assert began.wait(60)
            raise RuntimeError("the totals failed")
        monkeypatch.setattr(E, "run_totals", boom)
    elif failure == "row":
        monkeypatch.setattr(E, "EVIDENCE_VERSION", "not a number")
    elif failure == "threads":  # a large run's lookup on two threads, the instance's one not given back
        def refused(con, had):
            raise duckdb.InvalidInputException("Invalid Input Error: threads refused")
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
        monkeypatch.setattr(E, "alone_threads", lambda con, threads: 1)
        monkeypatch.setattr(E, "restore_threads", refused)
    elif failure == "start":  # issue 41, session 35: the threads started were left running, unjoined
        real_cursor, cursors = E.second_cursor, []

        @contextmanager
        def cursor(con, catalog=None):  # the lookup's, then one per thread: the last one's refused
            cursors.append(con)
            if len(cursors) == 1 + len(E.SMALL_RUN_THREADS):
                assert began.wait(60)
                raise duckdb.ConnectionException("Connection Error: no cursor for the last thread")
            with real_cursor(con, catalog) as cur:
                yield cur

        monkeypatch.setattr(E, "second_cursor", cursor)
    with duckdb.connect(str(db)) as con:
        run_id = resolve_run(con, None).run_id
        con.execute("DELETE FROM run_evidence")
        con.execute("DELETE FROM request_lookup")
        capsys.readouterr()
        msg = E.record_run_evidence(db, run_id, con=con)
        assert msg is not None and "recorded in full" in msg
        err = [line for line in capsys.readouterr().err.splitlines() if line]
        assert len(err) == 1 and err[0].startswith("tierdiag: warning: run "), err
        assert not [t for t in threading.enumerate() if t.name == "tierdiag-evidence"]
        con.execute("CHECKPOINT")  # refused while any transaction is open
        assert _lookup_and_row(con, run_id) == ([], [])
        assert con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0] == 200


def test_the_writer_process_preloads_what_a_stored_close_imports_and_no_more(replayed, tmp_path):
    """The writer process imports close.PRELOAD while the engine runs (issue 41: not in the close
    the replay waits for); the summary's reader is not among them: a close whose evidence is
    stored takes its closing numbers from the summary the evidence computed and never imports
    `diagnose.run.summary` (36 modules, ~23 ms of the writer's CPU beside the engine). Nor does
    the close import any other module of tierdiag than the trace's reader (which the writer
    process's read-ahead imports while the engine runs; here, with none, the size curves read the
    trace themselves) and the optional C extensions: the engine's rule sets, the claims, the lookup's writer were ~15-28 ms of
    the close's CPU (session 23)."""
    import subprocess
    import sys

    db = _copy(replayed, tmp_path, "preload.duckdb")
    code = ("import sys, duckdb\n"
            "from tierdiag.diagnose.run import close\n"
            "for m in close.PRELOAD: __import__(m)\n"
            "assert 'tierdiag.diagnose.run.summary' not in sys.modules, 'preloaded'\n"
            "con = duckdb.connect(sys.argv[1])\n"
            "run_id = con.execute('SELECT run_id FROM runs').fetchone()[0]\n"
            "before = set(sys.modules)\n"
            "numbers = close.after_commit(con, sys.argv[1], run_id, 'complete')\n"
            "assert numbers['span_ns'] > 0 and numbers['ttft_ns'] is not None, numbers\n"
            "assert 'tierdiag.diagnose.run.summary' not in sys.modules, 'imported by the close'\n"
            "read_ahead = ('tierdiag.trace', 'tierdiag.config', 'tierdiag.diagnose.run.live_curves',\n"
            "              'tierdiag.native')\n"  # the C extensions: optional, imported where used (~1 ms)
            "late = sorted(m for m in set(sys.modules) - before\n"
            "              if m.startswith('tierdiag') and not m.startswith(read_ahead))\n"
            "assert not late, late\n")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("story", ["counted", "no_recompute", "failed"])
def test_the_summarys_requests_by_cause_are_the_storys_counts(replayed, monkeypatch, large, story):
    """The close's summary takes its finished requests per primary cause from the run story's
    query, which reads every finished request's cause code (issue 41), instead of its own query
    (read/totals.py `requests_by_cause`): the same counts, so the same summary; where the story
    reads none (a store without per-batch recompute) or fails, the summary queries them as before
    (a failed story fails the evidence through the context, as before, not through a summary
    left waiting)."""
    from tierdiag.diagnose.read import totals as read_totals
    from tierdiag.diagnose.read.run_context import batch_recompute_sql
    from tierdiag.diagnose.run import numbers as N
    from tierdiag.diagnose.run.story import run_story

    if large:
        monkeypatch.setattr(E, "LARGE_RUN_REQUESTS", 1)
    with open_store(replayed) as con:
        run = resolve_run(con, None)
        queried = read_totals.requests_by_cause(con, run.run_id)
        counts: dict = {}
        assert run_story(con, run.run_id, batch_recompute_sql(con), cause_counts=counts) is not None
        assert counts == {k: v for k, v in queried.items() if k is not None}
        alone = compute_run_summary(con, run)
        assert len(counts) >= 2 and sum(counts.values()) == alone.num_finished  # causes of every finished one
        asked = []
        query = read_totals.requests_by_cause

        def count_queries(*args, **kwargs):
            asked.append(1)
            return query(*args, **kwargs)

        monkeypatch.setattr(N.read, "requests_by_cause", count_queries)
        if story == "no_recompute":
            monkeypatch.setattr(E, "batch_recompute_sql", lambda cur: None)
        if story == "failed":
            def boom(*args, **kwargs):
                raise RuntimeError("the story failed")

            monkeypatch.setattr(E, "run_story", boom)
            with pytest.raises(RuntimeError, match="the story failed"):
                E.compute_evidence(con, run)
            return
        made: dict = {}
        E.compute_evidence(con, run, computed=made)
    assert made["summary"] == alone
    assert asked == ([] if story == "counted" else [1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=len(CAUSES) - 1), max_size=300))
def test_counts_by_cause_is_a_count_of_the_codes(codes):
    """story.py `counts_by_cause`: each cause's requests among the codes (`cause_code_sql`'s: -1,
    a NULL cause, counted for none), only the causes present, as `requests_by_cause`'s rows."""
    from collections import Counter

    import numpy as np

    from tierdiag.diagnose.run.story import counts_by_cause

    want = {CAUSES[k]: n for k, n in Counter(codes).items() if k >= 0}
    assert counts_by_cause(np.asarray(codes, dtype=np.int8)) == want
    assert counts_by_cause(codes) == want


def _encode_reference(value):
    """stored.py `encode` before its leaves' fast path (issue 41): the generic order, every value
    one call."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {S._DC: type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = _encode_reference(getattr(value, f.name))
        return out
    if isinstance(value, tuple):
        return {S._TUPLE: [_encode_reference(v) for v in value]}
    if isinstance(value, list):
        return [_encode_reference(v) for v in value]
    if isinstance(value, dict):
        if S._DC in value or S._TUPLE in value or not all(isinstance(k, str) for k in value):
            raise TypeError(f"a dict that would not read back as itself: keys {list(value)[:4]}")
        return {k: _encode_reference(v) for k, v in value.items()}
    if value is None or type(value) in (bool, int, float, str):
        return value
    raise TypeError(f"{type(value).__name__} is not stored as itself in JSON: {value!r}")


class _Named(tuple):
    """A tuple subclass (as a NamedTuple is): the generic path's, not the plain tuple's."""


@dataclasses.dataclass(frozen=True)
class _Point:
    size: object
    tokens: object


def _hostile_leaves():
    import enum

    import numpy as np

    class Kind(str, enum.Enum):
        A = "a"

    return st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True), st.text(alphabet=st.characters(), max_size=8),
        st.sampled_from([np.int64(3), np.float64(0.5), np.bool_(True), Kind.A, b"\x00bytes", 1j]))


def _nested(leaves):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.lists(inner, max_size=5).map(tuple),
        st.lists(inner, max_size=3).map(_Named),
        st.lists(st.tuples(inner, inner), max_size=5).map(tuple),  # pairs: encode's steps' fast path
        st.lists(st.tuples(leaves, leaves), min_size=1, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.sampled_from([S._DC, S._TUPLE]), st.integers()),
                        inner, max_size=3),
        st.builds(_Point, inner, inner)), max_leaves=30)


def _outcome(f, value):
    try:
        return ("value", f(value))
    except TypeError as exc:
        return ("TypeError", str(exc))


@settings(max_examples=400, deadline=None)
@given(_nested(_hostile_leaves()))
def test_encode_is_the_generic_encoding_of_every_value(value):
    """stored.py `encode`'s fast path for leaves and plain tuples and lists gives what the generic
    order gives, value for value, and refuses what it refuses with the same message (numpy
    scalars, enums, bytes, complex, dicts that would not read back), for hostile nestings:
    tuple subclasses, dataclasses, the tags as keys, non-string keys, NaN and huge ints."""
    assert _outcome(S.encode, value) == _outcome(_encode_reference, value)


def test_the_stored_size_curves_encode_as_before(replayed):
    """The real section the fast path is for (thousands of (size, tokens) steps): the same JSON."""
    with open_store(replayed) as con:
        curves = size_curves(con, resolve_run(con, None))
    assert curves is not None and any(c.steps for c in curves.curves)
    assert json.dumps(S.encode(curves)) == json.dumps(_encode_reference(curves))
