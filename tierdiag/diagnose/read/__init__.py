"""The read model of a run: what diagnose and report ask of a recorded run, typed.

    run.py       Run: the runs row parsed once (kind, rule set, ranks, config), `parse(run)`
    kind.py      one view per run kind (replay, observed): the one place the kind is branched on
    requests.py  RequestRow: one `requests` row with its columns as attributes
    queries.py   the named queries over a run's rows (`queries.request(con, run, req_id)`, ...)
    totals.py    summary's totals (tokens, times, classes, reasons, transfers, evictions, causes)
    series.py    the report's time series and distributions (numpy arrays from DuckDB)
    compare.py   runs side by side: requests paired by id, busy time, TTFTs by class
    sessions.py  session turns: pauses, ended sessions, a turn's evictions, the pool's columns
    ranks.py     a --dp run: per-rank totals, routes, slow counts by rank, routing losses
    curves.py    the size curves' requests and found tokens
    ids.py       ids a command hands on (a `next:` hint's request, a kept store's sweeps)

Nothing here imports torch or pandas; only series.py imports numpy (the report's arrays), so
explain and summary start from the rest.
"""
