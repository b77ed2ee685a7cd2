"""The miss reason prefetch_lost on the read side (engine/miss.py; issue 43 follow-up): summary's
reason list and explain's sentences say it for a run that has it, and a run recorded before its
column (schema v6: those tokens were in beyond_storage) still reads, the column NULL, nothing said
about it; a replay into such a store adds the column and moves it to the current schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tierdiag.diagnose.read.waiting import gone_tokens_sql
from tierdiag.diagnose.request.claims import recomputed_split
from tierdiag.diagnose.run.miss_reasons import (IN_BATCH_SHARE, PREFETCH_LOST_SHARE, in_batch_claim_text,
                                                prefetch_lost_claim_text)
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.schema import MISS_REASONS, SCHEMA_VERSION, columns_missing_in

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

LOST_SAID = "read from storage by its prefetch, then evicted from host"
# The claims test's wait_complete run (tests/diagnose/test_claims.py prefetch_lost_run)
POOLS = ["--model", "llama3-8b", "--gpu", "h100", "--device-tokens", "65536", "--host-tokens", "65536",
         "--storage-tokens", "1048576", "--prefetch-policy", "wait_complete"]


def _cli(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def lost_db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prefetch_lost")
    trace = folder / "mixed.jsonl"
    _cli("synth", trace, "--requests", "300", "--rate", "8")
    db = folder / "lost.duckdb"
    _cli("replay", trace, "--db", db, "--run-name", "lost", *POOLS)
    return db


def _most_lost(db: Path) -> tuple[str, int]:
    with open_store(db) as con:
        return con.execute("SELECT req_id, miss_prefetch_lost_tokens FROM requests "
                           "ORDER BY miss_prefetch_lost_tokens DESC NULLS LAST, seq LIMIT 1").fetchone()


def test_summary_and_explain_name_the_prefetch_lost(lost_db):
    req, lost = _most_lost(lost_db)
    assert lost > 0
    s = json.loads(_cli("summary", "--db", lost_db, "--json"))
    assert set(s["miss_reasons"]) == set(MISS_REASONS)
    with open_store(lost_db) as con:
        total = con.execute("SELECT sum(miss_prefetch_lost_tokens) FROM requests").fetchone()[0]
    assert s["miss_reasons"]["prefetch_lost"] == total > 0
    out = _cli("summary", "--db", lost_db)
    assert f"prefetch lost {total:,}" in " ".join(out.split())
    e = json.loads(_cli("explain", req, "--db", lost_db, "--json"))
    step1 = e["steps"][0]["finding"]
    assert f"{lost:,} were {LOST_SAID} before it was scheduled" in step1
    assert "host_tokens" in step1  # the remedy: host room (no prefetch policy protects a finished read)
    assert f"{lost:,} {LOST_SAID} before it was scheduled" in e["steps"][3]["finding"]
    # under PREFETCH_LOST_SHARE of the input here: the run's diagnosis does not name it
    assert total < PREFETCH_LOST_SHARE * s["tokens"]["input_tokens"]
    assert all(c["name"] != "prefetch_lost" for c in s["diagnosis"]["claims"])


def test_a_run_recorded_before_the_column_reads_and_a_replay_adds_it(lost_db, tmp_path):
    db = tmp_path / "v6.duckdb"
    db.write_bytes(lost_db.read_bytes())
    assert columns_missing_in(6) == {"requests": ("miss_prefetch_lost_tokens",)}
    with duckdb.connect(str(db)) as con:  # as tierdiag wrote it before v7: those tokens were beyond_storage
        con.execute("UPDATE requests SET miss_beyond_storage_tokens = miss_beyond_storage_tokens "
                    "+ miss_prefetch_lost_tokens WHERE miss_prefetch_lost_tokens IS NOT NULL")
        con.execute("ALTER TABLE requests DROP COLUMN miss_prefetch_lost_tokens")
        con.execute("DELETE FROM run_evidence")  # the evidence a v6 close stored had nine reasons: recomputed
        con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    req, lost = _most_lost(lost_db)
    s = json.loads(_cli("summary", "--db", db, "--json"))
    assert s["miss_reasons"]["prefetch_lost"] == 0 and s["miss_reasons"]["beyond_storage"] > 0
    e = json.loads(_cli("explain", req, "--db", db, "--json"))
    assert all(LOST_SAID not in st["finding"] for st in e["steps"]) and LOST_SAID not in e["verdict"]
    with open_store(db) as con:  # read as v7: the column shown NULL
        assert con.execute("SELECT count(*) FROM requests WHERE miss_prefetch_lost_tokens IS NOT NULL").fetchone() \
            == (0,)
    # A replay into it adds the column (NULL for the old run) and moves it to the current version.
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 129, "output_length": 4, "hash_ids": [1]})
                     + "\n")
    _cli("replay", trace, "--db", db, "--run-name", "new", "--model", "tiny", "--gpu", "h100")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]
        got = dict(con.execute("SELECT r.name, count(q.miss_prefetch_lost_tokens) FROM requests q "
                               "JOIN runs r USING (run_id) GROUP BY 1").fetchall())
    assert got == {"lost": 0, "new": 1}
    with open_store(db) as con:
        assert resolve_run(con, "lost").name == "lost"


_TOKENS = st.one_of(st.none(), st.integers(-10**9, 10**9))


@settings(max_examples=60, deadline=None)
@given(row=st.fixed_dictionaries({
    "recomputed_tokens": _TOKENS, "loadback_skipped_tokens": _TOKENS, "storage_match_tokens": _TOKENS,
    "storage_hit_tokens": _TOKENS, "miss_prefetch_lost_tokens": _TOKENS,
    "loadback_skipped_reason": st.sampled_from([None, "below_threshold", "device_full"]),
    "storage_skipped_reason": st.sampled_from([None, "prefetch_incomplete", "host_full", "rate_limited"]),
    "dp_rank": st.sampled_from([None, 0, 1]), "best_rank": st.sampled_from([None, 0, 1]),
    "best_rank_device_tokens": _TOKENS, "best_rank_host_tokens": _TOKENS,
    "arrival_device_tokens": _TOKENS, "arrival_host_tokens": _TOKENS}))
def test_the_recomputed_split_and_its_sql_agree_on_hostile_rows(row):
    """claims.recomputed_split (explain's sentences) and waiting.gone_tokens_sql (the run's 'gone'
    tokens, an older store's lost-while-waiting) split a row's recomputed tokens the same way, the
    prefetch's loss (miss_prefetch_lost_tokens, NULL in older runs) taken out of 'gone'; the parts
    sum to it, and none is negative on a row of non-negative counts."""
    skipped, read_lost, unused, routed, gone = recomputed_split(row)
    rec = row["recomputed_tokens"] or 0
    assert skipped + read_lost + unused + routed + gone == rec
    assert read_lost <= max(row["miss_prefetch_lost_tokens"] or 0, 0)
    if all((v or 0) >= 0 for k, v in row.items() if k.endswith("_tokens")):  # a row the engine can write
        assert min(skipped, read_lost, unused, routed, gone) >= 0
    cols = ", ".join(f"?::{'VARCHAR' if k.endswith('_reason') else 'BIGINT'} AS {k}" for k in row)
    with duckdb.connect() as con:
        sql = con.execute(f"SELECT {gone_tokens_sql('q')} FROM (SELECT {cols}) q", list(row.values())).fetchone()[0]
    assert sql == gone


# Hostile pairs pinned (Hypothesis found the first): a negative pair's ratio is positive, and
# "-1 tokens (100 % of input)" was printed; zero input; a negative count of a positive input.
HOSTILE_PAIRS = [(-1, -1), (-5, -10), (0, 0), (0, 10), (5, 0), (-5, 10), (5, -10), (1, 1)]


@settings(max_examples=60, deadline=None)
@given(reasons=st.dictionaries(st.sampled_from(MISS_REASONS), st.integers(-10**12, 10**12)),
       input_tokens=st.integers(-10, 10**12))
@example(reasons={"prefetch_lost": -1}, input_tokens=-1)
@example(reasons={"prefetch_lost": 0}, input_tokens=0)
@example(reasons={"prefetch_lost": -5}, input_tokens=10)
@example(reasons={"prefetch_lost": 5}, input_tokens=0)
@example(reasons={"prefetch_lost": 5}, input_tokens=-10)
def test_the_runs_prefetch_lost_sentence_only_at_its_share(reasons, input_tokens):
    """The run's claim: said with its own number exactly where prefetch_lost holds at least
    PREFETCH_LOST_SHARE of a positive input, on hostile sums (negative, zero, missing)."""
    text = prefetch_lost_claim_text(reasons, input_tokens)
    n = reasons.get("prefetch_lost", 0)
    due = n > 0 and input_tokens > 0 and n / input_tokens >= PREFETCH_LOST_SHARE
    assert (text is not None) == due
    if text is not None:
        assert text.startswith(f"{n:,} tokens (")


@pytest.mark.parametrize(("n", "input_tokens"), HOSTILE_PAIRS)
@pytest.mark.parametrize(("fn", "reason", "at_least"), [
    (prefetch_lost_claim_text, "prefetch_lost", PREFETCH_LOST_SHARE),
    (in_batch_claim_text, "shared_in_batch", IN_BATCH_SHARE)])
def test_no_run_sentence_from_negative_or_zero_counts(fn, reason, at_least, n, input_tokens):
    """Both run sentences over a share of input (miss_reasons.py) need a positive count of a
    positive input: -1 of -1 is a ratio of 1, not "100 % of input"."""
    text = fn({reason: n}, input_tokens)
    assert (text is not None) == (n > 0 and input_tokens > 0 and n / input_tokens >= at_least)
    if text is not None:
        assert text.startswith(f"{n:,} tokens (")


@settings(max_examples=60, deadline=None)
@given(reasons=st.dictionaries(st.sampled_from(MISS_REASONS), st.integers(-10**12, 10**12)),
       input_tokens=st.integers(-10, 10**12))
@example(reasons={"shared_in_batch": -1}, input_tokens=-1)
@example(reasons={"shared_in_batch": 0}, input_tokens=0)
def test_the_runs_in_batch_sentence_only_at_its_share(reasons, input_tokens):
    """The in-batch sentence keeps the same rule on hostile sums."""
    text = in_batch_claim_text(reasons, input_tokens)
    n = reasons.get("shared_in_batch", 0)
    assert (text is not None) == (n > 0 and input_tokens > 0 and n / input_tokens >= IN_BATCH_SHARE)
    if text is not None:
        assert text.startswith(f"{n:,} tokens (")
