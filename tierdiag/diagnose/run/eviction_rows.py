"""The evidence's eviction queries (read/run_context.py `removed_rereferences`,
`device_evictions`; read/totals.py `evictions_by_tier`, `evictions_by_request` by owner and by
cause) made while the run is recorded, from the `requests`, `evictions` and `request_evictions`
rows the store's writer process takes, beside the story's rows (story_rows.py, whose fold
carries this one and checks it against the store with its own check, one statement), so that
the close, which the replay waits for, does not run them.

On the conversation trace these five statements were ~23 ms of the close's CPU (one thread,
load 3; issue 41, session 34): `removed_rereferences` a join of the re-references with the
delete/drop evictions and the requests, the tokens scaled by a window sum per request (~11.5
ms, the run context's thread, the longest), the rest a pass over every eviction each (the
summary's and totals' thread). Rows are only ever inserted, so a batch's part is final when
taken: each batch adds its groups' counts and sums (Python ints across batches, numpy's int64
within one, exact below _SAFE) and keeps the few columns the join and the semi-join read (the
delete/drop evictions' ids, hits and last uses; the device evictions' ids and tokens; the
re-references' ids, tokens and request; the requests' remaining tokens and schedule instant:
~50 bytes an eviction, at most MOST_ROWS requests' worth: the story's rule).

`EvictionRows.results` answers what the five queries return (the same values and types; the
re-references as a multiset: their one reader, runcontext.py's loss evidence, reads them only
through sums and sorted prefix sums, whatever their order), or None for a part where numpy
could differ from the SQL: a NULL the join, a group or a window would carry (declined, not
mimicked), a repeated request or eviction id (the join would repeat rows), a request's
re-referenced tokens summing to zero (a division by zero there), a magnitude past _SAFE
(tokens, ids, hits) or _NP_SAFE (instants). Held equal to the SQL on a replay's rows and on
hostile ones by tests/diagnose/test_eviction_rows.py."""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

# Tokens, ids and hit counts below this: a batch's int64 sums (at most 2^23 rows) exact, and
# every value (and a request's sum of them) exact as a double.
_SAFE = 1 << 40
# Instants below this: their differences stay in int64 (as read/run_context.py's).
_NP_SAFE = 1 << 55

REQUEST_NEED = ("req_id", "prefill_ns", "first_token_ns", "recomputed_tokens", "loadback_skipped_reason",
                "loadback_skipped_tokens", "storage_skipped_reason", "storage_match_tokens", "storage_hit_tokens")
EVICTION_NEED = ("eviction_id", "tier", "action", "tokens", "node_hit_count", "node_last_access_ns")
LINK_NEED = ("req_id", "eviction_id", "tokens")


def _text_codes(values) -> tuple:
    """(codes, words) of an Arrow string array: each row's index into `words` (its distinct
    values, in no defined order), -1 for a NULL. Where every value is at most 8 bytes, its last
    not NUL (a tier's, an action's), in numpy: each value's bytes as one integer, np.unique
    over them (a batch of ~3,000 evictions' tiers ~0.1 ms, against ~0.5 ms for their Python
    strings); else by the Python values (`_codes_of`)."""
    import numpy as np
    import pyarrow as pa

    from tierdiag.store.columns import arrow_valid

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n = len(values)
    t = values.type
    if not n or not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return _codes_of(values.to_pylist())
    _, offsets, data = values.buffers()
    width = np.int64 if pa.types.is_large_string(t) else np.int32
    off = np.frombuffer(offsets, dtype=width, count=values.offset + n + 1)[values.offset:].astype(np.int64)
    lens = off[1:] - off[:-1]
    if int(lens.max()) > 8:
        return _codes_of(values.to_pylist())
    valid = arrow_valid(values)
    chars = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    ends = off[1:][valid & (lens > 0)] - 1
    if len(ends) and not chars[ends].all():
        return _codes_of(values.to_pylist())  # a value ending in a NUL byte: its bytes alone do not say its length
    word = np.zeros(n, dtype=np.uint64)
    for k in range(int(lens.max())):  # byte k of each value, where it has one
        has = lens > k
        word[has] |= chars[off[:-1][has] + k].astype(np.uint64) << np.uint64(8 * k)
    # A value is its bytes (its last one not NUL); a NULL (whatever its offsets span) 0xFF
    # bytes, which no UTF-8 text holds.
    word[~valid] = _NULL_WORD
    distinct = np.unique(word)
    codes = np.searchsorted(distinct, word).astype(np.int64)
    words: list = []
    for w in distinct.tolist():
        if w != _NULL_WORD:
            b = w.to_bytes(8, "little")
            words.append(b[:len(b.rstrip(b"\x00"))].decode("utf-8"))
    if len(distinct) and int(distinct[-1]) == _NULL_WORD:  # the largest: its rows -1
        codes[codes == len(distinct) - 1] = -1
    return codes, words


_NULL_WORD = (1 << 64) - 1


def _codes_of(items: list) -> tuple:
    """`_text_codes` of Python values (None: -1), by C loops (`dict.fromkeys`, `map`)."""
    import numpy as np

    index = dict.fromkeys(items)
    index.pop(None, None)
    words = list(index)
    index = dict(zip(words, range(len(words))))
    index[None] = -1
    return np.fromiter(map(index.__getitem__, items), np.int64, len(items)), words


class _Groups:
    """Counts, sums and non-NULL counts by key, over every batch (GROUP BY: a few keys)."""

    def __init__(self) -> None:
        self.code: dict = {}
        self.count: list[int] = []
        self.sum: list[int] = []
        self.valid: list[int] = []

    def add(self, codes, keys: list, tokens, valid) -> None:
        """Each row's key as a code into `keys` (-1: the row left out), its tokens (int64) and
        whether they are not NULL."""
        import numpy as np

        keep = codes >= 0
        codes = codes[keep]
        m = len(keys)
        count = np.bincount(codes, minlength=m).tolist()
        summed = np.zeros(m, dtype=np.int64)
        np.add.at(summed, codes, np.where(valid[keep], tokens[keep], 0))
        summed = summed.tolist()
        nvalid = np.bincount(codes[valid[keep]], minlength=m).tolist()
        for c, key in enumerate(keys):
            if not count[c]:
                continue
            at = self.code.get(key)
            if at is None:
                self.code[key] = len(self.count)
                self.count.append(count[c])
                self.sum.append(summed[c])
                self.valid.append(nvalid[c])
            else:
                self.count[at] += count[c]
                self.sum[at] += summed[c]
                self.valid[at] += nvalid[c]


class EvictionResults(NamedTuple):
    """What the three eviction queries return, from a run's folded rows; `removed` None where
    it cannot be said as the SQL would (the caller queries it)."""
    removed: Any  # read/run_context.py RemovedRereferences, or None
    device: Any  # read/run_context.py DeviceEvictions
    by_tier: list  # [read/totals.py EvictionTotals], unordered (as the query's)


class _Columns:
    """Columns of rows appended batch by batch, each an array grown by doubling (the close reads
    them as they are: no concatenation of a run's batches in the close the replay waits for)."""

    def __init__(self, **dtypes) -> None:
        import numpy as np

        self.n = 0
        self.cols = {name: np.zeros(256, dtype=t) for name, t in dtypes.items()}

    def append(self, **arrays) -> None:
        import numpy as np

        k = len(next(iter(arrays.values())))
        need = self.n + k
        for name, a in self.cols.items():
            if need > len(a):
                grown = np.zeros(max(need, 2 * len(a)), dtype=a.dtype)
                grown[:self.n] = a[:self.n]
                self.cols[name] = a = grown
            a[self.n:need] = arrays[name]
        self.n = need

    def __getitem__(self, name: str):
        return self.cols[name][:self.n]


def _among(a, b):
    """Which of the ints `a` are among `b` (np.isin): by a table of their range where it is
    small (the engine's eviction ids: ~4x faster than by sorting), else by sorting."""
    import numpy as np

    if not len(a) or not len(b):
        return np.zeros(len(a), dtype=bool)
    lo, hi = min(int(a.min()), int(b.min())), max(int(a.max()), int(b.max()))
    return np.isin(a, b, kind="table" if hi - lo <= 4 * (len(a) + len(b)) + 4096 else None)


def take_parts(fold: Any, taken: dict, parts: tuple, what: str) -> None:
    """A fold's `take` of one batch the writer took (table -> column -> Arrow array): each (table,
    columns needed, part) in order; a table the batch lacks skipped, one without a needed column
    raises (the caller gives the fold up), a part's reason to decline gives it up (`fold._decline`)
    and stops. A fold given up (`fold.off`) takes nothing more."""
    if fold.off is not None:
        return
    for table, need, part in parts:
        cols = taken.get(table)
        if not cols:
            continue
        if any(name not in cols for name in need):
            raise ValueError(f"{table}: a batch without the columns {what} reads")
        why = part(cols)
        if why is not None:
            fold._decline(why)
            return


class EvictionRows:
    """The eviction queries' parts of the rows of one run, batch by batch (`take`), for its close
    (`results`). `take` raises what it cannot project (the caller, story_rows.py, gives up the
    parts then); `off` says why they were given up for rows the SQL would read otherwise."""

    def __init__(self) -> None:
        import numpy as np

        self.off: str | None = None
        # the request rows: id -> position; per position the remaining tokens, the schedule
        # instant, whether the removal join takes the row (a prefill, recomputed tokens)
        self.req_at: dict = {}
        self.requests = 0
        self.q = _Columns(x=np.int64, t1=np.int64, ok=bool)
        # the delete/drop evictions (id, deleted, dropped, hits, no last use, last use)
        self.dd = _Columns(id=np.int64, deleted=bool, dropped=bool, hits=np.int64, not0=bool, t0=np.int64)
        # the device evictions: count, tokens, and each one's id and tokens (the semi-join)
        self.dev_count = 0
        self.dev_tokens = 0
        self.dev = _Columns(id=np.int64, tok=np.int64)
        self.by_tier = _Groups()
        self.evictions = 0
        self.eviction_id_sum = 0
        # the re-references: (eviction id, request position or -1, tokens, tokens not NULL), the
        # ids of the requests not yet taken at theirs (position -1: looked up at the close)
        self.links = _Columns(id=np.int64, req=np.int64, tok=np.int64, ok=bool)
        self.pending: dict = {}  # request id -> its re-references' places (`links`) taken before it
        self.link_ids = _Columns(id=np.int64)  # every re-reference's eviction id (the device semi-join)
        self.link_count = 0
        self.link_id_sum = 0

    def _decline(self, why: str) -> None:
        self.off = why
        self.q = self.dd = self.dev = self.links = self.link_ids = None
        self.req_at = {}
        self.pending = {}

    def take(self, taken: dict) -> None:
        """A batch of rows the writer took (table -> column -> Arrow array)."""
        take_parts(self, taken, (("requests", REQUEST_NEED, self._requests), ("evictions", EVICTION_NEED, self._evictions),
                                 ("request_evictions", LINK_NEED, self._links)), "the eviction fold")

    def _requests(self, cols: dict) -> str | None:
        import numpy as np

        from tierdiag.store.columns import arrow_ints, arrow_valid

        ids = cols["req_id"].to_pylist()
        n = len(ids)
        before = len(self.req_at)
        self.req_at.update(zip(ids, range(self.requests, self.requests + n)))
        self.req_at.pop(None, None)
        if len(self.req_at) != before + n - ids.count(None):
            return "a repeated request id (the join repeats its rows)"
        self.requests += n
        valid = {c: arrow_valid(cols[c]) for c in REQUEST_NEED if c != "req_id"}
        v = {c: arrow_ints(cols[c], 0) for c in REQUEST_NEED if c not in ("req_id", "loadback_skipped_reason",
                                                                       "storage_skipped_reason")}
        ok = valid["prefill_ns"] & valid["recomputed_tokens"] & (v["recomputed_tokens"] > 0)
        lb, st = valid["loadback_skipped_reason"], valid["storage_skipped_reason"]
        if not (valid["first_token_ns"][ok].all() and (valid["loadback_skipped_tokens"] | ~lb)[ok].all()
                and ((valid["storage_match_tokens"] & valid["storage_hit_tokens"]) | ~st)[ok].all()):
            return "a NULL the removals' join carries (or its greatest passes over)"
        for c in ("recomputed_tokens", "loadback_skipped_tokens", "storage_match_tokens", "storage_hit_tokens"):
            if len(v[c]) and int(np.abs(v[c][ok]).max(initial=0)) >= _SAFE:
                return "tokens past the fold's exact range"
        for c in ("first_token_ns", "prefill_ns"):
            if len(v[c]) and int(np.abs(v[c][ok]).max(initial=0)) >= _NP_SAFE:
                return "an instant past int64's reach in a difference"
        rec = v["recomputed_tokens"]
        x = np.maximum(rec - np.where(lb, v["loadback_skipped_tokens"], 0)
                       - np.where(st, np.maximum(v["storage_match_tokens"] - v["storage_hit_tokens"], 0), 0), 0)
        self.q.append(x=np.where(ok, x, 0), t1=np.where(ok, v["first_token_ns"] - v["prefill_ns"], 0), ok=ok)
        if self.pending:  # re-references taken before their request: theirs now
            req = self.links.cols["req"]
            for rid in list(filter(self.pending.__contains__, ids)):  # a C loop over the batch's ids
                req[self.pending.pop(rid)] = self.req_at[rid]
        return None

    def _evictions(self, cols: dict) -> str | None:
        import numpy as np

        from tierdiag.store.columns import arrow_ints, arrow_valid

        eid, eid_ok = arrow_ints(cols["eviction_id"], 0), arrow_valid(cols["eviction_id"])
        tok, tok_ok = arrow_ints(cols["tokens"], 0), arrow_valid(cols["tokens"])
        hits, last = arrow_ints(cols["node_hit_count"], 0), arrow_ints(cols["node_last_access_ns"], 0)
        n = len(eid)
        if n and max(int(np.abs(eid).max()), int(np.abs(tok).max()), int(np.abs(hits).max())) >= _SAFE:
            return "an eviction's id, tokens or hits past the fold's exact range"
        if n and int(np.abs(last).max()) >= _NP_SAFE:
            return "a last use past int64's reach"
        self.evictions += n
        self.eviction_id_sum += int(eid[eid_ok].sum())
        (t_code, tiers), (a_code, actions) = _text_codes(cols["tier"]), _text_codes(cols["action"])
        pair = (t_code + 1) * (len(actions) + 1) + (a_code + 1)  # a NULL its own group too (GROUP BY's)
        pairs = [(None if t < 0 else tiers[t], None if a < 0 else actions[a])
                 for t in range(-1, len(tiers)) for a in range(-1, len(actions))]
        self.by_tier.add(pair, pairs, tok, tok_ok)

        def code_is(codes, words: list, word: str):
            return codes == words.index(word) if word in words else np.zeros(len(codes), dtype=bool)

        dev = code_is(t_code, tiers, "device")
        self.dev_count += int(dev.sum())
        dev_tok = np.where(tok_ok, tok, 0)[dev]
        self.dev_tokens += int(dev_tok.sum())
        self.dev.append(id=eid[dev & eid_ok], tok=np.where(tok_ok, tok, 0)[dev & eid_ok])
        deleted, dropped = code_is(a_code, actions, "delete"), code_is(a_code, actions, "drop")
        keep = (deleted | dropped) & eid_ok
        last_ok = arrow_valid(cols["node_last_access_ns"])
        self.dd.append(id=eid[keep], deleted=deleted[keep], dropped=dropped[keep], hits=hits[keep],
                       not0=~last_ok[keep], t0=last[keep])
        return None

    def _links(self, cols: dict) -> str | None:
        import numpy as np

        from tierdiag.store.columns import arrow_ints, arrow_valid

        eid, eid_ok = arrow_ints(cols["eviction_id"], 0), arrow_valid(cols["eviction_id"])
        tok, tok_ok = arrow_ints(cols["tokens"], 0), arrow_valid(cols["tokens"])
        n = len(eid)
        if n and max(int(np.abs(eid).max()), int(np.abs(tok).max())) >= _SAFE:
            return "a re-reference's id or tokens past the fold's exact range"
        self.link_count += n
        self.link_id_sum += int(eid[eid_ok].sum())
        self.link_ids.append(id=eid[eid_ok])
        reqs = cols["req_id"].to_pylist()
        keep = eid_ok & arrow_valid(cols["req_id"])  # a NULL id joins nothing
        # each one's request by a C loop (`map`: no NULL is a key), -1 for one not taken yet
        at = np.fromiter(map(self.req_at.get, reqs, itertools.repeat(-1)), np.int64, n)[keep]
        later = np.flatnonzero(at < 0)
        place = self.links.n
        self.links.append(id=eid[keep], req=at, tok=tok[keep], ok=tok_ok[keep])
        if len(later):
            rows = np.flatnonzero(keep)[later].tolist()
            for at_link, i in zip((place + later).tolist(), rows):
                self.pending.setdefault(reqs[i], []).append(at_link)
        return None

    def check(self) -> tuple:
        """What the store must hold for the parts to be its rows: (request rows, evictions, the
        sum of their ids, re-references, the sum of theirs): read/folded.py `folded_rows_check`'s
        last five."""
        return (self.requests, self.evictions, self.eviction_id_sum, self.link_count, self.link_id_sum)

    def results(self) -> EvictionResults | None:
        """The five queries' results from the parts (once checked against the store: the caller's)."""
        if self.off is not None:
            return None
        from tierdiag.diagnose.read.run_context import DeviceEvictions
        from tierdiag.diagnose.read.totals import EvictionTotals

        import numpy as np

        link_ids, dev_ids, dev_tok = self.link_ids["id"], self.dev["id"], self.dev["tok"]
        device = DeviceEvictions(self.dev_count, self.dev_tokens, int(dev_tok[_among(dev_ids, link_ids)].sum()))
        g = self.by_tier
        by_tier = [EvictionTotals(tier, action, g.count[i], g.sum[i] if g.valid[i] else None)
                   for (tier, action), i in g.code.items()]
        return EvictionResults(self._removed(), device, by_tier)

    def _removed(self):
        """`removed_rereferences`' rows (a multiset: in no defined order), or None."""
        import numpy as np

        from tierdiag.diagnose.read.run_context import RemovedRereferences

        e_id = self.dd["id"]
        if len(e_id) > 1 and not (e_id[1:] > e_id[:-1]).all():  # the engine's ids rise: sorted as taken
            by = np.argsort(e_id, kind="stable")
            e_sorted = e_id[by]
            if (e_sorted[1:] == e_sorted[:-1]).any():
                return None  # a repeated delete/drop eviction id: the join repeats its re-references
        else:
            by, e_sorted = None, e_id
        # (a re-reference whose request never came: -1, joins nothing, as in the SQL)
        l_id, l_req, l_tok, l_ok = self.links["id"], self.links["req"], self.links["tok"], self.links["ok"]
        q_x, q_t1, q_ok = self.q["x"], self.q["t1"], self.q["ok"]
        pos = np.searchsorted(e_sorted, l_id)
        inside = pos < len(e_sorted)
        joined = inside.copy()
        joined[inside] = e_sorted[pos[inside]] == l_id[inside]
        has_req = l_req >= 0
        joined &= has_req
        joined[joined] = q_ok[l_req[joined]]
        if not l_ok[joined].all():
            return None  # a NULL re-reference's tokens: NULL there and in its request's window sum
        req = l_req[joined]
        tok = l_tok[joined]
        if len(tok) and int(np.abs(tok).sum()) >= 1 << 53:
            return None  # a window's sum past a double's exact integers (bincount's)
        s = np.bincount(req, weights=tok, minlength=len(q_x)).astype(np.int64)[req]
        if (s == 0).any():
            return None  # the window's sum 0: a division by zero
        ratio = q_x[req].astype(np.float64) / s.astype(np.float64)
        tokens = tok.astype(np.float64) * np.minimum(1.0, ratio)
        e = pos[joined] if by is None else by[pos[joined]]
        dd = self.dd
        return RemovedRereferences(tokens, dd["deleted"][e], dd["dropped"][e], dd["hits"][e], dd["not0"][e], dd["t0"][e],
                                   q_t1[req])
