"""cache_aware's approximate tree: what the router *believes* each rank caches.

SGLang's model gateway keeps one multi-tenant radix tree per model (policies/tree.rs, `Tree`):
every node records, per worker ("tenant"), when that worker last touched it. It is fed only by
the router's own decisions: `Tree::insert(text, worker)` on every routed request, whatever the
worker later computes, keeps or evicts. It is never told of the worker's real evictions, never
of output tokens, never of a request the worker refused. Its only forgetting is its own:
`Tree::evict_tenant_by_size(max_tree_size)`, run every `eviction_interval_secs` by a background
thread, drops each over-size worker's least recently touched leaves until the worker is back
under the limit.

Here the nodes are page keys. A key stands for its whole prefix (trace/pages.py), so a tree of
page keys needs no node splitting: each key is one node whose parent is the key before it, and
a worker's set of keys stays prefix-closed (it gains keys by inserting whole prefixes and loses
only leaves). The gateway's functions map one to one:

    Tree::insert(text, tenant)        insert(keys, rank, tick): attach rank to every key, touch it
    Tree::prefix_match(text)          prefix_match(keys, tick): longest run of keys in the tree,
                                      one tenant of the deepest matched node, touched to the root
    Tree::prefix_match_tenant         the per-rank depths prefix_match returns beside it
    Tree::leaf_of / evict_tenant_by_size   evict(max_pages): per over-size rank, oldest leaf first
    Tree::get_smallest_tenant         smallest_rank(): fewest pages (first rank on a tie)
    tenant_char_count                 pages[rank] (× page size = the tokens compared to the limit)

How each rank's keys are kept: `ApproxTree` (what the router uses) keeps them as a radix tree of
runs, a run's keys sharing one tick, as tree.rs's nodes hold a run of text with one timestamp a
tenant; `ApproxTreeByKey`, a dict of key -> tick a rank, is its reference (issue 41: a dict
update a page was the --dp 8 replay's largest routing cost).

Two choices the gateway leaves to a hash map's iteration order are fixed here so a replay repeats
itself: the tenant of the deepest node is the one that touched it last (the token tree's
`get_any_tenant` prefers its cached `last_tenant`, a recent toucher), then the lowest rank; and
time is a counter the caller advances (the token tree's `next_timestamp()`), not wall-clock
milliseconds, so eviction order has no ties between requests.
"""

from __future__ import annotations

import heapq
from array import array
from itertools import repeat
from typing import Any, MutableSequence, Sequence


def first_smallest(pages: list[int]) -> int:
    """Tree::get_smallest_tenant: the rank with the fewest pages, the first on a tie:
    min(range(len(pages)), key=pages.__getitem__) as a plain loop (strictly fewer moves it;
    ~5,000 instructions a call fewer compiled, at 8 ranks)."""
    rank, least = 0, pages[0]
    for r in range(1, len(pages)):
        p = pages[r]
        if p < least:
            rank, least = r, p
    return rank


class ApproxTreeByKey:
    """Per rank, the keys it holds and the tick it last touched each (`_ticks[rank]`), and the
    children it holds of each key (`_kids[rank]`); `_parent` for every key some rank holds.

    Keys must be prefix-chained (RequestView.page_keys are): a key always has the same parent,
    and a rank's keys stay prefix-closed, so the pages of a request a rank holds are a prefix of
    the request's keys, found by binary search (`_held`) instead of a walk, and a path's ticks
    are set in one dict update. The deployment routes every request through here (tens of
    thousands a replay, hundreds of pages each): a walk a page in Python was most of the
    replay's time at --dp 8 (benchmarks/README.md, "Data-parallel replay").

    The reference of `ApproxTree` (runs of keys, a tick a run), which the router uses: the same
    methods, the same answers (tests/engine/test_routing.py runs both on the same operations).
    Here every page of a routed request is a dict update: ~190 a request on the conversation
    trace, each a cache miss in a rank's dict of hundreds of thousands of keys."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._ticks: list[dict[int, int]] = [{} for _ in range(num_ranks)]  # rank -> {key: tick}
        self._kids: list[dict[int, int]] = [{} for _ in range(num_ranks)]  # rank -> {key: children held}
        self._parent: dict[int, int | None] = {}  # key -> the key before it (None: first page)
        self.pages = [0] * num_ranks  # tenant_char_count, in pages

    def __len__(self) -> int:
        """Nodes in the tree (keys any rank holds)."""
        return len(set().union(*self._ticks))

    def holds(self, rank: int, key: int) -> bool:
        return key in self._ticks[rank]

    @staticmethod
    def _held(ticks: dict[int, int], keys: Sequence[int]) -> int:
        """How many leading `keys` a rank holds (its keys are prefix-closed: a binary search)."""
        n = len(keys)
        if not n or keys[0] not in ticks:
            return 0
        if keys[n - 1] in ticks:
            return n
        lo, hi = 1, n - 1  # keys[lo - 1] held, keys[hi] not
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in ticks:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def insert(self, keys: Sequence[int], rank: int, tick: int, held: int | None = None) -> None:
        """Tree::insert: `rank` holds every key of `keys`, each touched at `tick`. `held`: how many
        leading keys the rank holds already, when the caller knows (prefix_match's depth for it)."""
        ticks = self._ticks[rank]
        if held is None:
            held = self._held(ticks, keys)
        n = len(keys)
        # (update from pairs: ~20 % less than from a dict.fromkeys of the keys, a few hundred a request)
        ticks.update(zip(keys, repeat(tick)))
        if held == n:
            return
        keys = list(keys)
        self.pages[rank] += n - held
        kids = self._kids[rank]
        if held:
            parent = keys[held - 1]
            kids[parent] = kids.get(parent, 0) + 1
        kids.update(zip(keys[held:n - 1], repeat(1)))  # each new key's one child: the next key
        parents = self._parent
        parents.update(zip(keys[held:], [keys[held - 1] if held else None] + keys[held:n - 1]))

    def prefix_match(self, keys: Sequence[int], tick: int, *, touch: bool = True
                     ) -> tuple[int, int | None, list[int]]:
        """(matched pages, the rank of the deepest matched node or None, pages each rank holds of
        `keys`' prefix). Touches the chosen rank along the matched path, as Tree::prefix_match
        does before the policy has decided anything; `touch=False` leaves that to the caller
        (cache_aware skips it when the chosen rank is the one it inserts for: same keys, same
        tick)."""
        held = self._held
        depth_of = [held(ticks, keys) for ticks in self._ticks]
        depth = max(depth_of)
        if depth == 0:
            return 0, None, depth_of
        last = keys[depth - 1]
        chosen = max((r for r in range(self.num_ranks) if depth_of[r] == depth),
                     key=lambda r: (self._ticks[r][last], -r))
        if touch:
            self.touch(keys[:depth], chosen, tick)
        return depth, chosen, depth_of

    def touch(self, keys: Sequence[int], rank: int, tick: int) -> None:
        """Mark `rank`'s use of a path it holds (the timestamp walk of Tree::prefix_match)."""
        self._ticks[rank].update(zip(keys, repeat(tick)))

    def smallest_rank(self) -> int:
        return first_smallest(self.pages)

    def evict(self, max_pages: int) -> int:
        """Tree::evict_tenant_by_size: for every rank over `max_pages`, drop its least recently
        touched leaves (a parent left without that rank's children becomes a leaf in turn) until
        it holds `max_pages`. Ranks are independent: a leaf is a leaf per rank. Returns the
        (key, rank) entries dropped."""
        dropped = 0
        for rank in range(self.num_ranks):
            if self.pages[rank] <= max_pages:
                continue
            ticks, kids = self._ticks[rank], self._kids[rank]
            heap = [(t, key) for key, t in ticks.items() if not kids.get(key)]
            heapq.heapify(heap)
            while heap and self.pages[rank] > max_pages:
                _, key = heapq.heappop(heap)
                parent = self._parent[key]  # before the drop, which may remove the node
                self._drop(key, rank)
                dropped += 1
                if parent is not None and not kids.get(parent):
                    heapq.heappush(heap, (ticks[parent], parent))
        return dropped

    def _drop(self, key: int, rank: int) -> None:
        del self._ticks[rank][key]
        self.pages[rank] -= 1
        parent = self._parent[key]
        if parent is not None:
            kids = self._kids[rank]
            left = kids[parent] - 1
            if left:
                kids[parent] = left
            else:
                del kids[parent]
        if not any(key in ticks for ticks in self._ticks):  # no rank holds it: the node goes
            del self._parent[key]

    def check(self) -> None:
        """Invariants, for tests: every rank's keys are prefix-closed, the page counts and child
        counts agree with the nodes."""
        for r, ticks in enumerate(self._ticks):
            kids: dict[int, int] = {}
            for key in ticks:
                assert key in self._parent, f"rank {r} holds {key}, which has no node"
                parent = self._parent[key]
                if parent is not None:
                    assert parent in ticks, f"rank {r} holds {key} but not its parent {parent}"
                    kids[parent] = kids.get(parent, 0) + 1
            assert len(ticks) == self.pages[r], f"rank {r}: page count {self.pages[r]} != counted {len(ticks)}"
            assert kids == self._kids[r], f"rank {r}: child counts drifted from the nodes"
        assert set(self._parent) == set().union(*self._ticks), "a node no rank holds was not removed"


class _Run:
    """A node of one rank's tree: a run of keys, each the parent of the next (a key inside a run
    has no other child in that rank), all last touched by that rank at `tick`; `children` by
    their first key. `keys` is the slice of the routed request's keys it was made from: an
    int64 run (array('q'): what the deployment routes on) or a list (a caller routing lists)."""
    __slots__ = ("keys", "tick", "children", "parent")

    def __init__(self, keys: MutableSequence[int], tick: int, parent: "_Run | None") -> None:
        self.keys = keys
        self.tick = tick
        self.children: dict[int, _Run] = {}
        self.parent = parent


class ApproxTree:
    """`ApproxTreeByKey` with a tick a run of keys instead of a tick a key: per rank, a radix
    tree of `_Run`s. A key's tick is its run's: a touch (insert, the path a match touches) stamps
    every run of its path and, where the path ends inside a run, splits that run there first,
    so the keys of a run always share their tick. A routed request is then a handful of runs
    (the turns of its session that went to that rank), not ~190 dict updates of a page each.

    Keys are prefix-chained (the key names its whole prefix), so a run matches as far as its
    last key that equals the request's key at the same depth: one comparison for a whole run, a
    binary search in the run where the request leaves it. Eviction pops a rank's leaf keys in
    (tick, key) order as the reference does: a leaf key is the last key of a run without
    children, and dropping it makes the key before it (or, the run emptied, its parent run's
    last key) a leaf at its run's tick. The answers are the reference's, step for step
    (tests/engine/test_routing.py runs both on hypothesis-generated operations)."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._roots = [_Run([], 0, None) for _ in range(num_ranks)]  # a rank's root: no keys
        self.pages = [0] * num_ranks  # tenant_char_count, in pages

    def __len__(self) -> int:
        """Nodes in the tree (keys any rank holds)."""
        return len(set().union(*(self._ticks_of(r) for r in range(self.num_ranks))))

    def _runs(self, rank: int) -> list[_Run]:
        """Every run of `rank`'s tree (not its root)."""
        out: list[_Run] = []
        stack = list(self._roots[rank].children.values())
        while stack:
            run = stack.pop()
            out.append(run)
            stack.extend(run.children.values())
        return out

    def _ticks_of(self, rank: int) -> dict[int, int]:
        """{key: tick} of every key `rank` holds (the reference's `_ticks[rank]`; a walk of the
        whole tree: for tests and `__len__`)."""
        return {key: run.tick for run in self._runs(rank) for key in run.keys}

    def holds(self, rank: int, key: int) -> bool:
        return key in self._ticks_of(rank)

    @staticmethod
    def _path(root: _Run, keys: Sequence[int], tick: int | None = None) -> tuple[int, _Run]:
        """(how many leading `keys` the rank of `root` holds, the run holding the last of them:
        `root` when none). With `tick`, touches the runs of that path at `tick`, the last one
        split first where the path ends inside it."""
        node = root
        i, n = 0, len(keys)
        while i < n:
            child = node.children.get(keys[i])
            if child is None:
                break
            run = child.keys
            m = len(run)
            if i + m <= n and keys[i + m - 1] == run[m - 1]:
                if tick is not None:
                    child.tick = tick
                i += m
                node = child
                continue
            c = _common(run, keys, i, n)
            if tick is not None:
                _split(child, c)
                child.tick = tick
            return i + c, child
        return i, node

    def insert(self, keys: Sequence[int], rank: int, tick: int, held: int | None = None) -> None:
        """Tree::insert: `rank` holds every key of `keys`, each touched at `tick`. (`held`, how
        many leading keys the rank holds already, is the reference's; the walk here finds it.)"""
        i, node = self._path(self._roots[rank], keys, tick)
        n = len(keys)
        if i < n:
            # The run keeps the slice as it comes: an int64 run's slice is one memcpy, where a
            # list of it was an int object a page (~17,000 instructions a routed request at
            # --dp 8, callgrind; 2.3 M keys, ~90 MB of int objects and lists the collector
            # walks, on the whole conversation trace). The walks read a few keys a run.
            rest = keys[i:]
            node.children[keys[i]] = _Run(rest if type(rest) is array or type(rest) is list else list(rest), tick, node)
            self.pages[rank] += n - i

    def prefix_match(self, keys: Sequence[int], tick: int, *, touch: bool = True
                     ) -> tuple[int, int | None, list[int]]:
        """ApproxTreeByKey.prefix_match: (matched pages, the rank of the deepest matched node or
        None, pages each rank holds of `keys`' prefix)."""
        # (`ApproxTree._path` named on the class: a native call, compiled; the bound method
        # read into a local was a generic Python call a rank, ~2,000 instructions each)
        depth_of: list[int] = []
        ends: list[_Run] = []
        for root in self._roots:
            d, end = ApproxTree._path(root, keys)
            depth_of.append(d)
            ends.append(end)
        depth = max(depth_of)
        if depth == 0:
            return 0, None, depth_of
        # the tick of the deepest matched key in each rank (its run's): the latest, the lowest
        # rank on a tie (the key (tick, -rank) at its largest)
        chosen = -1
        latest = 0
        for r in range(self.num_ranks):
            if depth_of[r] == depth:
                t = ends[r].tick
                if chosen < 0 or t > latest:
                    chosen, latest = r, t
        if touch:
            self.touch(keys[:depth], chosen, tick)
        return depth, chosen, depth_of

    def touch(self, keys: Sequence[int], rank: int, tick: int) -> None:
        """Mark `rank`'s use of a path it holds (the timestamp walk of Tree::prefix_match)."""
        self._path(self._roots[rank], keys, tick)

    def smallest_rank(self) -> int:
        return first_smallest(self.pages)

    def evict(self, max_pages: int) -> int:
        """ApproxTreeByKey.evict: for every rank over `max_pages`, drop its least recently touched
        leaf keys, (tick, key) order, until it holds `max_pages`. Returns the entries dropped."""
        dropped = 0
        for rank in range(self.num_ranks):
            if self.pages[rank] <= max_pages:
                continue
            root = self._roots[rank]
            # (keys are unique in a rank: the run in the tuple is never compared)
            heap = [(run.tick, run.keys[-1], run) for run in self._runs(rank) if not run.children]
            heapq.heapify(heap)
            while heap and self.pages[rank] > max_pages:
                _, key, run = heapq.heappop(heap)
                run.keys.pop()
                self.pages[rank] -= 1
                dropped += 1
                if run.keys:  # the key before it: a leaf now, its run's tick
                    heapq.heappush(heap, (run.tick, run.keys[-1], run))
                    continue
                parent = run.parent
                assert parent is not None
                del parent.children[key]
                if parent is not root and not parent.children:
                    heapq.heappush(heap, (parent.tick, parent.keys[-1], parent))
        return dropped

    def check(self) -> None:
        """Invariants, for tests: every run has keys, its parent's link and its first key as its
        name there; no rank holds a key twice; the page counts agree with the runs."""
        for r in range(self.num_ranks):
            seen: set[int] = set()
            for run in self._runs(r):
                assert run.keys, f"rank {r}: an empty run"
                assert run.parent is not None and run.parent.children.get(run.keys[0]) is run, \
                    f"rank {r}: run {run.keys[0]} is not its parent's child"
                assert seen.isdisjoint(run.keys), f"rank {r} holds a key twice"
                seen.update(run.keys)
            assert len(seen) == self.pages[r], f"rank {r}: page count {self.pages[r]} != counted {len(seen)}"


def _common(run: Sequence[int], keys: Sequence[int], i: int, n: int) -> int:
    """How many leading keys of `run` equal keys[i:] (at least 1: the run was found by keys[i]).
    Keys are prefix-chained, so the keys agree up to the last position where they agree: a
    binary search."""
    lo, hi = 1, min(len(run), n - i)  # run[:lo] agrees; run[hi:] is past the request or disagrees
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[i + mid - 1] == run[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _split(run: _Run, c: int) -> None:
    """Split `run` after its first `c` keys (c < len): the rest becomes its only child, with its
    tick and children."""
    keys = run.keys
    if c >= len(keys):
        return
    tail = _Run(keys[c:], run.tick, run)
    tail.children = run.children
    for child in tail.children.values():
        child.parent = tail
    run.keys = keys[:c]
    run.children = {keys[c]: tail}


def cache_aware_decide(tree: Any, keys: Sequence[int], loads: tuple[int, ...], tick: int,
                       page_tokens: int, input_tokens: int, name: object, abs_thr: Any, rel_thr: Any,
                       thr: float, thr_text: str, miss_min_load: bool) -> tuple:
    """CacheAwareRouter.route's decision after its eviction and tick (routing/cache_aware.py, whose
    own body is the reference, run for any other tree): the imbalance test, the match, the miss
    rule, the touch and the insert, and RouteDecision's fields in order. Compiled with the tree:
    the router's interpreted frames (is_imbalanced, the scores' generator, the miss rule's call,
    the tree's calls through their wrappers) were ~30,000 instructions a request at --dp 8
    (issue 41, session 27). `abs_thr` / `rel_thr`: the config's values as they are (`Any`:
    compared, multiplied and written as the reference does); `name`: the router's name (a StrEnum).
    `tree`: an ApproxTree or its C twin (router_tree.NativeApproxTree, `Any`: its calls generic,
    their answers checked as the types below)."""
    n = len(loads)
    hi = lo = loads[0]
    least = 0  # base.least_loaded(loads): the first rank with the smallest load, found in the same loop
    for r in range(1, n):
        x = loads[r]
        if x > hi:
            hi = x
        if x < lo:
            lo, least = x, r
    if hi - lo > abs_thr and hi > rel_thr * lo:  # (Any: Python's own operations, exact for any number type)
        rank = least
        tree.insert(keys, rank, tick)
        # (each format spec its own `format` call: compiled, an f-string with one spec made every
        # piece of it a '{:{}}'.format call, ~1,600 instructions each; the texts are the f-string's)
        return (rank, name, "imbalanced",
                f"imbalanced: max load {hi} - min {lo} > " + format(abs_thr, "") + f" and {hi} > "
                + format(rel_thr, "g") + f" × {lo}: shortest queue rank {rank}",
                float(loads[rank]), "in flight", tuple([float(x) for x in loads]))
    found: tuple[int, int | None, list[int]] = tree.prefix_match(keys, tick, touch=False)
    matched, holder, depth_of = found
    per_token = page_tokens / input_tokens if input_tokens else 0.0
    rate = matched * per_token
    scores = tuple([d * per_token for d in depth_of])
    if holder is not None and rate > thr:
        rank = holder
        branch = "cache_hit"
        reason = "cache_aware: match " + format(rate, ".2f") + f" > {thr_text} on rank {rank}"
    else:
        if miss_min_load:
            rank = least
            where = f"least loaded rank {rank} ({loads[rank]} in flight)"
        else:
            pages: list[int] = tree.pages
            rank = first_smallest(pages)
            where = f"smallest tree rank {rank} (" + format(pages[rank] * page_tokens, ",") + " tokens)"
        branch = "cache_miss"
        reason = "cache_aware: best match " + format(rate, ".2f") + f" <= {thr_text}: {where}"
    if holder is not None and holder != rank:  # Tree::prefix_match touched it before the choice
        tree.touch(keys[:matched], holder, tick)
    tree.insert(keys, rank, tick, depth_of[rank])
    return (rank, name, branch, reason, rate, "approx match", scores)


class CacheAwareHead:
    """CacheAwareRouter's state that its route reads and writes every request, and the route's
    head over it: the page size seen, the eviction pass due, the tick, then the decision by
    `cache_aware_decide` where `at_once` (routing/cache_aware.py keeps one a router, `head`, reads
    the same state through its properties, and sets `at_once` where its tree, miss rule and
    `decide_at_once` allow the one call). Compiled with the tree: the router's interpreted route
    frame was ~5,500 instructions a request at --dp 8 (its attribute reads, the head's tests, a
    12-argument call into the compiled decision; issue 41, session 36); routing/gateway.py calls
    `route` here natively, without that frame, while the policy's own route is the one that would
    run (not patched on the instance or the class). This source is its Python twin."""

    def __init__(self, tree: Any, name: object, interval_ns: int) -> None:
        self.tree: Any = tree
        self.name: object = name  # the router's name (a StrEnum): RouteDecision.router
        self.interval_ns = interval_ns  # eviction_interval_secs in ns; <= 0: never
        self.next_eviction_ns = interval_ns
        self.tick = 0
        self.page_tokens_seen = 0  # the page size requests come with (one per run)
        self.evictions = 0  # eviction passes run
        self.evicted_pages = 0  # (page, rank) entries they dropped
        self.at_once = False  # route decides by cache_aware_decide (else None: the router's own body)
        self.miss_min_load = False  # the miss rule: the least loaded rank (else the smallest tree)
        # the config's values as the reference reads them (`configure`)
        self.thr = 0.0
        self.thr_text = ""  # the threshold as every reason writes it, made once
        self.abs_thr: Any = 0
        self.rel_thr: Any = 0.0
        self.max_tree_tokens = 0

    def configure(self, config: Any) -> None:
        """Read a RouterConfig's thresholds (the router's config set, first or in its place)."""
        thr = config.router_cache_threshold
        self.thr = thr
        self.thr_text = f"{thr:.2f}"
        self.abs_thr = config.router_balance_abs_threshold
        self.rel_thr = config.router_balance_rel_threshold
        self.max_tree_tokens = config.router_max_tree_tokens

    def evict_due(self, now_ns: int) -> None:
        """Tree::evict_tenant_by_size where an interval of virtual time has passed."""
        interval = self.interval_ns
        if interval <= 0 or now_ns < self.next_eviction_ns:
            return
        max_pages = self.max_tree_tokens // max(1, self.page_tokens_seen)
        dropped: int = self.tree.evict(max_pages)
        self.evicted_pages += dropped
        self.evictions += 1
        self.next_eviction_ns = (now_ns // interval + 1) * interval

    def route(self, request: tuple, loads: tuple[int, ...], now_ns: int) -> tuple | None:
        """CacheAwareRouter.route for `request` (a RequestView) and the ranks' in-flight `loads`:
        its head, then RouteDecision's fields in order where `at_once`; None where not (the tick
        taken: the router's own body decides with it)."""
        page_tokens: int = request[3]
        self.page_tokens_seen = page_tokens
        if now_ns >= self.next_eviction_ns:  # (evict_due's own test: its call only when one may be due)
            self.evict_due(now_ns)
        self.tick = tick = self.tick + 1
        if not self.at_once:
            return None
        return cache_aware_decide(self.tree, request[1], loads, tick, page_tokens, request[2], self.name,
                                  self.abs_thr, self.rel_thr, self.thr, self.thr_text, self.miss_min_load)
