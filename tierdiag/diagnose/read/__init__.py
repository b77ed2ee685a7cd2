"""The read model of a run: what diagnose and report ask of a recorded run, typed.

    run.py       Run: the runs row parsed once (kind, rule set, ranks, config), `parse(run)`
    kind.py      one view per run kind (replay, observed): the one place the kind is branched on
    requests.py  RequestRow: one `requests` row with its columns as attributes
    queries.py   the named queries over a run's rows (`queries.request(con, run, req_id)`, ...)

Nothing here imports torch, pandas or numpy: explain and summary start from it.
"""
