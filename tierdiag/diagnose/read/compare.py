"""What `compare` and the comparison report read of runs side by side: a run's GPU busy time,
its TTFTs by class, and two runs' requests paired by id (each side's verdict by `cause_sql`, the
rule `explain` and `slow` use). The pairing, the counts and the top-N lists are DuckDB's."""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.request.causes import cause_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL


class BusyTime(NamedTuple):
    busy_ns: int | None  # summed prefill batch time (None: no batch)
    end_ns: int | None  # the later of the last batch's end and the last finish (None: neither)


def busy_time(con: duckdb.DuckDBPyConnection, run_id: str) -> BusyTime:
    """The run's prefill batch time and the virtual time it ends at (as `replay` reports them)."""
    row = con.execute("""
        SELECT (SELECT sum(t_end_ns - t_start_ns) FROM batches WHERE run_id = $1) AS busy,
               greatest((SELECT max(t_end_ns) FROM batches WHERE run_id = $1),
                        (SELECT max(coalesce(finish_ns, first_token_ns)) FROM requests WHERE run_id = $1)) AS t_end
        """, [run_id]).fetchall()[0]
    return BusyTime(*row)


def ttfts_by_class(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[str | None, int]]:
    """(hit_class, ttft_ns) of every finished request, by TTFT."""
    return con.execute("""
        SELECT hit_class, ttft_ns FROM requests
        WHERE run_id = ? AND coalesce(status, 'finished') = 'finished' AND ttft_ns IS NOT NULL
        ORDER BY ttft_ns""", [run_id]).fetchall()


class PairCounts(NamedTuple):
    common: int  # requests in both runs (by req_id)
    n_a: int  # requests in run a
    n_b: int
    faster: int  # common ones with a lower TTFT in b
    slower: int
    changed: int  # common ones whose verdict (primary cause, or rejected) differs
    mismatch: int  # common ones whose input lengths differ: not the same request


class RequestPair(NamedTuple):
    req_id: str
    class_a: str | None
    class_b: str | None
    ttft_a: int | None  # None: not finished
    ttft_b: int | None
    delta: int | None  # ttft_b - ttft_a
    cause_a: str | None  # None: not finished
    cause_b: str | None
    rank_a: int | None  # None: rank not shown
    rank_b: int | None


class VerdictFlow(NamedTuple):
    cause_a: str  # 'rejected' for a request not finished
    cause_b: str
    requests: int


class PairLists(NamedTuple):
    gains: list[RequestPair]  # largest TTFT drop first
    losses: list[RequestPair]  # largest TTFT rise first
    changed: list[RequestPair]  # changed verdicts, largest |delta| first
    flows: list[VerdictFlow]  # verdict a -> verdict b, most requests first


class RequestPairs:
    """Run a's and run b's requests joined by id. `ranks_a`/`ranks_b`: whether each run records a
    rank per request; where one does, the other shows rank 0 (one rank), else neither shows any."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, *, ranks_a: bool, ranks_b: bool):
        self._con = con
        ranked = ranks_a or ranks_b
        rank_a = "dp_rank" if ranks_a else "0" if ranked else "NULL"
        rank_b = "dp_rank" if ranks_b else "0" if ranked else "NULL"
        self._pair = f"""
        WITH a AS (SELECT req_id, hit_class, CASE WHEN {FINISHED_SQL} THEN ttft_ns END AS ttft_ns,
                          {cause_sql()} AS cause, input_tokens, {rank_a} AS dp_rank FROM requests WHERE run_id = $1),
             b AS (SELECT req_id, hit_class, CASE WHEN {FINISHED_SQL} THEN ttft_ns END AS ttft_ns,
                          {cause_sql()} AS cause, input_tokens, {rank_b} AS dp_rank FROM requests WHERE run_id = $2),
             p AS (SELECT req_id, a.hit_class AS class_a, b.hit_class AS class_b, a.ttft_ns AS ttft_a,
                          b.ttft_ns AS ttft_b, b.ttft_ns - a.ttft_ns AS delta, a.cause AS cause_a,
                          b.cause AS cause_b, a.input_tokens IS DISTINCT FROM b.input_tokens AS mismatch,
                          a.dp_rank AS rank_a, b.dp_rank AS rank_b
                   FROM a JOIN b USING (req_id))"""
        self._params = [run_a, run_b]

    def counts(self) -> PairCounts:
        row = self._con.execute(self._pair + """
        SELECT (SELECT count(*) FROM p) AS common,
               (SELECT count(*) FROM a) AS n_a, (SELECT count(*) FROM b) AS n_b,
               (SELECT count(*) FROM p WHERE delta < 0) AS faster,
               (SELECT count(*) FROM p WHERE delta > 0) AS slower,
               (SELECT count(*) FROM p WHERE cause_a IS DISTINCT FROM cause_b) AS changed,
               (SELECT count(*) FROM p WHERE mismatch) AS mismatch""", self._params).fetchall()[0]
        return PairCounts(*(int(v or 0) for v in row))

    def _pairs(self, where_order: str) -> list[RequestPair]:
        cols = "SELECT req_id, class_a, class_b, ttft_a, ttft_b, delta, cause_a, cause_b, rank_a, rank_b FROM p"
        return [RequestPair(*r) for r in self._con.execute(f"{self._pair} {cols} {where_order}",
                                                            self._params).fetchall()]

    def lists(self, top: int) -> PairLists:
        top = int(top)
        flows = self._con.execute(self._pair + """
        SELECT coalesce(cause_a, 'rejected') AS f, coalesce(cause_b, 'rejected') AS t, count(*) AS n FROM p
        WHERE cause_a IS DISTINCT FROM cause_b GROUP BY 1, 2 ORDER BY n DESC, f, t""", self._params).fetchall()
        return PairLists(
            gains=self._pairs(f"WHERE delta < 0 ORDER BY delta, req_id LIMIT {top}"),
            losses=self._pairs(f"WHERE delta > 0 ORDER BY delta DESC, req_id LIMIT {top}"),
            changed=self._pairs(f"""WHERE cause_a IS DISTINCT FROM cause_b
        ORDER BY abs(coalesce(delta, 0)) DESC, req_id LIMIT {top}"""),
            flows=[VerdictFlow(f, t, int(n)) for f, t, n in flows])
