"""The read model of a run: what diagnose and report ask of a recorded run, typed.

    run.py       Run: the runs row parsed once (kind, rule set, ranks, config), `parse(run)`
    kind.py      one view per run kind (replay, observed): the one place the kind is branched on
    requests.py  RequestRow: one `requests` row with its columns as attributes
    queries.py   the named queries over a run's requests (`queries.request(con, run, req_id)`,
                 `queries.slowest`, `run_span_ns`, `outcome_rows`, ...)
    totals.py    summary's totals (tokens, times, classes, reasons, transfers, evictions, causes)
    series.py    the report's time series and distributions (numpy arrays from DuckDB)
    compare.py   runs side by side: requests paired by id, busy time, TTFTs by class
    sessions.py  session turns: pauses, ended sessions, a turn's evictions, the pool's columns
    ranks.py     a --dp run: per-rank totals, routes, slow counts by rank, routing losses
    curves.py    the size curves' requests and found tokens
    ids.py       ids a command hands on (a `next:` hint's request, a kept store's sweeps)
    run_context.py       the run-wide sums and column sets the run's evidence is computed from
    folded.py            the store's side of the close's check of the rows folded while recording
    request_context.py   one request's surroundings: its rank's batches and requests around its wait
    request_steps.py     explain's steps: the request's transfers and evictions, the run around it
    waiting.py           what a request's prefix lost while it waited (and its SQL fragments)
    observed.py          an imported run's own numbers, paired with its twin replay's
    advice.py            what advice verification reads (headline numbers, advise's replays)
    rows.py              dict rows (fetch_dicts), schema checks, a second cursor
    quantile.py  The one percentile definition every view uses: nearest rank.
    query.py     Small helpers shared by summary / slow / explain / observed over what they ...
    sql.py       The two row sets every view counts over, written once.

Every SQL text a reader runs lives here (tests/test_read_model.py); the store layer keeps the
write side's.

Nothing here imports torch or pandas; only series.py imports numpy (the report's arrays), so
explain and summary start from the rest.
"""
