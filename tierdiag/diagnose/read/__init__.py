"""The read model of a run: what diagnose and report ask of a recorded run, typed.

    run.py       Run: the runs row parsed once (kind, rule set, ranks, config), `parse(run)`
    kind.py      one view per run kind (replay, observed): the one place the kind is branched on
    requests.py  RequestRow: one `requests` row with its columns as attributes
    queries.py   the named queries over a run's requests (`queries.request(con, run, req_id)`,
                 `queries.slowest`, `run_span_ns`, `outcome_rows`, ...)
    run_context.py       the run-wide sums and column sets the run's evidence is computed from
    request_context.py   one request's surroundings: its rank's batches and requests around its wait
    request_steps.py     explain's steps: the request's transfers and evictions, the run around it
    waiting.py           what a request's prefix lost while it waited (and its SQL fragments)
    observed.py          an imported run's own numbers, paired with its twin replay's
    advice.py            what advice verification reads (headline numbers, advise's replays)
    rows.py              how results come back (fetch_dicts, fetch_one), schema checks

Every SQL text a reader runs lives here (tests/test_read_model.py); the store layer keeps the
write side's.

Nothing here imports torch, pandas or numpy: explain and summary start from it.
"""
