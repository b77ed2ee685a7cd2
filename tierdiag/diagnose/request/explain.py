"""`explain`: the troubleshooting order (DESIGN.md §2) for one request, as a typed result.

Every request gets the same four steps, in this order, then the verdict::

    1 host_hit_length   where its tokens came from                       explain_steps.py
    2 prefix_indices    usable prefix vs. the device original
    3 load_back         bytes, time, bandwidth vs. peak, counterfactuals
    4 eviction          which evictions took its prefix, by whose allocation
    (session, routing, upgrade: where the request has one)                 sessions.py, routing.py, upgrade_step.py
    verdict             primary cause of the excess TTFT + plain words   explain_verdict.py

The result types are explain_result.py's; the run-wide numbers a request is compared with come
from facts.py (stored with the run at its close, else computed). Reads the run store only, a
handful of small queries filtered on run_id (+ req_id), so it answers in milliseconds on a
12k-request run.
"""

from __future__ import annotations

from dataclasses import replace

import duckdb

from tierdiag.diagnose.request import claims as C
from tierdiag.diagnose.run import run_claims as RC
from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.advice.verify import verified_advice
from tierdiag.diagnose.request.causes import TtftParts
from tierdiag.diagnose.request.context import queue_attribution, request_context
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.diagnose.request.explain_result import (  # noqa: F401 - explain's result types, for its callers
    Decomposition,
    EvictionEvidence,
    Explanation,
    HostHitEvidence,
    LoadBackEvidence,
    PrefixEvidence,
    Step,
)
from tierdiag.diagnose.request.explain_steps import (
    is_finished,
    run_vocabulary,
    step_eviction,
    step_host_hit,
    step_load_back,
    step_prefix,
)
from tierdiag.diagnose.request.explain_verdict import VerdictInputs, context_sentence, verdict
from tierdiag.diagnose.run.miss_reasons import miss_sentence, request_miss_reasons
from tierdiag.diagnose.run.facts import RunFacts, run_bounds  # noqa: F401 - run_bounds: slow's clock
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read.request_reads import RequestReads, has_previous_turn
from tierdiag.diagnose.read.run import parse
from tierdiag.diagnose.session.sessions import session_step
from tierdiag.diagnose.request.tokens import TokenSplit
from tierdiag.store.reader import RunInfo


def explain_request(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str, *,
                    run_ctx: RunContext | None = None, advice: tuple | None = None,
                    facts: RunFacts | None = None) -> Explanation:
    """Walk the troubleshooting order for `req_id` in `run`; NotFoundError if it is not there.

    `run_ctx` / `advice` / `facts`: the run's context, advice and RunFacts(con, run) when the
    caller already has them (the report explains several requests of one run; `facts` keeps the
    stored evidence decoded once, not once per request); computed here otherwise.
    """
    req_id = str(req_id)
    row = queries.request(con, run, req_id)
    # Its evictions and transfers, the run's prefill-busy time, its previous turn and the queue at
    # its arrival: read on another thread while the steps below read the rest (a 1M-request run's
    # largest reads; issue 41).
    reads = RequestReads(con, run, row, is_finished(row))
    try:
        return _explain(con, run, req_id, row, reads, run_ctx=run_ctx, advice=advice, facts=facts)
    finally:
        reads.close()


def _explain(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str, row, reads: RequestReads, *,
             run_ctx: RunContext | None, advice: tuple | None, facts: RunFacts | None) -> Explanation:
    tokens = TokenSplit.from_row(row)
    if facts is None:
        facts = RunFacts(con, run)
    totals = facts.totals()
    if run_ctx is None:
        run_ctx = facts.context(attribution=False)
    busy = run_ctx.prefill_busy_ns  # the run's busy time, summed at its close: no scan of its batches
    if type(busy) is int and busy >= 0:  # else (a hand-edited row) the batches are summed, as before
        reads.give("run_busy_ns", busy)
    bounds = totals.bounds
    finished = is_finished(row)
    ctx = request_context(con, run.run_id, row, bounds[0], reads.get, run.config) if finished else None
    attribution = queue_attribution(con, run.run_id, row) if finished else None
    vocab = run_vocabulary(run)  # the words of the SGLang release the run followed
    first = (step_host_hit(row, tokens, run, vocab), step_prefix(row, tokens, vocab),
             step_load_back(con, run, row, tokens, totals, reads.get("transfers")))
    # The evictions of its prefix, read once: step 4 lists them, the session step its pause's and wait's.
    evictions = reads.get("evictions")
    steps = first + (step_eviction(con, run, row, tokens, totals, evictions, reads.get("run_busy_ns")),)
    # Context in step 3 (the load-back rate around it) and the run's "why" in step 4.
    steps = (steps[0], steps[1], replace(steps[2], finding=steps[2].finding + context_sentence(ctx, row)),
             steps[3])
    why = RC.loss_why(run_ctx) if tokens.recomputed_tokens or tokens.host_tokens or tokens.storage_tokens else None
    if why:
        steps = steps[:3] + (replace(steps[3], finding=f"{steps[3].finding} For context, {why}."),)
    reasons = request_miss_reasons(row)  # why its computed tokens were not reused (miss_reasons.py)
    if reasons:
        steps = steps[:3] + (replace(steps[3], finding=f"{steps[3].finding} "
                                                       f"{miss_sentence(reasons, tokens.computed_tokens)}"),)
    session = session_step(con, run, row, bounds[0], len(steps) + 1, evictions,  # a turn with a predecessor
                           (reads.get("previous"),) if has_previous_turn(row) else None)
    if session is not None:
        steps += (session,)
    if parse(run).ranks > 1:  # a request of a data-parallel run (routing.py imported for one: ~4 ms)
        from tierdiag.diagnose.dp.routing import routing_step

        routing = routing_step(run, row, len(steps) + 1)
        if routing is not None:
            steps += (routing,)
    if run.sweep_id:  # only a sweep's run can be NEW's of an upgrade (`replay --sglang OLD,NEW`)
        # imported here: the upgrade's reading (comparison/upgrade*.py) was ~10 ms of every explain's start-up
        from tierdiag.diagnose.comparison.upgrade_step import upgrade_step

        upgrade = upgrade_step(con, run, req_id, len(steps) + 1)
        if upgrade is not None:
            steps += (upgrade,)
    parts = TtftParts.from_row(row) if finished else None
    cause = parts.primary_cause() if parts is not None else None
    headline, text, claims = verdict(VerdictInputs(
        row=row, tokens=tokens, parts=parts, cause=cause, steps=steps, context=ctx, attribution=attribution,
        run=run_ctx, threshold=run.config.get("load_back_threshold"),
        storage_tier=bool(run.config.get("storage_tokens"))))
    decomposition = None
    if parts is not None:
        decomposition = Decomposition(
            ttft_ns=parts.ttft_ns, ideal_ttft_ns=parts.ideal_ttft_ns, excess_ns=parts.excess_ns,
            queue_ns=parts.queue_ns, storage_wait_ns=parts.storage_wait_ns,
            loadback_exposed_ns=parts.loadback_exposed_ns, recompute_ns=parts.recompute_ns,
            compute_ns=parts.compute_ns)
    curves = facts.size_curves()  # the capacity rule sizes from their knees; sizing compares with them
    if advice is None:
        advice = propose(run_ctx, sessions=facts.session_pauses(), curves=curves)
    advice = verified_advice(con, run, advice, req_id, curves)
    evicted_by: tuple[str, ...] = steps[3].evidence.evicted_by  # type: ignore[union-attr]
    return Explanation(
        run_id=run.run_id, run_name=run.name, req_id=req_id,
        seq=row.seq, status=row.status or "finished", reject_reason=row.reject_reason,
        hit_class=row.hit_class,
        arrival_ns=int(row.arrival_ns) - bounds[0] if row.arrival_ns is not None else None,
        ttft_ns=row.ttft_ns,
        tokens=tokens, steps=steps, primary_cause=cause, headline=headline, verdict=text,
        decomposition=decomposition, ttft_if_device_resident_ns=row.ttft_if_device_resident_ns,
        recompute_instead_ns=row.recompute_instead_ns, evicted_by=evicted_by,
        ttft_if_never_evicted_ns=C.never_evicted_ns(row) if finished else None,
        context=replace(ctx, window_start_ns=ctx.window_start_ns - bounds[0]) if ctx is not None else None,
        queue_attribution=attribution, advice=tuple(advice), claims=claims, run_start_ns=bounds[0],
        sglang_rules=vocab.sglang_rules, vocabulary=dict(vocab.words),
    )
