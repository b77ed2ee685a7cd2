"""In-batch sharing as a cause (issue 40), end to end on a planted workload: 8 fan-outs of 6
requests, each fan-out sharing a 32-page prefix, all arriving at one instant. Under fcfs each
prefill batch holds the requests of about one fan-out and every one of them computes the prefix
(it enters the cache when the batch ends, as in SGLang). The replay records it as a miss reason
(`shared_in_batch`), summary names it and advises what SGLang offers (lpm's in-batch prefix
caching, a smaller max_prefill_tokens), each confirmed by a replay; with every timestamp equal,
time_scale is never advised."""

from __future__ import annotations

import json
import re

import pytest

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.schema import MISS_COLUMNS, MISS_REASONS

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke  # noqa: E402

POOLS = {"model": "llama3-8b", "device_tokens": 262144, "host_tokens": 262144}


def _fanouts() -> Story:
    s = Story()
    for g in range(8):
        shared = s.fresh(32)
        for i in range(6):
            s.add(f"g{g}r{i}", 0, shared + s.fresh(2))
    return s


@pytest.fixture(scope="module")
def fanned(tmp_path_factory):
    return _fanouts().replay(tmp_path_factory.mktemp("fan"), POOLS)


def _p50_and_shared(db) -> tuple[int, int]:
    with open_store(db) as con:
        rid = resolve_run(con, None).run_id
        return con.execute("SELECT quantile_disc(ttft_ns, 0.5), sum(miss_shared_in_batch_tokens) FROM requests "
                           "WHERE run_id = ? AND status = 'finished'", [rid]).fetchone()


def test_shared_in_batch_is_recorded_named_and_advised(fanned, tmp_path):
    with open_store(fanned) as con:
        run = resolve_run(con, None)
        rid = run.run_id
        # Its own SQL: requests whose batch (first_batch_id) held an earlier request of the same fan-out.
        expected = con.execute(
            """SELECT sum(q.computed_tokens - 128) FROM requests q WHERE run_id = ? AND EXISTS (
                 SELECT 1 FROM requests o WHERE o.run_id = q.run_id AND o.first_batch_id = q.first_batch_id
                 AND o.seq < q.seq AND split_part(o.req_id, 'r', 1) = split_part(q.req_id, 'r', 1))""",
            [rid]).fetchone()[0]
        sums = con.execute(f"SELECT sum(computed_tokens), {', '.join(f'sum({c})' for c in MISS_COLUMNS)} "
                           f"FROM requests WHERE run_id = ?", [rid]).fetchone()
        summary = run_summary(con, run)
        advice = propose(run_context(con, run))
    reasons = dict(zip(MISS_REASONS, sums[1:]))
    assert sum(sums[1:]) == sums[0] and reasons["shared_in_batch"] == expected > 0
    assert summary.miss_reasons == reasons
    claim = next(c for c in summary.diagnosis.claims if c.name == "in_batch")
    m = re.match(r"([\d,]+) tokens \(([\d.]+) % of input\) were shared with requests in the same prefill batch",
                 claim.text)
    assert m is not None and int(m[1].replace(",", "")) == expected, claim.text
    kinds = {(a.kind, a.option) for a in advice}
    assert ("in_batch", "schedule_policy") in kinds and ("in_batch", "max_prefill_tokens") in kinds
    assert not any(a.option == "time_scale" for a in advice)  # every timestamp equal
    # Each in-batch change, replayed as a user would apply it: p50 TTFT lower and fewer tokens shared in batch.
    before = _p50_and_shared(fanned)
    for a in (a for a in advice if a.kind == "in_batch"):
        after = _p50_and_shared(_fanouts().replay(tmp_path / a.option, {**POOLS, **a.changes}))
        assert after[0] < before[0] and after[1] < before[1], (a.changes, before, after)


def test_summary_json_and_terminal_and_explain_name_the_reasons(fanned):
    j = json.loads(invoke("summary", "--db", str(fanned), "--json"))
    assert set(j["miss_reasons"]) == set(MISS_REASONS) and j["miss_reasons"]["shared_in_batch"] > 0
    text = " ".join(invoke("summary", "--db", str(fanned)).split())
    assert "computed tokens by why they were not reused: shared in batch" in text
    e = invoke("explain", "g0r5", "--db", str(fanned), "--json")
    step4 = json.loads(e[e.index("{"):])["steps"][3]["finding"]
    assert re.search(r"computed tokens, by why they were not reused: [\d,]+ shared with requests in the same prefill "
                     r"batch", step4), step4
