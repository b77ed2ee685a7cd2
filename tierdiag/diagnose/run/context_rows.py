"""The run context's per-request columns (read/run_context.py `wait_windows`, `allocations`,
`lost_request_sizes`, `loadback_skipped_by_reason`, `storage_unused_by_reason`, `ideal_arrivals`:
six queries of the context's thread) made while the run is recorded, from the request rows the store's writer
process takes, beside the story's (story_rows.py, whose fold carries these parts and checks them
against the store with its own), so that the close, which the replay waits for, does not query
them on the run context's thread, its longest (issue 41, session 32: ~21 ms of that thread's CPU
on the conversation trace at load 9, `allocations` a window over every finished request, the
others mostly a statement's fixed cost).

`taken_context_rows` projects one batch (numpy over its Arrow columns, as `taken_story_rows`);
`context_rows` joins a run's parts into what the six queries return: the same values, types
and, where the consumer's floating-point sums depend on it, the same row order (the store's scan
of `requests` is the order the writer inserted them in: the order taken). None (the caller
queries the store) where a row has a NULL the SQL would carry into its result, a value past
_NP_SAFE, or schedule instants the window's order would leave undecided (a repeated seq). Held
equal to the SQL on a replay's rows and on hostile ones by tests/diagnose/test_story_rows.py."""

from __future__ import annotations

from typing import Any, NamedTuple

# As read/run_context.py's: below it no sum or difference of a few of these can leave int64.
_NP_SAFE = 1 << 55
# The allocations' running total comes back from DuckDB as a double (a HUGEINT sum): exact below this.
_EXACT_DOUBLE = 1 << 53

NEED = ("status", "ttft_ns", "prefill_ns", "arrival_ns", "storage_wait_ns", "first_token_ns", "dp_rank", "seq",
        "input_tokens", "device_hit_tokens", "output_tokens", "recomputed_tokens", "loadback_skipped_reason",
        "loadback_skipped_tokens", "storage_skipped_reason", "storage_match_tokens", "storage_hit_tokens",
        "miss_prefetch_lost_tokens", "ideal_ttft_ns")
_TEXT = ("status", "loadback_skipped_reason", "storage_skipped_reason")


class ContextRows(NamedTuple):
    """What six of the run context's per-request queries return, made from folded rows."""
    wait_windows: Any  # read/run_context.py WaitWindows
    allocations: Any  # read/run_context.py Allocations
    lost_sizes: Any  # `lost_request_sizes`'s array
    skipped: list  # `loadback_skipped_by_reason`'s [(reason, tokens)]
    unused: list  # `storage_unused_by_reason`'s
    ideal: Any  # `ideal_arrivals`'s IdealArrivals (equal arrivals in the order taken: see `context_rows`)


def taken_context_rows(columns: dict) -> dict | None:
    """The parts of the request rows among `columns` (column -> Arrow array, the schema's types,
    as a writer took them) the six queries read, in the order taken: `w_start`, `w_first`,
    `w_rank` (every finished request with a prefill: `wait_windows`'s columns), `a_sched`, `a_tok`,
    `a_seq` (the same rows: the schedule instant, the tokens allocated, the seq the window orders
    ties by), `lost` (every finished request that recomputed: `lost_request_sizes`'s), `s_*` and
    `u_*` (reason and tokens of each finished row with a skipped reason: the two sums by reason)
    and `i_*` (arrival and ideal TTFT of each finished row with an ideal: `ideal_arrivals`'). None
    where a column is missing or a value is what the SQL would give otherwise (a NULL it carries,
    a magnitude past _NP_SAFE)."""
    import numpy as np

    from tierdiag.store.columns import arrow_ints, arrow_is, arrow_valid

    if any(name not in columns for name in NEED):
        return None
    done = arrow_is(columns["status"], "finished", null=True) & arrow_valid(columns["ttft_ns"])
    valid = {name: arrow_valid(columns[name]) for name in NEED if name != "status"}
    v = {name: arrow_ints(columns[name], 0) for name in NEED if name not in _TEXT}
    if any(len(a) and int(np.abs(a).max()) >= _NP_SAFE for a in v.values()):
        return None
    sched = done & valid["prefill_ns"]
    # The wait windows' and the allocations' inputs: a NULL there is a NULL (or a row the
    # window's sum skips) in the SQL's result.
    for name in ("arrival_ns", "first_token_ns", "seq", "input_tokens", "output_tokens"):
        if not valid[name][sched].all():
            return None
    lost_rows = done & valid["recomputed_tokens"] & (v["recomputed_tokens"] > 0)
    lb = valid["loadback_skipped_reason"]
    st = valid["storage_skipped_reason"]
    if not (valid["loadback_skipped_tokens"] | ~lb)[lost_rows].all():
        return None
    if not ((valid["storage_match_tokens"] & valid["storage_hit_tokens"]) | ~st)[lost_rows].all():
        return None
    rec = v["recomputed_tokens"]
    lost = np.maximum(rec - np.where(lb, np.minimum(v["loadback_skipped_tokens"], rec), 0)
                      - np.where(st, np.maximum(v["storage_match_tokens"] - v["storage_hit_tokens"], 0), 0), 0)
    # The skipped and unused sums by reason: a finished row with a reason; a NULL among the
    # unused part's inputs is what the SQL's least/greatest pass over (declined, not mimicked).
    skip_rows, use_rows = done & lb, done & st
    if not (valid["storage_match_tokens"] & valid["storage_hit_tokens"] & valid["recomputed_tokens"])[use_rows].all():
        return None
    unused = np.minimum(np.maximum(v["storage_match_tokens"] - v["storage_hit_tokens"]
                                   - v["miss_prefetch_lost_tokens"], 0), rec)
    ideal_rows = done & valid["ideal_ttft_ns"]
    if not valid["arrival_ns"][ideal_rows].all():
        return None
    return {"w_start": (v["arrival_ns"] + v["storage_wait_ns"])[sched], "w_first": v["first_token_ns"][sched],
            "w_rank": v["dp_rank"][sched].astype(np.int32),
            "a_sched": (v["first_token_ns"] - v["prefill_ns"])[sched],
            "a_tok": (v["input_tokens"] - v["device_hit_tokens"] + v["output_tokens"])[sched],
            "a_seq": v["seq"][sched], "lost": lost[lost_rows],
            "s_reason": _texts(columns["loadback_skipped_reason"], skip_rows),
            "s_tok": v["loadback_skipped_tokens"][skip_rows],  # a NULL summed as nothing: as 0
            "u_reason": _texts(columns["storage_skipped_reason"], use_rows), "u_tok": unused[use_rows],
            "i_arrival": v["arrival_ns"][ideal_rows], "i_ideal": v["ideal_ttft_ns"][ideal_rows]}


def _texts(values, rows) -> list:
    """The strings of `values` (an Arrow string array) at the True places of `rows`."""
    import numpy as np

    if not rows.any():
        return []
    every = values.to_pylist()
    return [every[i] for i in np.flatnonzero(rows)]


def _by_reason(reasons: list, tokens) -> list:
    """[(reason, summed tokens)] in the SQL's `GROUP BY 1 ORDER BY 1` (bytes order: code points)."""
    sums: dict = {}
    for reason, n in zip(reasons, tokens.tolist()):
        sums[reason] = sums.get(reason, 0) + n
    return sorted(sums.items())


def context_rows(parts: list[dict]) -> ContextRows | None:
    """The six queries' results from a run's parts (`taken_context_rows`, in the order taken);
    None where the window's order would be undecided (two rows of one schedule instant and seq)
    or its running total (or the ideals') not exact as the double DuckDB returns it."""
    import numpy as np

    from tierdiag.diagnose.read.run_context import Allocations, IdealArrivals, WaitWindows

    if not parts:
        return None
    c = {name: (np.concatenate([p[name] for p in parts]) if not isinstance(parts[0][name], list)
                else [x for p in parts for x in p[name]]) for name in parts[0]}
    sched, tok, seq = c["a_sched"], c["a_tok"], c["a_seq"]
    order = np.lexsort((seq, sched))  # the window's ORDER BY sched, seq
    sched, tok, seq = sched[order], tok[order], seq[order]
    if len(sched) > 1 and ((sched[1:] == sched[:-1]) & (seq[1:] == seq[:-1])).any():
        return None
    if len(tok) and int(np.abs(tok).sum()) >= _EXACT_DOUBLE:
        return None
    cum = np.cumsum(tok)
    starts = np.flatnonzero(np.concatenate([[True], sched[1:] != sched[:-1]])) if len(sched) else np.zeros(0, np.int64)
    alloc = Allocations(sched[starts], (np.maximum.reduceat(cum, starts) if len(starts) else cum).astype(np.float64))
    # `ORDER BY arrival_ns`: equal arrivals in the order taken (DuckDB's own order among them is
    # not defined); the capacity reads their ideals only through sums, exact (integers) below 2^53.
    ideal = c["i_ideal"]
    if len(ideal) and int(np.abs(ideal).sum()) >= _EXACT_DOUBLE:
        return None
    by = np.argsort(c["i_arrival"], kind="stable")
    return ContextRows(WaitWindows(c["w_start"], c["w_first"], c["w_rank"]), alloc, c["lost"],
                       _by_reason(c["s_reason"], c["s_tok"]), _by_reason(c["u_reason"], c["u_tok"]),
                       IdealArrivals(c["i_arrival"][by], ideal[by]))
