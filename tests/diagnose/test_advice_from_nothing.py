"""Advice from nothing (issue 32): a rule fires only on its threshold of a KNOWN quantity.

A run whose every request was rejected has no finished request: nothing was matched in storage,
dropped, deleted or recomputed, and "0 tokens (- of input)" is no reason to change anything. An
observed run (imported from SGLang) has no recompute column at all (NULL): "0 % of input tokens
were recomputed" would be a number the server never reported.
"""

from __future__ import annotations

from tests.diagnose.conftest import CONFIG, MS, RunBuilder
from tests.importers.sglang_export import record, write_export
from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run


def test_a_run_of_only_rejected_requests_gets_no_option_change(tmp_path):
    b = RunBuilder(tmp_path / "runs.duckdb", config={**CONFIG, "storage_tokens": 0, "prefetch_policy": "best_effort",
                                                     "write_policy": "write_back"})
    for i in range(3):
        b.rejected(f"r{i}", arrival_ns=i * MS, input_tokens=9000, reason="larger than the device pool")
    b.write()
    with open_store(b.path) as con:
        run = resolve_run(con, b.run_id)
        ctx = run_context(con, run)
        advice = propose(ctx)
        diagnosis = run_summary(con, run).diagnosis
    assert ctx.losses.input_tokens == 0 and ctx.losses.recomputed_tokens is None
    assert [a.option for a in advice] == [None]  # nothing to set: not prefetch_policy, not write_policy
    assert "0 %" not in advice[0].reason and "not known" in advice[0].reason
    assert "no request finished" in advice[0].reason
    assert [a.option for a in diagnosis.advice] == [None]


def test_an_observed_run_without_recompute_numbers_says_so(tmp_path):
    db = tmp_path / "runs.duckdb"
    write_export(tmp_path / "export", "20251201_09", [
        record("p", prompt=1024, device=512, host=256, arrival_s=0.0, queue_s=0.010, ttft_s=0.100),
        record("q", prompt=1024, arrival_s=1.0, queue_s=0.040, ttft_s=0.050),
    ])
    run_id = import_sglang([tmp_path / "export"], db=db, run_name="prod").run_id
    with open_store(db) as con:
        ctx = run_context(con, resolve_run(con, run_id))
    # SGLang reports no recompute: unknown, not 0.
    assert ctx.losses.input_tokens == 2048 and ctx.losses.recomputed_tokens is None
    assert ctx.losses.recomputed_share is None and ctx.losses.lost_tokens is None
    advice = propose(ctx)
    assert [a.option for a in advice] == [None]
    assert "0 %" not in advice[0].reason and "recomputed is not known" in advice[0].reason


def test_a_rule_still_fires_on_its_threshold_of_a_known_quantity(planted):
    # The planted run (conftest) holds real losses: the guard must not silence them.
    with open_store(planted.path) as con:
        ctx = run_context(con, resolve_run(con, planted.run_id))
    assert ctx.losses.recomputed_tokens and ctx.losses.input_tokens
    assert propose(ctx)  # at least the "nothing to change" item, with a known share
    assert all("not known" not in a.reason for a in propose(ctx))
