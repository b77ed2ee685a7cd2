"""`tierdiag summary`: token-weighted tier split, TTFT by class, load-backs, evictions, causes."""

from __future__ import annotations

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, out, print_json
from tierdiag.store.reader import open_store, resolve_run


def summary(db: DbOpt = DEFAULT_DB_PATH, run: RunOpt = None, json_: JsonOpt = False) -> None:
    """One run at a glance: tokens by tier (not request counts), TTFT percentiles, load-backs, evictions."""
    # Imported here, not at the top: main.py imports every command module to register it.
    from tierdiag.diagnose.summary import run_summary

    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        if info.kind == "observed":  # imported from a server: only what it reported (diagnose/observed.py)
            from tierdiag.diagnose.observed import observed_summary as run_summary  # noqa: F811
        result = run_summary(con, info)
    from tierdiag.config.profile import provenance_line

    clock = provenance_line(info.config.get("profile_source"))  # replayed with a calibrate profile
    if json_:  # no Rich for JSON
        print_json({**result.to_json(), **({"clock": info.config["profile_source"]} if clock else {})})
        return

    if info.kind == "observed":  # the server's pools are not in its export
        from tierdiag.report.observed import render_observed_summary

        render_observed_summary(result, out)
        return
    from tierdiag.report.terminal import render_summary

    pools = {tier: info.config[f"{tier}_tokens"] for tier in ("device", "host", "storage")
             if isinstance(info.config.get(f"{tier}_tokens"), int) and info.config[f"{tier}_tokens"] > 0}
    kv = info.data_plane.get("kv_bytes_per_token")
    render_summary(result, out, pools=pools, kv_bytes_per_token=kv if isinstance(kv, int) else None)
    if clock:
        out.print(clock, markup=False, highlight=False)
