"""The waiting queue's order: a registry of SGLang's `--schedule-policy` values (`QUEUE_POLICIES`),
each naming the schedule_policy.py function it restates:

  fcfs                    arrival order (0.5.9, 0.5.23)
  lpm                     longest cached prefix first, with in-batch prefix deprioritization: the
                          device prefix under 0.5.9, device + host under 0.5.23 (the rule set's
                          `lpm_counts_host_hit`)
  hrrn                    highest response ratio next, token-based aging (0.5.23 only)
  shortest-prefill-first  fewest uncached input tokens first, the running chunk capped to leave
                          them room (0.5.23 only)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tierdiag.config.engine import SCHEDULE_POLICY_RELEASES
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RuleSet, rule_set
from tierdiag.errors import ConfigError

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


def _in_batch_deprioritized(req: Req, device_pages: int, ps: int, need: int, seen: set[int]) -> bool:
    """SchedulePolicy._compute_prefix_matches' in-batch check for one request, in queue order."""
    if device_pages * ps <= IN_BATCH_CHECK_TOKENS and len(req.keys) >= need:
        k = req.keys[need - 1]
        if k in seen:
            return True
        seen.add(k)
    return False


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
        if _in_batch_deprioritized(r, dev, ps, need, seen):
            r.sort_key = float("inf")
    waiting.sort(key=_sort_key)


def _sort_key(req: Req) -> float:
    return req.sort_key


def sort_by_matched_prefix(waiting: list[Req], match, ps: int, now: int) -> None:
    """SchedulePolicy._compute_prefix_matches + _sort_by_longest_prefix (SGLang 0.5.23): key
    -`num_matched_prefix_tokens` (device + host, capped at input - 1: `common.match_kv_cache`),
    the in-batch deprioritized last (+inf); the sort is stable, so ties keep queue order."""
    keys = {}
    for r, deprioritized, matched in _matched(waiting, match, ps, now):
        keys[r.seq] = float("inf") if deprioritized else -matched
    waiting.sort(key=lambda r: keys[r.seq])


def _matched(waiting: list[Req], match, ps: int, now: int) -> list[tuple[Req, bool, int]]:
    """SchedulePolicy._compute_prefix_matches (0.5.23) through `common.match_kv_cache`: each waiting
    request, whether the in-batch check deprioritizes it, and its `num_matched_prefix_tokens` =
    min(prefix_len + host_hit_length, input - 1) — device *and* host tokens count as cached. The
    match itself is NOT capped: `_compute_prefix_matches` passes the whole input + output
    (page-aligned) to `match_kv_cache` without `max_prefix_len`, so the walk stamps (and splits)
    up to the input's last full page, one page past `init_next_round_input`'s capped match; only
    the count is capped (`_compute_max_prefix_len` of that length). The in-batch check reads that
    uncapped match's device prefix (`r.prefix_len`)."""
    need = -(-IN_BATCH_DEPRIORITIZE_TOKENS // ps)
    seen: set[int] = set()
    out = []
    for r in waiting:
        m = match(r.keys[:r.fill_len // ps], now)
        matched = min((m.device_pages + m.host_pages) * ps, r.fill_len - 1)
        out.append((r, _in_batch_deprioritized(r, m.device_pages, ps, need, seen), matched))
    return out


def sort_by_hrrn(waiting: list[Req], match, ps: int, now: int, processed: int, arrived: dict[int, int],
                 rules: RuleSet | None = None) -> None:
    """SchedulePolicy._sort_by_hrrn (SGLang 0.5.23), highest response ratio next with token-based
    aging: ratio - 1 = (processed_tokens - arrival_processed_tokens) / uncached, where
    processed_tokens counts every prefill token the scheduler has run (`processed_tokens_counter
    += batch.extend_num_tokens`), arrival_processed_tokens is that counter when the request joined
    the queue, and uncached = `_uncached_len` = input - num_matched_prefix_tokens (device + host).
    Keys, smallest first: a request with nothing to prefill (-inf), then by ratio descending, the
    in-batch deprioritized last (+inf); ties by rid (SGLang's string order)."""
    keys = {}
    for r, deprioritized, matched in _matched(waiting, match, ps, now):
        uncached = max(0, r.input_len - matched)
        if deprioritized:
            k = float("inf")
        elif uncached <= 0:
            k = -float("inf")
        else:
            k = -max(0, processed - arrived.get(r.seq, processed)) / uncached
        keys[r.seq] = (k, r.req_id)
    waiting.sort(key=lambda r: keys[r.seq])


def sort_by_shortest_prefill(waiting: list[Req], match, ps: int, now: int, processed: int,
                             arrived: dict[int, int], rules: RuleSet | None = None) -> None:
    """SchedulePolicy._sort_by_shortest_prefill (SGLang 0.5.23): key (in-batch deprioritized,
    `_shortest_prefill_work`, wait_queue_entry_time), where work = max(1, len(origin_input_ids) +
    len(output_ids) - num_matched_prefix_tokens): the uncached part, device and host hits both
    counted as cached, and a retracted request's output so far counted too (`fill_len`). Ties go
    to the earlier queue entry, a retracted request's being its retraction
    (`_add_request_to_queue` -> `set_wait_queue_entry_time`). Never falls back to FCFS (not in
    `_determine_active_policy`'s list)."""
    keys = {}
    for r, deprioritized, matched in _matched(waiting, match, ps, now):
        r.prefill_work_tokens = max(1, r.fill_len - matched)  # read by the chunk cap below
        keys[r.seq] = (deprioritized, r.prefill_work_tokens, r.queue_entry)
    waiting.sort(key=lambda r: keys[r.seq])


def shortest_prefill_chunk_limit(chunked: Req, waiting: list[Req], budget: int, ps: int) -> int | None:
    """SchedulePolicy.shortest_prefill_chunk_limit (SGLang 0.5.23): cap the running chunked
    request's next chunk so shorter waiting requests fit beside it. Walking the sorted queue,
    each request whose work (`_shortest_prefill_work`, from the sort just run) is shorter than
    what the chunked request has left reserves its page-ceiled work, while the reservations stay
    within budget - a page; the chunk gets the rest, page-floored. None (no cap): a budget under
    two pages, or nothing reserved."""
    if budget < 2 * ps:
        return None
    remaining = chunked.fill_len - chunked.done_tokens  # full_untruncated_fill_ids: input + output so far
    reserved = 0
    for r in waiting:
        work = r.prefill_work_tokens
        charge = -(-work // ps) * ps
        if work >= remaining or reserved + charge > budget - ps:
            break
        reserved += charge
    if not reserved:
        return None
    return (budget - reserved) // ps * ps


def _lpm(waiting, match, ps, now, processed, arrived, rules: RuleSet) -> None:
    if rules.lpm_counts_host_hit:
        sort_by_matched_prefix(waiting, match, ps, now)
    else:
        sort_by_device_prefix(waiting, match, ps, now)


@dataclass(frozen=True)
class QueuePolicy:
    """One `--schedule-policy` value: how it orders the waiting queue (None: arrival order), past
    how many waiting it falls back to FCFS (None: never), the SGLang releases that have it, the
    cap it puts on the running chunked request's next chunk (None: none), and the rule set of
    the release it runs under (bound by `queue_policy`)."""
    name: str
    sort: Callable | None
    fcfs_past: int | None
    releases: tuple[str, ...]
    cites: str
    chunk_limit: Callable[[Req, list[Req], int, int], int | None] | None = None
    rules: RuleSet | None = None

    def cache_aware(self, waiting: list[Req]) -> bool:
        """`SchedulePolicy._determine_active_policy`: whether the policy that orders `waiting`
        this pass matches the queue (a cache-aware one not fallen back to FCFS past its limit)."""
        return self.sort is not None and (self.fcfs_past is None or len(waiting) <= self.fcfs_past)

    def order(self, waiting: list[Req], match, ps: int, now: int, processed: int, arrived: dict[int, int]) -> None:
        """Sorts `waiting` in place (SchedulePolicy.calc_priority) before a batch is formed. A
        single waiting request is matched too: calc_priority has no shortcut for one (0.5.9 and
        0.5.23 both run `_compute_prefix_matches` on any queue), and that match stamps its path
        (a policy with a chunk cap also reads the work it finds)."""
        if self.sort is None or not waiting:
            return
        if self.fcfs_past is not None and len(waiting) > self.fcfs_past:
            return
        self.sort(waiting, match, ps, now, processed, arrived, self.rules or rule_set(self.releases[0]))


# The releases that have each policy are the config's (config/engine.py SCHEDULE_POLICY_RELEASES,
# which RELEASE_OFFERS fills); one policy a name of SCHEDULE_POLICIES (tests/test_registries.py).
_R = SCHEDULE_POLICY_RELEASES
QUEUE_POLICIES: dict[str, QueuePolicy] = {p.name: p for p in (
    QueuePolicy("fcfs", None, None, _R["fcfs"], "CacheAgnosticPolicy.FCFS"),
    QueuePolicy("lpm", _lpm, LPM_MAX_WAITING, _R["lpm"], "_sort_by_longest_prefix"),
    QueuePolicy("hrrn", sort_by_hrrn, LPM_MAX_WAITING, _R["hrrn"], "_sort_by_hrrn"),
    QueuePolicy("shortest-prefill-first", sort_by_shortest_prefill, None, _R["shortest-prefill-first"],
                "_sort_by_shortest_prefill", chunk_limit=shortest_prefill_chunk_limit),
)}


def queue_policy(name: str, release: str, rules: RuleSet | None = None) -> QueuePolicy:
    """The registry's policy for `--schedule-policy name` under SGLang `release`: one SGLang
    release did not have is refused (its server would reject the flag). `rules`: the rule set
    the replay follows, where some rules are switched back (rules.config_rules); else the
    release's."""
    policy = QUEUE_POLICIES.get(name)
    if policy is None:
        raise ConfigError(f"unknown --schedule-policy {name!r}; known: {', '.join(QUEUE_POLICIES)}")
    if release not in policy.releases:
        raise ConfigError(f"--schedule-policy {name} is not in SGLang {release} (it has "
                          f"{', '.join(n for n, p in QUEUE_POLICIES.items() if release in p.releases)})",
                          hint=f"use --sglang {policy.releases[-1]}")
    return replace(policy, rules=rules or rule_set(release))
