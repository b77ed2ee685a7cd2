"""A data-parallel run planted on a one-rank replay: the v4 columns (docs/contract.md
"Deployments", §5) filled in after the fact, so the per-rank views can be tested without the
`replay --dp N` engine (and against a store of any shape the tests want).

`plant_ranks(db, run_id, dp=4, router="cache_aware")` takes a run recorded with one rank and:

- sets `config_json`'s `dp` and `router`;
- gives every request a `dp_rank` (`rank_of(row)`, default: its seq modulo dp, a round robin)
  and the routing decision the named router's branch would write (route_branch, route_reason,
  route_score, route_score_name; the reasons are the routers' own formats, engine/routing/);
- writes where its prefix was on every rank at arrival (`ranks_json`): on its own rank what the
  row says it found (device_hit_tokens on device, host_match_tokens on host); on another rank r,
  the request's whole reused prefix (device + host + storage + recomputed; every third request:
  all its prompt's full pages) on device when (seq + r) % dp == 1, else nothing: so some requests were sent away from ranks that held their
  prefix, and the routing step has something to say. in_flight is (seq + r) % 5 × 20. (A cache_aware
  request sent away from a rank whose match passed the threshold is written as the imbalance
  rule's, the one branch that does that; the loads in its reason are the planted in_flight.)
- derives arrival_device_tokens / arrival_host_tokens and best_rank (most device + host; ties:
  its own rank, else the lowest) and its tokens from that list, as the contract defines them;
- puts every batch on the rank of a request it started (requests.first_batch_id; a batch no
  request started: batch_id % dp), every transfer on its request's rank, every eviction on the
  rank of the request whose allocation caused it (none: rank 0), pool samples on rank 0.

The rows stay a one-rank replay's in everything else (the planted ranks never shared one tree);
the views only ever read the rows, which is what these tests check them against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import duckdb

CACHE_THRESHOLD = 0.3  # router_cache_threshold's default (the gateway's --cache-threshold)


def _decision(router: str, row: dict, rank: int, ranks: list[dict], dp: int) -> tuple[str, str, float | None, str]:
    """(branch, reason, score, score_name) as engine/routing/'s routers word them."""
    seq = int(row["seq"])
    if router == "cache_aware":
        rate, best = ranks[rank]["score"], max(r["score"] for r in ranks)
        if rate > CACHE_THRESHOLD:
            return "cache_hit", f"cache_aware: match {rate:.2f} > {CACHE_THRESHOLD:.2f} on rank {rank}", rate, \
                "approx match"
        if best > CACHE_THRESHOLD:  # another rank matched: only the imbalance rule sends it elsewhere
            loads = [r["in_flight"] for r in ranks]
            return "imbalanced", (f"imbalanced: max load {max(loads)} - min {min(loads)} > 32 and {max(loads)} > "
                                  f"1.5 × {min(loads)}: shortest queue rank {rank}"), float(loads[rank]), "in flight"
        return "cache_miss", (f"cache_aware: best match {best:.2f} <= {CACHE_THRESHOLD:.2f}: "
                              f"least loaded rank {rank}"), best, "approx match"
    if router == "round_robin":
        return "turn", f"round_robin: turn {seq} of {dp} ranks: rank {rank}", float(seq), "in flight"
    loads = ", ".join(str(r["in_flight"]) for r in ranks)
    return "min_load", f"{router}: rank {rank} has the least in flight ({loads})", float(ranks[rank]["in_flight"]), \
        "in flight"


def plant_ranks(db: Path | str, run_id: str | None = None, *, dp: int = 4, router: str = "cache_aware",
                rank_of: Callable[[dict], int] | None = None) -> str:
    """Turn run `run_id` (default: the store's only run) into a `dp`-rank run; returns its id."""
    con = duckdb.connect(str(db))
    try:
        if run_id is None:
            (run_id,), = con.execute("SELECT run_id FROM runs").fetchall()
        (config_json,), = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchall()
        config = json.loads(config_json)
        config.update(dp=dp, router=router)
        page = int(config.get("page_size") or 64)
        con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps(config, sort_keys=True), run_id])
        cur = con.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY seq", [run_id])
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        rank_of = rank_of or (lambda row: int(row["seq"]) % dp)
        planted = []
        for row in rows:
            seq, own = int(row["seq"]), rank_of(row)
            assert 0 <= own < dp, f"rank_of gave {own} for {row['req_id']}"
            reused = sum(int(row.get(k) or 0) for k in ("device_hit_tokens", "host_hit_tokens",
                                                         "storage_hit_tokens", "recomputed_tokens"))
            inp = int(row["input_tokens"] or 0)
            ranks = []
            for r in range(dp):
                if r == own:
                    device, host = int(row.get("device_hit_tokens") or 0), int(row.get("host_match_tokens") or 0)
                else:  # every third request: its whole prompt's full pages (more than it found at home)
                    held = (inp - 1) // page * page if seq % 3 == 0 else reused
                    device, host = (held if (seq + r) % dp == 1 else 0), 0
                ranks.append({"rank": r, "device_tokens": device, "host_tokens": host, "in_flight": (seq + r) % 5 * 20,
                              "score": round(device / inp, 4) if router == "cache_aware" and inp else
                              float((seq + r) % 5 * 20)})
            held = [(x["device_tokens"] + x["host_tokens"], x["rank"]) for x in ranks]
            most = max(h for h, _ in held)
            best = own if held[own][0] == most else min(r for h, r in held if h == most)
            branch, reason, score, score_name = _decision(router, row, own, ranks, dp)
            planted.append((row["req_id"], own, branch, reason, score, score_name, ranks[own]["device_tokens"],
                            ranks[own]["host_tokens"], best, ranks[best]["device_tokens"], ranks[best]["host_tokens"],
                            json.dumps(ranks)))
        con.execute("""CREATE TEMP TABLE planted (req_id VARCHAR, dp_rank INTEGER, route_branch VARCHAR,
            route_reason VARCHAR, route_score DOUBLE, route_score_name VARCHAR, arrival_device_tokens BIGINT,
            arrival_host_tokens BIGINT, best_rank INTEGER, best_rank_device_tokens BIGINT,
            best_rank_host_tokens BIGINT, ranks_json VARCHAR)""")
        con.executemany("INSERT INTO planted VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", planted)
        cols = [c for c in ("dp_rank", "route_branch", "route_reason", "route_score", "route_score_name",
                            "arrival_device_tokens", "arrival_host_tokens", "best_rank", "best_rank_device_tokens",
                            "best_rank_host_tokens", "ranks_json")]
        con.execute(f"UPDATE requests SET {', '.join(f'{c} = p.{c}' for c in cols)} FROM planted p "
                    f"WHERE requests.run_id = ? AND requests.req_id = p.req_id", [run_id])
        con.execute("""UPDATE batches SET dp_rank = coalesce(
                (SELECT min(r.dp_rank) FROM requests r WHERE r.run_id = batches.run_id
                 AND r.first_batch_id = batches.batch_id), batch_id % ?) WHERE run_id = ?""", [dp, run_id])
        con.execute("""UPDATE transfers SET dp_rank = coalesce(
                (SELECT min(r.dp_rank) FROM requests r WHERE r.run_id = transfers.run_id
                 AND r.req_id = transfers.req_id), 0) WHERE run_id = ?""", [run_id])
        con.execute("""UPDATE evictions SET dp_rank = coalesce(
                (SELECT min(r.dp_rank) FROM requests r WHERE r.run_id = evictions.run_id
                 AND r.req_id = evictions.cause_req_id), 0) WHERE run_id = ?""", [run_id])
        con.execute("UPDATE pool_samples SET dp_rank = 0 WHERE run_id = ?", [run_id])
        con.execute("DROP TABLE planted")
    finally:
        con.close()
    return run_id


def reuse_lines(n: int = 60, *, docs: int = 6, blocks: int = 12, block: int = 512) -> list[str]:
    """A Mooncake trace with reuse to route: request i reads document (i // 2) % docs (`blocks`
    blocks of `block` tokens) and one block of its own, 200 ms apart; the second of each pair
    finds the first's document on device, the first finds it pushed to host by the others (with
    a device pool of about two documents)."""
    from tests.support.traces import line

    return [line(200 * i, blocks * block + 300, [((i // 2) % docs) * 100 + b for b in range(blocks)] + [10_000 + i],
                 output_length=16) for i in range(n)]


# A device pool of about two documents of reuse_lines, host room for all of them.
REUSE_POOLS = ("--device-tokens", "16384", "--host-tokens", "200000")


def rows(db: Path | str, name: str, table: str = "requests") -> list[dict]:
    """Every row of run `name` (an id, prefix or name) in `table`, as dicts."""
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        rid = resolve_run(con, name).run_id
        cur = con.execute(f"SELECT * FROM {table} WHERE run_id = ?", [rid])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
