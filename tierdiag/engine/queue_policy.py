"""The waiting queue's order: FCFS, or LPM (longest device prefix first) with SGLang's in-batch
prefix deprioritization (schedule_policy.py, SGLang 0.5.9).
"""

from __future__ import annotations

from tierdiag.engine.request import Req

# Like SGLang (SchedulePolicy._determine_active_policy), LPM falls back to FCFS past 128 waiting:
# matching every waiting request before every batch would cost more than it saves. (0.5.23 names
# it WAITING_QUEUE_PREFIX_MATCH_MAX, still 128, and applies it to HRRN as well.)
LPM_MAX_WAITING = 128
# schedule_policy.py IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD (tokens): a waiting
# request whose cached device prefix is at most CHECK tokens, and that shares at least
# DEPRIORITIZE tokens with a request ahead of it in the queue, goes last for this batch, so the
# one ahead computes the shared prefix once.
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


def sort_by_device_prefix(waiting: list[Req], match, ps: int, now: int) -> None:
    """SchedulePolicy._compute_prefix_matches + _sort_by_longest_prefix (SGLang 0.5.9): every
    waiting request is matched (touching access times) and ranked by its *device* prefix;
    one whose device prefix is at most IN_BATCH_CHECK_TOKENS and that shares at least
    IN_BATCH_DEPRIORITIZE_TOKENS with a request ahead of it is moved to the end. The sort is
    stable, so ties keep queue order.

    SGLang's in-batch check runs on a token-level tree of the waiting inputs; page keys see
    whole pages only, so "shares >= 32 tokens" is read as "shares the pages covering 32
    tokens" (exact for page sizes of 32 and up). `match` is the tree's."""
    need = -(-IN_BATCH_DEPRIORITIZE_TOKENS // ps)  # pages that cover the threshold
    seen: set[int] = set()  # chained keys: sharing key j means sharing pages 0..j
    for r in waiting:
        dev = match(r.keys, now).device_pages
        r.sort_key = -dev
        if dev * ps <= IN_BATCH_CHECK_TOKENS and len(r.keys) >= need:
            k = r.keys[need - 1]
            if k in seen:
                r.sort_key = float("inf")
            else:
                seen.add(k)
    waiting.sort(key=_sort_key)


def _sort_key(req: Req) -> float:
    return req.sort_key
