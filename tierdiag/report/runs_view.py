"""`tierdiag runs`: the runs of a store as a table (id, name, sweep, status, config, what was
recorded), the default run marked; the shared pieces (pool sizes, the rule-set line, tables,
plain cells) are terminal.py's."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.text import Text

from tierdiag.config.names import Tier
from tierdiag.diagnose.run.kv_memory import run_kv_memory
from tierdiag.report.run_lines import pool_sizes, rules_line
from tierdiag.report.terminal import new_table, plain
from tierdiag.report.ranks_view import deployment_line
from tierdiag.report.text import fmt_option
from tierdiag.units import fmt_bytes, fmt_tokens


# Shown in their own lines of `runs`' config cell (model/gpu, the pools, the rule set), so not again as options.
_RUNS_OWN_LINES = ("model", "gpu", "device_tokens", "host_tokens", "storage_tokens", "storage_dir", "sglang_rules",
                   "sglang_switched_back", "dp", "router")


def render_runs(infos: Sequence, console: Console, *, db_label: str,
                options: dict[str, dict] | None = None, default_run_id: str | None = None) -> None:
    """The runs of a store, newest last, as one table that fits 80 columns: a run's cells stack
    (id, name, sweep; kind, status; model/gpu, pools in tokens and GiB, then one line per option
    that differs from the defaults), so nothing is cut. Run ids are always whole: they are what
    `--run` takes.

    `options`: run id -> {option: value} that differ from the defaults, when the caller knows them.
    `default_run_id`: the run a command without --run reads, marked "(default)"."""
    from tierdiag.config.profile import provenance_line

    options = options or {}
    table = new_table(f"runs in {db_label}", show_lines=True)
    table.add_column("run (id, name, sweep)", overflow="fold", min_width=22)
    table.add_column("kind", no_wrap=True)
    table.add_column("requests", justify="right", no_wrap=True)
    table.add_column("config", overflow="fold")
    for r in infos:
        # Every cell is data (a crafted store can hold anything): never markup, controls escaped.
        run_cell = Text("\n").join([plain(r.run_id, "bold"), plain(r.name)]
                                    + ([plain(r.sweep_id, "dim")] if r.sweep_id else [])
                                    + ([plain("(default)", "green")] if r.run_id == default_run_id else []))
        # A run imported from a server's own export names its source, not a model preset of ours.
        config = ([f"imported from {r.config['source']}"] if "source" in r.config and "model" not in r.config
                  else [f"{r.config.get('model', '?')} on {r.config.get('gpu', '?')}"])
        memory = run_kv_memory(r)
        each = memory is not None and memory.ranks > 1
        config += [f"{tier} {fmt_tokens(size['tokens'])}" + (f" ({fmt_bytes(size['bytes'])})" if size["bytes"] else "")
                   + (" per rank" if each and tier != Tier.STORAGE else "")
                   for tier, size in pool_sizes(r.config, r.data_plane).items()]
        config += [f"KV memory {memory.words()}"] if each else []
        rules = rules_line(r)
        config += [rules] if rules else []
        ranks = deployment_line(r)  # "4 ranks · router cache_aware"; a run of one rank: none
        config += [ranks] if ranks else []
        config += [f"{k}={fmt_option(v)}" for k, v in sorted(options.get(r.run_id, {}).items())
                   if k not in _RUNS_OWN_LINES]
        clock = provenance_line(r.config.get("profile_source"))  # replayed with a calibrate profile
        config += [clock] if clock else []
        table.add_row(run_cell, Text("\n").join([plain(r.kind), plain(r.status)]), f"{r.num_requests:,}",
                      Text("\n").join(plain(line) for line in config))
    console.print(table, soft_wrap=False)  # a long database path in the title wraps too
    console.print(Text("config: model on GPU, pools in tokens (binary sizes, GiB = 2^30 bytes; with more than one rank, each "
                       "rank's own device and host pools, the storage tier shared, and the KV memory in all), the SGLang release "
                       "whose rules the replay followed, the data-parallel ranks and router (more than one rank), "
                       "then the options "
                       "that differ from the defaults · `--run` takes an id, a unique prefix of one, or a name; "
                       "without it, the (default) run: the newest replay or import, never a sweep or advise candidate · "
                       "--json for every field", style="dim"), soft_wrap=False)
