"""Every number an advice reason prints, recomputed with this file's own SQL (issue 34).

Each advice item's `reason` is a claim built in claims.py from named numbers (as a verdict's
sentences are); its `prediction` likewise. For runs that make every rule fire (test_run_claims'
synth runs for the session and capacity rules; test_advice_planted's stories for prefetch,
write policy, eviction policy, page size, storage tier, "nothing to change"; test_capacity's
overloaded run for the rate and the number of ranks) each item is taken apart and each number checked against the rows:
the tokens deleted from host / dropped / hot and their reuse distance (test_run_claims._removed),
the host pool each size keeps (to the decile), late prefetches, the read and recompute cost per
token, the load-backs' link share, page and run sizes and exposed share, the later session turns,
their p90 pause and LRU stack distance, and the offered load's windows. No sentence appears
twice in a run's diagnosis, advice included."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.session.session_pool import session_pauses
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story, _pushed_out
from .test_advice_predictions import _fragmented, _hot_then_floods, PAGE_OPTIONS
from .test_capacity import overloaded
from .test_run_claims import PCT, MS, POOLS, STORAGE, _capacity, _ms_ok, _pct_ok, _removed, _synth
from .test_run_story import bursty

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke as _invoke  # noqa: E402

KV_70B = 327_680
DISK_BYTES_PER_S = 5e9  # docs/engine.md: the cost model's storage read rate
FIN = "run_id = $r AND coalesce(status, 'finished') = 'finished' AND ttft_ns IS NOT NULL"
BYTES = r"([\d,.]+ (?:B|KiB|MiB|GiB))"
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def _bytes_ok(text: str, n: float) -> bool:
    num, unit = text.rsplit(" ", 1)
    dec = len(num.split(".")[1]) if "." in num else 0
    return abs(float(num.replace(",", "")) - n / _UNITS[unit]) <= 0.5 * 10 ** -dec + 1e-9


def _pow2_pages(n: int, page: int) -> int:
    p = max(page, 1)
    while p < n:
        p *= 2
    return p


def _cover(deciles: list[int], capacity: int) -> float:
    return max((i / 10 for i, d in enumerate(deciles) if d <= capacity), default=0.0)


# --------------------------------------------------------------------------- the rows, own SQL


class Rows:
    """One run's numbers the reasons quote, each from the rows."""

    def __init__(self, db: Path) -> None:
        with open_store(db) as con:
            self.run = run = resolve_run(con, None)
            r = {"r": run.run_id}
            self.config = dict(run.config)
            self.kv = (run.data_plane or {}).get("kv_bytes_per_token")
            self.input, self.recomputed = con.execute(
                f"SELECT sum(input_tokens), sum(recomputed_tokens) FROM requests WHERE {FIN}", r).fetchone()
            self.queue_ns, self.excess_ns = con.execute(
                f"SELECT sum(queue_ns), sum(ttft_ns - coalesce(ideal_ttft_ns, 0)) FROM requests WHERE {FIN}",
                r).fetchone()
            self.batch_recompute_ns = con.execute("SELECT sum(recompute_ns) FROM batches WHERE run_id = $r",
                                                  r).fetchone()[0] or 0
            self.late = con.execute(
                f"SELECT coalesce(sum(least(storage_match_tokens - storage_hit_tokens, recomputed_tokens)), 0) "
                f"FROM requests WHERE {FIN} AND storage_skipped_reason = 'prefetch_incomplete'", r).fetchone()[0]
            self.removed = _removed(con, run.run_id)
            self.hot_kept_deciles = _hot_competing(con, run.run_id)
            t = con.execute("SELECT count(*), sum(bytes), sum(t_end_ns - t_start_ns), sum(pages), sum(runs) "
                            "FROM transfers WHERE run_id = $r AND kind = 'load_back'", r).fetchone()
            self.num_loadbacks, self.lb_bytes, self.lb_busy_ns, self.lb_pages, self.lb_runs = t
            peak = (run.data_plane or {}).get("link_bytes_per_s")
            self.link_share = self.lb_bytes * 1e9 / self.lb_busy_ns / peak if self.lb_bytes and peak else None
            self.exposed_ns, self.tiered_ttft_ns, self.tiered_lb_ns, self.tiered_recompute_ns = con.execute(
                f"SELECT sum(loadback_exposed_ns), sum(ttft_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), "
                f"sum(loadback_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), "
                f"sum(recompute_instead_ns - ttft_if_device_resident_ns) FILTER (WHERE host_hit_tokens + "
                f"storage_hit_tokens > 0) FROM requests WHERE {FIN}", r).fetchone()
            # Lost: recomputed, less a skipped load-back and an unused storage match (gone from every tier).
            self.lost = con.execute(
                f"SELECT coalesce(sum(greatest(recomputed_tokens - (CASE WHEN loadback_skipped_reason IS NULL THEN 0 "
                f"ELSE least(loadback_skipped_tokens, recomputed_tokens) END) - (CASE WHEN storage_skipped_reason IS "
                f"NULL THEN 0 ELSE least(storage_match_tokens - storage_hit_tokens, recomputed_tokens) END), 0)), 0) "
                f"FROM requests WHERE {FIN}", r).fetchone()[0]
            self.in_batch = con.execute(f"SELECT coalesce(sum(miss_shared_in_batch_tokens), 0) FROM requests "
                                        f"WHERE {FIN}", r).fetchone()[0]
            self.turns = _later_turns(con, run.run_id)
            self.capacity = _capacity(con, run.run_id)
            self.device_host_found = con.execute(
                f"SELECT sum(device_hit_tokens + host_hit_tokens) FROM requests WHERE {FIN}", r).fetchone()[0]
            # Routing: a request's tokens another rank held on device or host at its arrival, beyond what
            # its own rank held or storage matched, that it recomputed (at most those).
            lost = ("CASE WHEN best_rank <> dp_rank THEN least(recomputed_tokens, greatest(best_rank_device_tokens "
                    "+ best_rank_host_tokens - arrival_device_tokens - arrival_host_tokens - storage_match_tokens, "
                    "0)) ELSE 0 END")
            self.routing = {b: (int(n or 0), int(k or 0)) for b, n, k in con.execute(
                f"SELECT coalesce(route_branch, '?'), sum({lost}), count(*) FILTER (WHERE {lost} > 0) "
                f"FROM requests WHERE {FIN} GROUP BY ALL", r).fetchall()}

    @property
    def recompute_per_token_ns(self) -> float:
        return self.batch_recompute_ns / self.recomputed if self.recomputed else 0.0

    @property
    def through(self) -> bool:
        return self.config.get("write_policy") == "write_through"

    def held(self) -> int:
        return self.config["host_tokens"] + (0 if self.through else self.config["device_tokens"])


def _hot_competing(con, rid: str) -> list[int]:
    """Per hot re-reference (hit 3 or more times before its removal), the hot tokens whose
    interval from last use to re-reference overlaps its own, its own included; token-weighted
    deciles. A pairwise loop: the runs here are small."""
    rows = con.execute(
        """SELECT re.tokens * least(1.0, greatest(q.recomputed_tokens
                      - (CASE WHEN q.loadback_skipped_reason IS NULL THEN 0 ELSE q.loadback_skipped_tokens END)
                      - (CASE WHEN q.storage_skipped_reason IS NULL THEN 0
                              ELSE greatest(q.storage_match_tokens - q.storage_hit_tokens, 0) END), 0)
                      / sum(re.tokens) OVER (PARTITION BY re.req_id)),
                  coalesce(e.node_hit_count, 0), coalesce(e.node_last_access_ns, 0), q.first_token_ns - q.prefill_ns
           FROM request_evictions re JOIN evictions e USING (run_id, eviction_id) JOIN requests q USING (run_id, req_id)
           WHERE re.run_id = ? AND e.action IN ('delete', 'drop') AND q.prefill_ns IS NOT NULL
             AND q.recomputed_tokens > 0""", [rid]).fetchall()
    hot = [(round(tok), t0, t1) for tok, hits, t0, t1 in rows if hits >= 3]
    pairs = sorted((max(sum(n for n, a, b in hot if a < t1 and b > t0), tok), tok) for tok, t0, t1 in hot)
    total, acc, out = sum(n for _, n in pairs), 0, []
    running = []
    for _, n in pairs:
        acc += n
        running.append(acc)
    for k in range(11):
        i = next((i for i, a in enumerate(running) if a >= (k * 0.1) * total), len(pairs) - 1)
        if pairs:
            out.append(pairs[i][0])
    return out


def _later_turns(con, rid: str) -> dict | None:
    """docs/contract.md "Sessions": the finished later turns (a predecessor that finished), each
    with its LRU stack distance over the pause: its predecessor's input + output, plus every other
    session (or sessionless request) that ran between the predecessor's finish and its schedule, once
    at its largest input + output less what that session's first turn found cached, plus the largest
    such shared prefix beyond its own session's."""
    cur = con.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY seq", [rid])
    names = [d[0] for d in cur.description]
    reqs = [dict(zip(names, t)) for t in cur.fetchall()]
    if not any(q["session_id"] is not None for q in reqs):
        return None

    def who(q):
        return q["session_id"] if q["session_id"] is not None else "#" + q["req_id"]

    def reused(q):
        return sum(q[k] or 0 for k in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                                        "recomputed_tokens"))

    def finished(q):
        return (q["status"] or "finished") == "finished" and q["ttft_ns"] is not None

    shared: dict = {}
    for q in reqs:
        shared.setdefault(who(q), reused(q))
    last: dict = {}
    turns = []
    for q in reqs:
        prev = last.get(q["session_id"]) if q["session_id"] is not None else None
        if q["session_id"] is not None:
            last[q["session_id"]] = q
        if (q["think_ms"] is None or prev is None or (prev["status"] or "finished") != "finished"
                or prev["finish_ns"] is None or not finished(q)):
            continue
        start, match = prev["finish_ns"], q["arrival_ns"] + (q["queue_ns"] or 0)
        touched: dict = {}
        for o in reqs:
            if (finished(o) and o["finish_ns"] is not None and o["arrival_ns"] <= match and o["finish_ns"] >= start
                    and o["session_id"] != q["session_id"]):
                k = who(o)
                touched[k] = max(touched.get(k, 0), (o["input_tokens"] or 0) + (o["output_tokens"] or 0))
        own = sum(max(v - shared[k], 0) for k, v in touched.items())
        most = max((shared[k] for k in touched), default=0)
        distance = (prev["input_tokens"] or 0) + (prev["output_tokens"] or 0) + own + max(most - shared[q["session_id"]], 0)
        turns.append({"think": q["think_ms"], "distance": distance, "input": q["input_tokens"],
                      "device": q["device_hit_tokens"] or 0, "host": q["host_hit_tokens"] or 0,
                      "storage": q["storage_hit_tokens"] or 0, "recomputed": q["recomputed_tokens"] or 0,
                      "reused": reused(q)})
    if not turns:
        return None
    thinks = sorted(t["think"] for t in turns)
    p90 = thinks[max(math.ceil(0.9 * len(thinks)) - 1, 0)]
    return {"turns": turns, "p90": p90, "pool": max(t["distance"] for t in turns if t["think"] <= p90)}


# --------------------------------------------------------------------------- the checks

# The kinds `_check` takes apart: every kind a registered advice rule proposes must be one
# (tests/diagnose/test_advice_registry.py), so a new rule's sentence is checked against the rows.
CHECKED_KINDS = frozenset({"capacity", "storage_tier", "prefetch", "write_policy", "eviction_policy", "page_size",
                           "session", "rate", "dp", "none", "in_batch", "router", "router_threshold"})


def _check(items: list[dict], rows: Rows, host_limit_bytes: int = 2 << 40, curves: dict | None = None) -> list[str]:
    """`curves`: summary --json's `size_curves` (the capacity rule sizes from their knees)."""
    bad: list[str] = []

    def need(cond: bool, what: str) -> None:
        if not cond:
            bad.append(what)

    cfg, rm = rows.config, rows.removed
    device, host, page = cfg.get("device_tokens"), cfg.get("host_tokens"), int(cfg.get("page_size") or 64)
    pools = (f"{host:,} tokens of host (write_through keeps a host copy of the device's)" if rows.through
             else f"{device + host:,} tokens of device + host")
    per_token = rows.kv * 1e9 / DISK_BYTES_PER_S if rows.kv else None
    for a in items:
        kind, text, pred = a["kind"], a["reason"], a.get("prediction") or ""
        need(bool(text), f"{kind}: no reason")
        need(kind in CHECKED_KINDS, f"no check for advice kind {kind}")
        if kind in ("capacity", "storage_tier"):
            m = re.match(rf"([\d,]+) once-cached tokens \({PCT} of input\) were deleted from host before they were "
                         rf"asked for again; their reuse distance is ([\d,]+) tokens at the median and ([\d,]+) at p90, "
                         rf"against (.*?); ", text) if kind == "capacity" else re.match(
                rf"keeping the ([\d,]+) tokens deleted from host up to their p90 reuse distance \(([\d,]+) tokens\) "
                rf"takes {BYTES} of host memory, beyond [^;]*; a ([\d,]+)-token storage tier keeps them", text)
            need(m is not None, f"{kind}: unparsed {text!r}")
            if m is None:
                continue
            dec = rm["deciles"]
            need(_n(m[1]) == rm["deleted"], f"{kind}: deleted {m[1]} vs {rm['deleted']}")
            if kind == "capacity":
                need(_pct_ok(m[2], rm["deleted"] / rows.input), f"capacity: share {m[2]}")
                need((_n(m[3]), _n(m[4])) == (dec[5], dec[9]), f"capacity: reuse {m[3]}, {m[4]} vs {dec}")
                need(m[5] == pools, f"capacity: pools {m[5]!r} vs {pools!r}")
                n = a["changes"]["host_tokens"]
                keep = re.search(rf"; (?:a ([\d,]+)-token host pool keeps|([\d,]+) tokens \({BYTES}, the most host "
                                 rf"memory [^)]*\) keep) {PCT} of them$", text)
                need(keep is not None and _n(keep[1] or keep[2]) == n, f"capacity: size in {text!r} vs {n}")
                curve = (curves or {}).get("tiers", {}).get("host")
                if curve is not None:  # sized at the host size curve's knee (diagnose/run/size_curves.py)
                    want = -(-(curve["knee_tokens"] + curves["slack_tokens"]) // page) * page
                else:
                    want = _pow2_pages(dec[9] if rows.through else dec[9] - device, page)
                need(n == want or (keep is not None and keep[2] is not None and n < want),
                     f"capacity: {n} vs {'the knee' if curve else 'the p90'}'s {want}")
                if keep is not None and keep[3]:
                    need(_bytes_ok(keep[3], n * rows.kv), f"capacity: bytes {keep[3]}")
                cover = _cover(dec, n if rows.through else device + n)
                need(keep is not None and _pct_ok(keep[4], cover), f"capacity: keeps {keep and keep[4]} vs {cover}")
                if curve is not None:
                    at = {pt["size_tokens"]: pt["reused_share"] for pt in curve["points"]}
                    p = re.fullmatch(rf"predicted in one pass \(size curve, LRU\): device and host find {PCT} of input "
                                     rf"at host_tokens ([\d,]+), against {PCT} at the run's ([\d,]+) \(the run found "
                                     rf"{PCT}\); the curve's knee is ([\d,]+) tokens, plus the median request's prefix "
                                     rf"\(([\d,]+)\) of slack: the engine evicts a whole tree node at a time", pred)
                    need(p is not None and _n(p[2]) == n and _n(p[4]) == host and _n(p[6]) == curve["knee_tokens"]
                         and (n not in at or _pct_ok(p[1], at[n])) and _pct_ok(p[3], at[host])
                         and _pct_ok(p[5], curve["found_tokens"] / curves["input_tokens"])
                         and _n(p[7]) == curves["slack_tokens"],
                         f"capacity: prediction {pred!r} vs the curve {at}")
                    # found: the run's own device + host hits, from the rows
                    need(curve["found_tokens"] == rows.device_host_found, f"capacity: found {curve['found_tokens']}")
                else:
                    p = re.fullmatch(r"predicted under LRU: keeps ~([\d,]+) of the ([\d,]+) tokens deleted from host",
                                     pred)
                    need(p is not None and (_n(p[1]), _n(p[2])) == (int(cover * rm["deleted"]), rm["deleted"]),
                         f"capacity: prediction {pred!r}")
            else:
                need(_n(m[2]) == dec[9], f"storage_tier: p90 {m[2]} vs {dec}")
                want = _pow2_pages(dec[9] if rows.through else dec[9] - device, page)
                need(_bytes_ok(m[3], want * rows.kv), f"storage_tier: host bytes {m[3]} vs {want} tokens")
                sto = (curves or {}).get("tiers", {}).get("storage")
                sto_want = (-(-(sto["knee_tokens"] + curves["slack_tokens"]) // page) * page if sto is not None
                            else _pow2_pages(dec[9], page))
                need(_n(m[4]) == a["changes"]["storage_tokens"] == sto_want, f"storage_tier: {m[4]} vs {sto_want}")
                _check_read(text, rows, per_token, need, kind)
                tail = (rf"; predicted in one pass \(size curve, LRU\): device, host and storage find {PCT} of input at "
                        rf"storage_tokens {sto_want:,}, against {PCT} at the run's [\d,]+ \(the run found {PCT}\); "
                        rf"the curve's knee is {sto['knee_tokens']:,} tokens, plus the median request's prefix "
                        rf"\({curves['slack_tokens']:,}\) of slack: the engine evicts a whole tree node at a time"
                        if sto is not None else "")
                p = re.search(r"prefetch_threshold ([\d,]+)\): keeps ~([\d,]+) of the lost tokens" + tail + "$", pred)
                need(p is not None and _n(p[1]) == int(cfg.get("prefetch_threshold") or 0)
                     and 0 < _n(p[2]) <= rows.lost, f"storage_tier: prediction {pred!r} vs lost {rows.lost}")
        elif kind == "prefetch":
            m = re.match(rf"([\d,]+) tokens \({PCT} of input\) were matched in storage but recomputed because their "
                         rf"prefetch had not completed when the request was scheduled \(prefetch_policy ([a-z_]+)\)", text)
            need(m is not None and _n(m[1]) == rows.late and _pct_ok(m[2], rows.late / rows.input)
                 and m[3] == cfg.get("prefetch_policy"), f"prefetch: {text!r} vs late {rows.late}")
            _check_read(text, rows, per_token, need, kind)
            need(pred.endswith(f"keeps ~{rows.late:,} of the lost tokens"), f"prefetch: prediction {pred!r}")
        elif kind == "write_policy":
            m = re.match(r"([\d,]+) once-cached tokens that were asked for again had been dropped from device without a "
                         r"host copy \(write_policy ([a-z_]+)\)", text)
            need(m is not None and _n(m[1]) == rm["dropped"] and m[2] == cfg.get("write_policy"),
                 f"write_policy: {text!r} vs {rm}")
        elif kind == "eviction_policy":
            m = re.match(r"([\d,]+) of the ([\d,]+) removed tokens that were asked for again came from hot prefixes "
                         r"\(hit 3 or more times\): eviction_policy ([a-z]+) evicted", text)
            need(m is not None and (_n(m[1]), _n(m[2])) == (rm["hot"], rm["deleted"] + rm["dropped"])
                 and m[3] == cfg.get("eviction_policy"), f"eviction_policy: {text!r} vs {rm}")
            kept = int(_cover(rows.hot_kept_deciles, rows.held()) * rm["hot"])
            need(f"keeps ~{kept:,} of the {rm['hot']:,} hot tokens lost" in pred and pred.endswith(f"fit {pools}"),
                 f"eviction_policy: prediction {pred!r} vs kept {kept}, {rows.hot_kept_deciles}")
        elif kind == "page_size":
            m = re.match(rf"load-backs ran at {PCT} of link peak, {BYTES} a page and ([\d,.]+) pages \({BYTES}\) per "
                         rf"contiguous run, and exposed load-back was {PCT} of the TTFT of the requests that loaded back",
                         text)
            need(m is not None, f"page_size: unparsed {text!r}")
            if m is not None:
                need(_pct_ok(m[1], rows.link_share), f"page_size: link {m[1]} vs {rows.link_share}")
                need(_bytes_ok(m[2], rows.lb_bytes / rows.lb_pages), f"page_size: page bytes {m[2]}")
                need(abs(float(m[3].replace(",", "")) - rows.lb_pages / rows.lb_runs) <= 0.05 + 1e-9,
                     f"page_size: pages per run {m[3]}")
                need(_bytes_ok(m[4], rows.lb_bytes / rows.lb_runs), f"page_size: run bytes {m[4]}")
                need(_pct_ok(m[5], rows.exposed_ns / rows.tiered_ttft_ns), f"page_size: exposed {m[5]}")
            p = re.search(rf"load-backs take ~{MS} instead of {MS}, exposed load-back ~{MS} instead of {MS}$", pred)
            need(p is not None and _ms_ok(p[2], rows.lb_busy_ns) and _ms_ok(p[4], rows.exposed_ns),
                 f"page_size: prediction {pred!r}")
        elif kind == "session":
            _check_session(a, rows, pools, need, host_limit_bytes)
        elif kind == "rate":
            cap = rows.capacity
            m = re.match(rf"offered prefill was ([\d,.]+)× one GPU for {PCT} of the run \({MS} windows, recompute "
                         rf"excluded; ([\d,.]+)× or more in 10 % of them\): no cache setting removes that queue; "
                         rf"time_scale ([\d.e+]+) spreads the arrivals ([\d,.]+)×", text)
            need(m is not None and cap is not None, f"rate: unparsed {text!r}")
            if m is None or cap is None:
                continue
            loads = sorted(cap["loads"])
            material = loads[max(math.ceil(round(0.9 * len(loads), 9)) - 1, 0)]  # nearest rank
            need(abs(float(m[1].replace(",", "")) - cap["factor"]) <= 0.05 + 1e-9, f"rate: factor {m[1]}")
            need(_pct_ok(m[2], cap["share"]) and _ms_ok(m[3], cap["window"]), f"rate: share/window {m[2]} {m[3]}")
            need(abs(float(m[4].replace(",", "")) - material) <= 0.05 + 1e-9, f"rate: material {m[4]} vs {material}")
            current = float(cfg.get("time_scale") or 1.0)
            want = current * max(material / 0.9, 1.0)
            e = math.floor(math.log10(want)) - 1
            want = round(math.ceil(round(want / 10 ** e, 9)) * 10 ** e, max(-e, 0))  # two significant digits, up
            need(float(m[5]) == want == a["changes"]["time_scale"], f"rate: time_scale {m[5]} vs {want}")
        elif kind == "dp":  # advice/rules/dp.py: the smallest N whose ranks are offered <= 0.9 at the material quantile
            cap = rows.capacity
            m = re.match(rf"queueing is {PCT} of the run's excess TTFT, and the offered prefill was ([\d,.]+)× one GPU "
                         rf"or more in the busiest 10 % of the {MS} windows \(recompute excluded\): it takes more ranks "
                         rf"\(or less traffic\) to shorten that queue; (\d+) ranks are each offered ([\d,.]+)× there$", text)
            need(m is not None and cap is not None, f"dp: unparsed {text!r}")
            if m is None or cap is None:
                continue
            loads = sorted(cap["loads"])
            material = loads[max(math.ceil(round(0.9 * len(loads), 9)) - 1, 0)]  # nearest rank
            need(_pct_ok(m[1], rows.queue_ns / rows.excess_ns), f"dp: queue share {m[1]}")
            need(abs(float(m[2].replace(",", "")) - material) <= 0.05 + 1e-9 and _ms_ok(m[3], cap["window"]),
                 f"dp: material {m[2]} vs {material}")
            n = max(math.ceil(material / 0.9 - 1e-9), 2)
            need(int(m[4]) == n == a["changes"]["dp"], f"dp: N {m[4]} vs {n}")
            need(abs(float(m[5].replace(",", "")) - material / n) <= 0.005 + 1e-9, f"dp: per rank {m[5]}")
        elif kind == "none":
            m = re.match(rf"nothing to change in the cache: {PCT} of input tokens were recomputed once-cached tokens"
                         rf"(?:; load-backs ran at {PCT} of link peak and took {MS} where recomputing the same tokens "
                         rf"would have cost {MS}(?: \(([\d,.]+)× more\))?)?$", text)
            need(m is not None and _pct_ok(m[1], (rows.recomputed or 0) / rows.input), f"none: {text!r}")
            if m is not None and m[2]:
                need(_pct_ok(m[2], rows.link_share) and _ms_ok(m[3], rows.tiered_lb_ns)
                     and _ms_ok(m[4], rows.tiered_recompute_ns), f"none: load-backs {text!r}")
                if m[5]:
                    need(abs(float(m[5].replace(",", "")) - rows.tiered_recompute_ns / rows.tiered_lb_ns) <= 0.05 + 1e-9,
                         f"none: ratio {m[5]}")
        elif kind == "in_batch":  # advice/rules/in_batch.py: the tokens shared within prefill batches (miss reasons)
            m = re.match(rf"([\d,]+) tokens \({PCT} of input\) were shared with requests in the same prefill batch: "
                         rf"under schedule_policy (\w+) ", text)
            need(m is not None, f"in_batch: unparsed {text!r}")
            if m is None:
                continue
            need(int(m[1].replace(",", "")) == rows.in_batch and _pct_ok(m[2], rows.in_batch / rows.input),
                 f"in_batch: {m[1]} vs {rows.in_batch}")
        elif kind in ("router", "router_threshold"):
            _check_routing(a, rows, need)
    return bad


def _check_routing(a: dict, rows: Rows, need) -> None:
    """'routing lost N tokens (P of input)': the rows' routing-lost tokens; the router's item adds
    the requests, ranks and router and the share of recomputed tokens, the threshold's the tokens
    of the rule (route_branch) that placed most of them."""
    kind, text, cfg = a["kind"], a["reason"], rows.config
    tokens = sum(n for n, _ in rows.routing.values())
    m = re.match(rf"routing lost ([\d,]+) tokens \({PCT} of input\)", text)
    need(m is not None and _n(m[1]) == tokens and _pct_ok(m[2], tokens / rows.input),
         f"{kind}: {text!r} vs {tokens} of {rows.input}")
    if kind == "router":
        r = re.match(rf"routing lost [\d,]+ tokens \({PCT} of input\) in ([\d,]+) requests across (\d+) ranks: at "
                     rf"their arrival another rank held the prefix on device or host and (\w+) sent them elsewhere "
                     rf"\({PCT} of the run's recomputed tokens\)", text)
        need(r is not None and _n(r[2]) == sum(k for _, k in rows.routing.values()) and int(r[3]) == cfg["dp"]
             and r[4] == cfg["router"] and _pct_ok(r[5], tokens / rows.recomputed), f"router: {text!r}")
        return
    branch, (branch_tokens, _) = max(rows.routing.items(), key=lambda kv: kv[1][0])
    r = re.search(r"; ([\d,]+) of it by cache_aware's (\w+) rule: ", text)
    need(r is not None and _n(r[1]) == branch_tokens and r[2] == branch,
         f"router_threshold: {text!r} vs {branch} {branch_tokens}")


def _check_read(text: str, rows: Rows, per_token: float | None, need, kind: str) -> None:
    """'a token comes from disk in X against Y to recompute it': the cost model's read of one token's
    KV, and the run's recompute (batches) over its recomputed tokens."""
    r = re.search(rf"a token comes from disk in {MS} against {MS} to recompute it", text)
    need(r is not None and per_token is not None and _ms_ok(r[1], per_token)
         and _ms_ok(r[2], rows.recompute_per_token_ns) and per_token < rows.recompute_per_token_ns,
         f"{kind}: read vs recompute in {text!r} ({per_token} vs {rows.recompute_per_token_ns})")


def _check_session(a: dict, rows: Rows, pools: str, need, host_limit_bytes: int) -> None:
    st = rows.turns
    text, pred = a["reason"], a.get("prediction") or ""
    need(st is not None, "session: advised without later turns")
    if st is None:
        return
    turns = st["turns"]
    lost = sum(t["recomputed"] + t["host"] + t["storage"] for t in turns)
    m = re.match(rf"([\d,]+) tokens of the reused prefix of ([\d,]+) later session turns \({PCT} of their input\) were "
                 rf"recomputed \(([\d,]+)\) or loaded back \(([\d,]+)\) after their pause; keep sessions alive for the "
                 rf"p90 pause \({MS}\): host pool of ([\d,]+) tokens.*?\(a turn paused up to p90 had at most ([\d,]+) "
                 rf"tokens touched, its own context included, between its predecessor's answer and its schedule, "
                 rf"against (.*)\)$", text)
    need(m is not None, f"session: unparsed {text!r}")
    if m is None:
        return
    need(_n(m[1]) == lost and _n(m[2]) == len(turns), f"session: {m[1]} lost of {m[2]} turns vs {lost}, {len(turns)}")
    need(_pct_ok(m[3], lost / sum(t["input"] for t in turns)), f"session: share {m[3]}")
    need(_n(m[4]) == sum(t["recomputed"] for t in turns), f"session: recomputed {m[4]}")
    need(_n(m[5]) == sum(t["host"] + t["storage"] for t in turns), f"session: loaded {m[5]}")
    need(_ms_ok(m[6], st["p90"] * 1e6), f"session: p90 pause {m[6]} vs {st['p90']} ms")
    need(_n(m[8]) == st["pool"], f"session: pool {m[8]} vs {st['pool']}")
    need(m[9] == pools, f"session: pools {m[9]!r}")
    device, host, page = rows.config["device_tokens"], rows.config["host_tokens"], int(rows.config.get("page_size") or 64)
    want = _pow2_pages(st["pool"] if rows.through else st["pool"] - device, page)
    need(_n(m[7]) == want and a["changes"]["host_tokens"] == min(want, host_limit_bytes // rows.kv),
         f"session: host pool {m[7]} vs {want}")
    reused = sum(t["reused"] for t in turns)

    def kept(cap: int) -> float:
        return sum(t["reused"] for t in turns if t["distance"] <= cap) / reused

    after = a["changes"]["host_tokens"] + (0 if rows.through else device)
    p = re.fullmatch(rf"predicted under LRU: keeps {PCT} of later turns' reused prefix on device or host, against {PCT} "
                     rf"with the pools now \(this run found {PCT} there\)", pred)
    need(p is not None and _pct_ok(p[1], kept(after)) and _pct_ok(p[2], kept(rows.held()))
         and _pct_ok(p[3], sum(t["device"] + t["host"] for t in turns) / reused), f"session: prediction {pred!r}")


def _sentences(*texts: str) -> list[str]:
    return [s.strip() for t in texts for s in re.split(r"(?<=[.:;])\s+", t) if len(s.strip()) > 24]


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("advice_claims")
    s = Story()
    bursty(s)
    return {"mixed": _synth(folder, "mixed", 300, 8, POOLS), "storage": _synth(folder, "mixed", 300, 30, STORAGE),
            "bursty": s.replay(folder / "bursty", {"model": "llama3-8b", "device_tokens": 16384, "host_tokens": 16384})}


@pytest.mark.parametrize("name", ["mixed", "storage", "bursty"])
def test_every_advice_number_is_the_rows_on_synth(synth_runs, name):
    """As `summary --json` prints them: the advice and everything tried, and no sentence of the
    diagnosis (claims, advice reasons, predictions) twice."""
    db = synth_runs[name]
    out = _invoke("summary", "--db", str(db), "--json")
    d = json.loads(out[out.index("{"):])["diagnosis"]
    items = d["advice"] + d["tried_not_advised"]
    assert any(a["option"] for a in items), [a["kind"] for a in items]
    bad = _check(items, Rows(db), curves=json.loads(out[out.index("{"):])["size_curves"])
    assert not bad, bad
    sentences = _sentences(*(c["text"] for c in d["claims"]), *(a["reason"] for a in items),
                           *(a["prediction"] or "" for a in items))
    assert len(sentences) == len(set(sentences)), [s for s in sentences if sentences.count(s) > 1]


def _planted(name: str):
    """(story, replay options, propose's host limit, the kind it plants)."""
    s = Story()
    if name == "capacity":
        _pushed_out(s)
        return s, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096}, 2 << 40, "capacity"
    if name == "storage_tier":
        _pushed_out(s, t_a2=20000)
        return (s, {"model": "llama3-70b", "device_tokens": 4096, "host_tokens": 8192}, 8192 * KV_70B,
                "storage_tier")
    if name == "prefetch":
        _pushed_out(s, t_a2=20000)
        return (s, {"model": "llama3-70b", "device_tokens": 4096, "host_tokens": 8192, "storage_tokens": 65536,
                    "prefetch_policy": "best_effort"}, 2 << 40, "prefetch")
    if name == "write_policy":
        _pushed_out(s, floods=3, a1_output=1)
        return (s, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 65536,
                    "write_policy": "write_through_selective"}, 2 << 40, "write_policy")
    if name == "eviction_policy":
        _hot_then_floods(s)
        return s, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096}, 2 << 40, "eviction_policy"
    if name == "page_size":
        s = Story(block=16)
        _fragmented(s)
        return s, PAGE_OPTIONS, 2 << 40, "page_size"
    if name == "none":
        _pushed_out(s)
        return s, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 65536}, 2 << 40, "none"
    overloaded(s)
    return s, {"model": "llama3-8b", "device_tokens": 16384, "host_tokens": 16384}, 2 << 40, "rate"


@pytest.mark.parametrize("name", ["capacity", "storage_tier", "prefetch", "write_policy", "eviction_policy",
                                  "page_size", "none", "rate"])
def test_every_advice_number_is_the_rows_planted(tmp_path, name):
    story, options, limit, kind = _planted(name)
    db = story.replay(tmp_path, options)
    with open_store(db) as con:
        run = resolve_run(con, None)
        items = [a.to_json() for a in propose(run_context(con, run), host_limit_bytes=limit,
                                              sessions=session_pauses(con, run))]
    assert kind in [a["kind"] for a in items], [a["kind"] for a in items]
    bad = _check(items, Rows(db), limit)
    assert not bad, bad
    sentences = _sentences(*(a["reason"] for a in items), *(a["prediction"] or "" for a in items))
    assert len(sentences) == len(set(sentences)), sentences


@pytest.fixture(scope="module")
def bursts_run(tmp_path_factory) -> Path:
    s = Story()
    bursty(s)
    return s.replay(tmp_path_factory.mktemp("routed"), {"model": "llama3-8b", "device_tokens": 16384,
                                                        "host_tokens": 16384})


@pytest.mark.parametrize("router,branch,kind", [("round_robin", None, "router"),
                                                ("cache_aware", "cache_miss", "router_threshold"),
                                                ("cache_aware", "imbalanced", "router_threshold")])
def test_every_advice_number_is_the_rows_routed(bursts_run, tmp_path, router, branch, kind):
    """The data-parallel rules' reasons (test_routing.plant_ranks makes the run a ranked one)."""
    import duckdb

    from .test_routing import plant_ranks

    db = tmp_path / "routed.duckdb"
    db.write_bytes(bursts_run.read_bytes())
    plant_ranks(db, routed=True, router=router)
    if branch is not None:
        con = duckdb.connect(str(db))
        con.execute("UPDATE requests SET route_branch = ? WHERE best_rank <> dp_rank", [branch])
        if branch == "cache_miss":  # the best rank held a fifth of each: a lower threshold matches it
            con.execute("""UPDATE requests SET best_rank_device_tokens = arrival_device_tokens + arrival_host_tokens
                               + storage_match_tokens + (input_tokens // 5) - best_rank_host_tokens
                           WHERE best_rank <> dp_rank""")
        con.close()
    with open_store(db) as con:
        run = resolve_run(con, None)
        items = [a.to_json() for a in propose(run_context(con, run))]
    assert kind in [a["kind"] for a in items], [a["kind"] for a in items]
    bad = _check(items, Rows(db))
    assert not bad, bad
