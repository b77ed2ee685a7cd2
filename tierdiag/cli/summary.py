"""`tierdiag summary`: token-weighted tier split, TTFT by class, load-backs, evictions, causes."""

from __future__ import annotations

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, out, print_json
from tierdiag.store.reader import open_store, resolve_run


def summary(db: DbOpt = DEFAULT_DB_PATH, run: RunOpt = None, json_: JsonOpt = False) -> None:
    """One run at a glance: tokens by tier (not request counts), TTFT percentiles, load-backs, evictions."""
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        # An imported run has only what the server reported: diagnose answers for its kind.
        from tierdiag.diagnose.views import summarize

        result = summarize(con, info)
    from tierdiag.config.profile import provenance_line

    clock = provenance_line(info.config.get("profile_source"))  # replayed with a calibrate profile
    if json_:  # no Rich for JSON
        from tierdiag.engine.rules import recorded_rules

        # The SGLang release whose rules the replay followed (0.5.9 for one recorded before rule
        # sets); null for an imported run, whose numbers are the server's.
        rules = recorded_rules(info.config) if info.kind != "observed" else None
        from tierdiag.diagnose.compare import run_kv_memory

        memory = run_kv_memory(info)  # per rank and in all (each rank its own device + host pools)
        print_json({**result.to_json(), "sglang_rules": rules,
                    "kv_memory": None if memory is None else memory.to_json(),
                    **({"clock": info.config["profile_source"]} if clock else {})})
        return
    from tierdiag.report.views import render

    render(result, out, run=info)
    if clock:
        out.print(clock, markup=False, highlight=False)

