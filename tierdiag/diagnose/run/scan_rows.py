"""The run-wide sums of the run evidence (read/run_scan.py `run_scan`: ~40 aggregates over the
run's `requests` and `transfers` rows) made while the run is recorded, from the rows the store's
writer process takes, beside the story's (story_rows.py, whose fold carries this one and checks
it against the store with its own), so that the close, which the replay waits for, does not
scan the run's rows for them (issue 41, session 35: the scan was ~13.5 ms of one thread's CPU at
the close on the conversation trace, on the run context's thread, which asks first).

Every aggregate of the scan is an integer one (counts, sums, minima and maxima of BIGINT and
INTEGER columns and of integer expressions over one row, two nearest-rank quantiles, a count of
distinct ranks): a batch's part of each is exact and independent of the order the rows come in,
so the run's is the parts summed (Python ints: DuckDB's sums are HUGEINTs). The quantiles keep
their values (the finished TTFTs, the hit requests' reused tokens: 8 bytes a finished request).
`ScanRows.row` gives the scan's one row, value for value in its statement's order, and
read/run_scan.py `scan_of_row` types it as the query's row is. Declined (the close runs the
query, as before) where numpy could differ from the SQL: a value past _NP_SAFE (the sums'
exactness, a product of the routing part's past int64), a negative recompute time in the routing
part (`//` on a HUGEINT truncates, numpy's floors), a batch without the columns it reads.
Held equal to the query on a replay's rows and on hostile ones by tests/diagnose/test_scan_rows.py."""

from __future__ import annotations

from tierdiag.diagnose.run.eviction_rows import take_parts
from tierdiag.store.schema import MISS_COLUMNS

# Below it no expression of the scan over one row (at most three of these added) leaves int64.
_NP_SAFE = 1 << 55
_I64 = 1 << 63

REQUEST_NEED = ("status", "ttft_ns", "arrival_ns", "finish_ns", "first_token_ns", "trace_arrival_ns", "dp_rank",
                "best_rank", "input_tokens", "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                "computed_tokens", "recomputed_tokens", "loadback_skipped_tokens", "loadback_exposed_ns",
                "loadback_queued_ns", "storage_wait_ns", "queue_ns", "recompute_ns", "compute_ns", "ideal_ttft_ns",
                "best_rank_device_tokens", "best_rank_host_tokens", "arrival_device_tokens", "arrival_host_tokens",
                "storage_match_tokens", "decode_wait_ns", "loadback_ns", "recompute_instead_ns",
                "ttft_if_device_resident_ns", *MISS_COLUMNS)
_INT_NEED = tuple(c for c in REQUEST_NEED if c != "status")
TRANSFER_NEED = ("transfer_id", "kind", "bytes", "pages", "runs", "t_start_ns", "t_end_ns")

# The finished rows' part of the scan's row (read/run_scan.py `_FINISHED_SQL`, then the miss
# reasons' sums), in its order: (kind, expression, filter). Kinds: "n" count(*), "sum", "sum0"
# coalesce(sum, 0), "rest" sum(recompute_ns) - sum(routing), "min", "end" (the span's end), "q50",
# "q99" (quantile_disc), "count" count(expression). Expressions: a column, or one of _exprs'.
_FINISHED = (
    ("n", None, None), ("sum", "input_tokens", None), ("sum", "device_hit_tokens", None),
    ("sum", "host_hit_tokens", None), ("sum", "storage_hit_tokens", None), ("sum", "computed_tokens", None),
    ("sum", "recomputed_tokens", None), ("sum", "loadback_skipped_tokens", None), ("n", None, "hit"),
    ("q50", "dhs", "hit"), ("n", None, "tiered"), ("sum", "hs", None), ("sum", "loadback_exposed_ns", None),
    ("sum", "loadback_queued_ns", None), ("sum", "storage_wait_ns", None), ("sum", "queue_ns", None),
    ("sum", "recompute_ns", None), ("sum", "routing", None), ("rest", None, None), ("sum", "compute_ns", None),
    ("sum", "compute_excess", None), ("sum", "ttft_ns", None), ("sum", "excess", None),
    # finished_totals
    ("n", None, None), ("min", "arrival_ns", None), ("end", None, None), ("sum", "ttft_ns", None),
    ("sum", "queue_ns", None), ("sum", "excess", None), ("q50", "ttft_ns", None), ("q99", "ttft_ns", None),
    # own_parts, finished_token_totals
    ("sum", "recompute_ns", None), ("sum", "compute_ns", None), ("sum", "loadback_exposed_ns", None),
    ("sum", "decode_wait_ns", None), ("sum", "input_tokens", None), ("sum", "recomputed_tokens", None),
    # loadback_requests
    ("sum0", "loadback_ns", "tiered"), ("sum0", "instead", "tiered"), ("sum0", "loadback_exposed_ns", None),
    ("sum0", "ttft_ns", None), ("sum0", "ttft_ns", "tiered"),
    # the miss reasons' sums
    ("count", MISS_COLUMNS[0], None), *(("sum", c, None) for c in MISS_COLUMNS))

# The transfers' part (TRANSFER_TOTALS_SQL, then `_TRANSFER_MORE_SQL`): (kind, column, kind of transfer).
_TRANSFERS = (
    ("n", None, "load_back"), ("sum", "bytes", "load_back"), ("sum", "pages", "load_back"),
    ("sum", "runs", "load_back"), ("sum", "busy", "load_back"), ("n", None, "prefetch"), ("sum", "bytes", "prefetch"),
    ("n", None, "load_back"), ("sum0", "bytes", "load_back"), ("sum0", "busy", "load_back"),
    ("sum0", "pages", "load_back"), ("sum0", "runs", "load_back"))


def _int_matrix(cols: dict, names: tuple):
    """The int columns `names` of `cols` (Arrow arrays) as one int64 matrix, a row a column, a
    NULL 0 (store/columns.py `arrow_ints`), whether each value is not NULL (`arrow_valid`) and
    the largest magnitude among them (the fold's bound): a plain int64 or int32 array without
    NULLs read from its buffer (the usual batch: one copy into the matrix), any other through
    those two."""
    import numpy as np
    import pyarrow as pa

    from tierdiag.store.columns import arrow_ints, arrow_valid

    n = len(cols[names[0]])
    values = np.empty((len(names), n), dtype=np.int64)
    valid = np.ones((len(names), n), dtype=bool)
    plain = {pa.int64(): np.int64, pa.int32(): np.int32}
    for i, c in enumerate(names):
        a = cols[c]
        width = plain.get(a.type) if isinstance(a, pa.Array) else None
        if len(a) != n:
            raise ValueError(f"requests: column {c} has {len(a)} rows, {names[0]} {n}")
        if width is not None and a.null_count == 0:
            values[i] = np.frombuffer(a.buffers()[1], dtype=width, count=a.offset + n)[a.offset:]
        else:
            values[i] = arrow_ints(a, 0)
            valid[i] = arrow_valid(a)
    return values, valid, (int(np.abs(values).max()) if n else 0)


def _sum_rows(m, small: bool) -> list:
    """Each row's sum of the int64 matrix `m` (each |x| < 2^57), exact: one int64 sum where
    `small` (the batch's bound says it stays inside int64), else in two halves of 32 bits."""
    if small:
        return m.sum(axis=1).tolist()
    return [(h << 32) + lo for h, lo in zip((m >> 32).sum(axis=1).tolist(), (m & 0xFFFFFFFF).sum(axis=1).tolist())]


def _plan() -> tuple:
    """`_FINISHED`'s parts that are not a plain column's sum or count (those: every column's, in
    one matrix sum a batch), once each: (kind, expression, filter), kind "n", "sum", "min" or "q"."""
    out: list = []
    for kind, expr, where in _FINISHED:
        kind = {"sum0": "sum", "q50": "q", "q99": "q"}.get(kind, kind)
        if kind in ("rest", "end", "count") or (kind == "sum" and where is None and expr in _INT_NEED):
            continue
        if kind == "n" and where is None:
            continue  # the finished rows' count
        if (kind, expr, where) not in out:
            out.append((kind, expr, where))
    return tuple(out)


def _exprs(v: dict, ok: dict):
    """The scan's expressions over one row set (v: the columns as int64, a NULL 0; ok: whether
    not NULL): name -> (values, valid); None where numpy could differ (the routing part's)."""
    import numpy as np

    e = {}
    e["dhs"] = (v["device_hit_tokens"] + v["host_hit_tokens"] + v["storage_hit_tokens"],
                ok["device_hit_tokens"] & ok["host_hit_tokens"] & ok["storage_hit_tokens"])
    e["hs"] = (v["host_hit_tokens"] + v["storage_hit_tokens"], ok["host_hit_tokens"] & ok["storage_hit_tokens"])
    every = np.ones(len(v["ttft_ns"]), dtype=bool)
    # routing_ns_sql: coalesce(recompute_ns, 0)::HUGEINT * r // recomputed_tokens where recomputed > 0
    rec = v["recomputed_tokens"]  # a NULL 0: coalesce's
    gap = (v["best_rank_device_tokens"] + v["best_rank_host_tokens"] - v["arrival_device_tokens"]
           - v["arrival_host_tokens"] - v["storage_match_tokens"])
    moved = ok["dp_rank"] & ok["best_rank"] & (v["best_rank"] != v["dp_rank"])
    r = np.where(moved, np.minimum(rec, np.maximum(gap, 0)), 0)
    applies = (rec > 0) & (r != 0)
    rn = v["recompute_ns"]
    routing = np.zeros(len(rn), dtype=np.int64)
    if applies.any():
        a_rn, a_r = rn[applies], r[applies]
        if int(a_rn.min()) < 0 or int(a_r.min()) < 0:
            return None  # HUGEINT `//` truncates toward 0, numpy's floors
        if int(a_rn.max()) * int(a_r.max()) >= _I64:
            return None  # the product past int64
        routing[applies] = a_rn * a_r // rec[applies]
    e["routing"] = (routing, every)
    e["compute_excess"] = (np.maximum(v["compute_ns"] - v["ideal_ttft_ns"], 0), every)
    e["excess"] = (v["ttft_ns"] - v["ideal_ttft_ns"], ok["ttft_ns"])
    e["instead"] = (v["recompute_instead_ns"] - v["ttft_if_device_resident_ns"],
                    ok["recompute_instead_ns"] & ok["ttft_if_device_resident_ns"])
    return e


_PLAN = _plan()
_AT = {c: i for i, c in enumerate(_INT_NEED)}
_T_INT = ("transfer_id", "bytes", "pages", "runs", "t_start_ns", "t_end_ns")
_T_SUMMED = ("bytes", "pages", "runs", "busy")


class ScanRows:
    """The scan's parts of one run's rows, batch by batch (`take`), for its close (`row`).
    `take` raises what it cannot project (the caller, story_rows.py, gives the fold up then);
    `off` says why it was given up for rows the SQL would read otherwise."""

    def __init__(self) -> None:
        self.off: str | None = None
        self.requests = 0
        self.finished = 0
        self.transfers = 0
        self.transfer_id_sum = 0
        self.col_sum = [0] * len(_INT_NEED)  # over the finished rows: each column's sum (a NULL 0) ...
        self.col_count = [0] * len(_INT_NEED)  # ... and its values not NULL
        self.sums: dict = {}  # (expression, filter) -> [sum, values]
        self.counts: dict = {}  # filter -> finished rows it keeps
        self.lo: dict = {}  # minima by key
        self.hi: dict = {}  # maxima by key
        self.quantiles: dict = {}  # (expression, filter) -> the values' arrays
        self.ranks: set = set()
        self.t_sum = {k: [0] * len(_T_SUMMED) for k in ("load_back", "prefetch")}
        self.t_count = {k: [0] * len(_T_SUMMED) for k in ("load_back", "prefetch")}
        self.t_rows = {"load_back": 0, "prefetch": 0}

    def _decline(self, why: str) -> None:
        self.off = why
        self.quantiles = {}
        self.ranks = set()

    def take(self, taken: dict) -> None:
        """A batch of rows the writer took (table -> column -> Arrow array)."""
        take_parts(self, taken, (("requests", REQUEST_NEED, self._requests),
                                 ("transfers", TRANSFER_NEED, self._transfers)), "the scan's fold")

    def _least(self, key, values) -> None:
        if len(values):
            x = int(values.min())
            self.lo[key] = x if key not in self.lo else min(self.lo[key], x)

    def _most(self, key, values) -> None:
        if len(values):
            x = int(values.max())
            self.hi[key] = x if key not in self.hi else max(self.hi[key], x)

    def _requests(self, cols: dict) -> str | None:
        import numpy as np

        from tierdiag.store.columns import arrow_is

        values, valid, big = _int_matrix(cols, _INT_NEED)
        if big >= _NP_SAFE:
            return "a value past the fold's exact range"
        self.requests += values.shape[1]
        v_all = dict(zip(_INT_NEED, values))
        ok_all = dict(zip(_INT_NEED, valid))
        # Over every row: the span's start and end, the arrivals' spread, the ranks named.
        arrival, a_ok = v_all["arrival_ns"], ok_all["arrival_ns"]
        self._least("a_arrival", arrival[a_ok])
        self._most("a_arrival", arrival[a_ok])
        ft_ok = ok_all["finish_ns"] | ok_all["first_token_ns"]
        self._most("a_ft", np.where(ok_all["finish_ns"], v_all["finish_ns"], v_all["first_token_ns"])[ft_ok])
        tr_ok = ok_all["trace_arrival_ns"] | a_ok
        tr = np.where(ok_all["trace_arrival_ns"], v_all["trace_arrival_ns"], arrival)[tr_ok]
        self._least("a_trace", tr)
        self._most("a_trace", tr)
        if ok_all["dp_rank"].any():
            self.ranks.update(np.unique(v_all["dp_rank"][ok_all["dp_rank"]]).tolist())
        # The finished rows (FINISHED_SQL).
        fin = arrow_is(cols["status"], "finished", null=True) & ok_all["ttft_ns"]
        nf = int(fin.sum())
        if not nf:
            return None
        fv, fok = values[:, fin], valid[:, fin]
        v, ok = dict(zip(_INT_NEED, fv)), dict(zip(_INT_NEED, fok))
        e = _exprs(v, ok)
        if e is None:
            return "the routing part where numpy's integer division could differ"
        small = 4 * big * nf < _I64  # every summed expression is at most 3 values added (or one, divided)
        # Every column's sum and count of values in two calls (a NULL is a 0 in `values`).
        self.finished += nf
        self.col_sum = [a + b for a, b in zip(self.col_sum, _sum_rows(fv, small))]
        self.col_count = [a + b for a, b in zip(self.col_count, fok.sum(axis=1).tolist())]
        masks = {None: None, "hit": e["dhs"][1] & (e["dhs"][0] > 0), "tiered": e["hs"][1] & (e["hs"][0] > 0)}
        for kind, expr, where in _PLAN:
            mask = masks[where]
            if kind == "n":
                self.counts[where] = self.counts.get(where, 0) + int(mask.sum())
                continue
            values_of, valid_of = e[expr] if expr in e else (v[expr], ok[expr])
            take = valid_of if mask is None else (valid_of & mask)
            if kind == "sum":
                got = values_of[take]
                was = self.sums.setdefault((expr, where), [0, 0])
                was[0] += _sum_rows(got[None, :], small)[0]
                was[1] += len(got)
            elif kind == "min":
                self._least((expr, where), values_of[take])
            else:  # "q"
                self.quantiles.setdefault((expr, where), []).append(values_of[take])
        f_ft_ok = ok["finish_ns"] | ok["first_token_ns"]
        self._most("f_ft", np.where(ok["finish_ns"], v["finish_ns"], v["first_token_ns"])[f_ft_ok])
        self._most("f_arrival", v["arrival_ns"][ok["arrival_ns"]])
        return None

    def _transfers(self, cols: dict) -> str | None:
        import numpy as np

        from tierdiag.store.columns import arrow_is

        values, valid, big = _int_matrix(cols, _T_INT)
        if big >= _NP_SAFE:
            return "a transfer's value past the fold's exact range"
        n = values.shape[1]
        self.transfers += n
        v, ok = dict(zip(_T_INT, values)), dict(zip(_T_INT, valid))
        self.transfer_id_sum += int(v["transfer_id"].sum())  # a NULL 0
        summed = np.stack([v["bytes"], v["pages"], v["runs"], v["t_end_ns"] - v["t_start_ns"]])
        summed_ok = np.stack([ok["bytes"], ok["pages"], ok["runs"], ok["t_end_ns"] & ok["t_start_ns"]])
        summed[~summed_ok] = 0
        small = 2 * big * max(n, 1) < _I64
        for kind_of in ("load_back", "prefetch"):
            rows = arrow_is(cols["kind"], kind_of, null=False)
            self.t_rows[kind_of] += int(rows.sum())
            self.t_sum[kind_of] = [a + b for a, b in zip(self.t_sum[kind_of], _sum_rows(summed[:, rows], small))]
            self.t_count[kind_of] = [a + b for a, b in zip(self.t_count[kind_of], summed_ok[:, rows].sum(axis=1).tolist())]
        return None

    def check(self) -> tuple:
        """What the store must hold for the parts to be its rows: (request rows, transfers, the
        sum of their ids): read/folded.py `folded_rows_check`'s."""
        return (self.requests, self.transfers, self.transfer_id_sum)

    def _sum(self, expr: str, where: str | None, zero: bool):
        """sum(expr) FILTER (where) over the finished rows (coalesced to 0 where `zero`)."""
        if where is None and expr in _AT:
            total, count = self.col_sum[_AT[expr]], self.col_count[_AT[expr]]
        else:
            total, count = self.sums.get((expr, where), (0, 0))
        return total if count else (0 if zero else None)

    def row(self) -> tuple | None:
        """The scan's one row (read/run_scan.py `run_scan`'s statement, the miss reasons' sums
        included), from the parts (once checked against the store: the caller's); None where
        they were given up."""
        if self.off is not None:
            return None
        import numpy as np

        from tierdiag.diagnose.read.quantile import nearest_rank_index

        lo_t, hi_t = self.lo.get("a_trace"), self.hi.get("a_trace")
        a_ft = self.hi.get("a_ft")
        out: list = [self.requests, self.lo.get("a_arrival"),
                     a_ft if a_ft is not None else self.hi.get("a_arrival"),
                     None if lo_t is None else hi_t - lo_t, len(self.ranks)]
        for kind, expr, where in _FINISHED:
            if kind == "n":
                out.append(self.finished if where is None else self.counts.get(where, 0))
            elif kind in ("sum", "sum0"):
                out.append(self._sum(expr, where, kind == "sum0"))
            elif kind == "rest":
                a, b = self._sum("recompute_ns", None, False), self._sum("routing", None, False)
                out.append(None if a is None or b is None else a - b)
            elif kind == "count":
                out.append(self.col_count[_AT[expr]])
            elif kind == "min":
                out.append(self.lo.get((expr, where)))
            elif kind == "end":
                f_ft = self.hi.get("f_ft")
                out.append(f_ft if f_ft is not None else self.hi.get("f_arrival"))
            else:  # q50, q99
                parts = self.quantiles.get((expr, where), [])
                values = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
                out.append(int(values[nearest_rank_index(len(values), 0.5 if kind == "q50" else 0.99)])
                           if len(values) else None)
        for kind, c, kind_of in _TRANSFERS:
            if kind == "n":
                out.append(self.t_rows[kind_of])
            else:
                i = _T_SUMMED.index("busy" if c == "busy" else c)
                total, count = self.t_sum[kind_of][i], self.t_count[kind_of][i]
                out.append(total if count else (0 if kind == "sum0" else None))
        return tuple(out)
