"""When SGLang's `max_running_requests` cap held a request's wait: the times its rank ran `cap`
requests (its running batch: a request joins at its first token and leaves at its finish), so
`get_num_allocatable_reqs` was 0 and no prefill batch could be formed, whatever the GPU's load
(docs/engine.md "Running requests"). Shared by explain (one request: `at_cap_ns`) and the run's
story (every request at once: `at_cap_arrays`, numpy); tests/diagnose/test_running_cap.py holds
both to a brute-force count."""

from __future__ import annotations


def at_cap_intervals(spans: list[tuple[int, int]], cap: int) -> list[tuple[int, int]]:
    """The times at least `cap` of the half-open `spans` [a, b) cover, as sorted disjoint
    intervals. A sweep: +1 at each start, -1 at each end, an end before a start at the same
    instant (the request leaving no longer runs)."""
    events = sorted([(a, 1) for a, b in spans if b > a] + [(b, -1) for a, b in spans if b > a],
                    key=lambda e: (e[0], e[1]))
    out: list[tuple[int, int]] = []
    count, i = 0, 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            count += events[i][1]
            i += 1
        if count >= cap and i < len(events):
            nxt = events[i][0]
            if out and out[-1][1] == t:
                out[-1] = (out[-1][0], nxt)
            else:
                out.append((t, nxt))
    return out


def at_cap_ns(spans: list[tuple[int, int]], cap: int, lo: int, hi: int) -> int:
    """The time in [lo, hi) while at least `cap` of `spans` were running."""
    return sum(max(min(b, hi) - max(a, lo), 0) for a, b in at_cap_intervals(spans, cap))


def at_cap_arrays(a, b, cap: int):
    """`at_cap_intervals` over numpy arrays of starts and ends: (starts, ends), sorted and
    disjoint (touching pieces may stay apart: every measure of them is the same)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    keep = b > a
    t = np.concatenate([a[keep], b[keep]])
    if not len(t):
        return t, t
    n = int(keep.sum())
    d = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])
    order = np.lexsort((d, t))
    t, count = t[order], np.cumsum(d[order])
    last = np.r_[t[1:] != t[:-1], True]  # the count after every event at that instant
    tt, cc = t[last], count[last]
    held = cc[:-1] >= cap
    return tt[:-1][held], tt[1:][held]
