"""Routers in front of data-parallel ranks (tierdiag/engine/routing), narrated request by request.

Page keys here are small ints standing for whole prefixes, as Mooncake hash ids do: [1, 2, 3] and
[1, 2, 7] share their first two pages; [9, 2] shares nothing with them (key 2 under a different
first page would be a different key in a real trace; the tests never reuse a key under two
parents). Pages are 64 tokens and every request is exactly its pages unless said otherwise.

Each test names the SGLang model gateway function it follows (sgl-model-gateway/src/policies/).
"""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.routing import ROUTERS, Gateway, RanksView, RequestView, RouterConfig, make_router
from tierdiag.engine.routing.approx_tree import ApproxTree, ApproxTreeByKey, first_smallest
from tierdiag.engine.routing.cache_aware import is_imbalanced
from tierdiag.errors import ConfigError

PS = 64
S = 1_000_000_000  # ns a second


def rq(req_id: str, keys, *, extra_tokens: int = 0, session: str | None = None) -> RequestView:
    return RequestView(req_id, list(keys), len(keys) * PS + extra_tokens, PS, session)


def gateway(router: str, n: int, **kw) -> Gateway:
    return Gateway(RouterConfig(router=router, **kw), n)


# --- the registry and the config ------------------------------------------------------------------

def test_the_registry_holds_the_seven_routers_of_the_issue():
    assert set(ROUTERS) == {"round_robin", "random", "shortest_queue", "power_of_two", "session", "prefix_hash",
                            "cache_aware"}
    for name, cls in ROUTERS.items():
        assert cls.name == name and cls.follows, name


def test_an_unknown_router_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown router 'least_work'; known: cache_aware, power_of_two, "
                                          r"prefix_hash, random, round_robin, session, shortest_queue"):
        RouterConfig(router="least_work")
    with pytest.raises(ConfigError, match="known: min_load, smallest_tree"):
        RouterConfig(router_cache_miss="largest_tree")


def test_defaults_are_the_gateways_command_line():
    # RouterArgs in sglang_router/router_args.py: cache_threshold 0.3, balance_abs_threshold 64,
    # balance_rel_threshold 1.5, eviction_interval_secs 60, max_tree_size 2**26.
    cfg = RouterConfig()
    assert (cfg.router_cache_threshold, cfg.router_balance_abs_threshold, cfg.router_balance_rel_threshold,
            cfg.router_eviction_interval_s, cfg.router_max_tree_tokens) == (0.3, 64, 1.5, 60.0, 2**26)
    # PrefixHashConfig::default(): prefix_token_count 256, load_factor 1.25.
    assert (cfg.router_prefix_hash_tokens, cfg.router_prefix_hash_load_factor) == (256, 1.25)


@pytest.mark.parametrize("key, value, message", [
    ("router_cache_threshold", 1.5, r"router_cache_threshold 1.5 must be in \[0, 1\]"),
    ("router_cache_threshold", float("nan"), "must be a finite number"),
    ("router_balance_abs_threshold", -1, "router_balance_abs_threshold -1 must be at least 0"),
    ("router_balance_abs_threshold", 6.5, "must be an integer"),
    ("router_balance_rel_threshold", 0.0, r"router_balance_rel_threshold 0.0 must be in \(0, 1e\+06\]"),
    ("router_eviction_interval_s", -1.0, "must be in"),
    # issue 39, item 12: accepted, then the replay crashed turning it into ns
    ("router_eviction_interval_s", 1e300, r"router_eviction_interval_s 1e\+300 must be in \[0, 1e\+09\]"),
    ("router_max_tree_tokens", 0, "must be at least 1"),
    ("router_prefix_hash_tokens", 0, "must be at least 1"),
    ("router_prefix_hash_load_factor", -2.0, "must be in"),
    ("seed", -3, "seed -3 must be at least 0"),
])
def test_config_refuses_values_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        RouterConfig(**{key: value})


def test_from_config_reads_the_router_keys_off_another_config():
    class Engineish:
        router = "cache_aware"
        router_cache_threshold = 0.5
        seed = 7
        model = "llama3-8b"  # not a router key: ignored

    cfg = RouterConfig.from_config(Engineish())
    assert (cfg.router, cfg.router_cache_threshold, cfg.seed, cfg.router_balance_abs_threshold) == \
        ("cache_aware", 0.5, 7, 64)


def test_a_deployment_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        make_router(RouterConfig(), 0)


# --- the gateway's load ---------------------------------------------------------------------------

def test_the_gateway_counts_requests_in_flight_per_rank():
    gw = gateway("round_robin", 2)
    a, b, c = rq("a", [1]), rq("b", [2]), rq("c", [3])
    assert [gw.route(r, 0).rank for r in (a, b, c)] == [0, 1, 0]
    assert gw.in_flight == (2, 1)
    gw.finish(0, a, 10)
    assert gw.in_flight == (1, 1)
    gw.finish(0, c, 10)
    gw.finish(1, b, 10)
    assert gw.in_flight == (0, 0)
    with pytest.raises(AssertionError, match="nothing in flight"):
        gw.finish(1, b, 11)


# --- round_robin: round_robin.rs RoundRobinPolicy::select_worker ---------------------------------

def test_round_robin_takes_turns_whatever_the_load():
    gw = gateway("round_robin", 3)
    for i, expected in enumerate([0, 1, 2, 0, 1, 2, 0]):
        d = gw.route(rq(f"r{i}", [100 + i]), i)
        assert d.rank == expected, i
        assert d.reason == f"round_robin: turn {i} of 3 ranks: rank {expected}"
    assert gw.in_flight == (3, 2, 2)  # rank 0 got the seventh although it was the busiest


# --- random: random.rs RandomPolicy::select_worker, seeded ---------------------------------------

def test_random_draws_the_seeded_generators_sequence():
    gw = gateway("random", 5, seed=11)
    reference = np.random.default_rng(11)
    for i in range(40):
        assert gw.route(rq(f"r{i}", [i + 1]), i).rank == int(reference.integers(5)), i


def test_random_depends_on_the_seed_only():
    def ranks(seed):
        gw = gateway("random", 4, seed=seed)
        return [gw.route(rq(f"r{i}", [1]), i).rank for i in range(60)]

    assert ranks(3) == ranks(3)
    assert ranks(3) != ranks(4)
    assert set(ranks(3)) == {0, 1, 2, 3}


# --- shortest_queue: cache_aware.rs select_worker_min_load ---------------------------------------

def test_shortest_queue_follows_the_load_the_gateway_tracks():
    gw = gateway("shortest_queue", 3)
    r = [rq(f"r{i}", [i + 1]) for i in range(8)]
    assert gw.route(r[0], 0).rank == 0  # all idle: the first rank
    assert gw.route(r[1], 1).rank == 1
    assert gw.route(r[2], 2).rank == 2
    assert gw.route(r[3], 3).rank == 0  # (1, 1, 1): the first again
    assert gw.in_flight == (2, 1, 1)
    gw.finish(2, r[2], 4)  # (2, 1, 0)
    d = gw.route(r[4], 5)
    assert (d.rank, d.reason) == (2, "shortest_queue: rank 2 has the least in flight (2, 1, 0)")
    gw.finish(0, r[0], 6)
    gw.finish(0, r[3], 6)  # (0, 1, 1)
    assert gw.route(r[5], 7).rank == 0


def test_shortest_queue_compares_polled_tokens_when_given():
    gw = gateway("shortest_queue", 3)
    gw.route(rq("a", [1]), 0)  # in flight (1, 0, 0)
    d = gw.route(rq("b", [2]), 1, pending_tokens=[10, 9000, 500])
    assert (d.rank, d.score_name, d.scores) == (0, "pending tokens", (10.0, 9000.0, 500.0))


# --- power_of_two: power_of_two.rs PowerOfTwoPolicy::select_worker -------------------------------

def test_power_of_two_keeps_the_less_loaded_of_two_distinct_draws():
    seed, n = 5, 4
    router = make_router(RouterConfig(router="power_of_two", seed=seed), n)
    reference = np.random.default_rng(seed)
    loads = (7, 0, 3, 3)
    for i in range(30):
        a = int(reference.integers(n))
        b = (a + 1 + int(reference.integers(n - 1))) % n  # the gateway's offset: never a == b
        assert a != b
        expected = a if loads[a] <= loads[b] else b
        d = router.route(rq(f"r{i}", [1]), RanksView(loads), i)
        assert d.rank == expected, i
        assert d.reason == f"power_of_two: drew ranks {a} and {b}, in flight {loads[a]} vs {loads[b]}: rank {expected}"
        assert d.rank != 0  # rank 0 is the most loaded: it can only lose a pair


def test_power_of_two_with_one_rank_draws_nothing():
    gw = gateway("power_of_two", 1)
    assert [gw.route(rq(f"r{i}", [1]), i).rank for i in range(3)] == [0, 0, 0]


# --- session: consistent_hashing.rs, a routing key on a hash ring ---------------------------------

def test_session_keeps_every_turn_of_a_session_on_one_rank_whatever_the_load():
    gw = gateway("session", 4)
    first = gw.route(rq("s1-t0", [1, 2], session="s1"), 0)
    assert first.branch == "session" and first.reason == f"session: session 's1' hashes to rank {first.rank}"
    for t in range(1, 6):  # later turns grow the history; nothing finishes, the rank piles up
        d = gw.route(rq(f"s1-t{t}", [1, 2, 10 + t], session="s1"), t)
        assert d.rank == first.rank, t
    assert gw.in_flight[first.rank] == 6


def test_session_without_a_session_keys_by_the_first_page_then_the_id():
    gw = gateway("session", 4)
    a = gw.route(rq("a", [5, 6, 7]), 0)
    b = gw.route(rq("b", [5, 8]), 1)  # same first page, different rest
    assert a.branch == b.branch == "first_page" and a.rank == b.rank
    tiny = gw.route(rq("tiny", [], extra_tokens=12), 2)
    assert tiny.branch == "request_id" and tiny.rank == gateway("session", 4).route(rq("tiny", [], extra_tokens=1), 0).rank


def test_session_spreads_sessions_over_all_ranks():
    gw = gateway("session", 4)
    counts = [0] * 4
    for i in range(400):
        counts[gw.route(rq(f"r{i}", [1], session=f"user-{i}"), i).rank] += 1
    assert all(40 <= c <= 160 for c in counts), counts  # 1/4 is 100; a ring of 160 points a rank


# --- prefix_hash: prefix_hash.rs PrefixHashPolicy::find_worker_with_load_balance ------------------

def test_prefix_hash_groups_requests_by_their_first_k_pages():
    # 256 tokens at 64 a page: the first 4 pages decide.
    router = make_router(RouterConfig(router="prefix_hash"), 8)
    idle = RanksView((0,) * 8)
    base = router.route(rq("a", [1, 2, 3, 4, 5, 6]), idle, 0)
    assert base.branch == "ring" and "first 4 pages" in base.reason
    assert router.route(rq("b", [1, 2, 3, 4, 90, 91]), idle, 1).rank == base.rank  # differs after page 4
    short = router.route(rq("c", [1, 2]), idle, 2)
    assert "first 2 pages" in short.reason  # fewer than K pages: all of them
    # A different first page makes every later key different too: other prefixes, spread over the ring.
    ranks = {router.route(rq(f"x{i}", [1000 + 10 * i + j for j in range(4)]), idle, i).rank for i in range(64)}
    assert len(ranks) == 8


def test_prefix_hash_gives_way_when_the_ring_rank_is_overloaded():
    router = make_router(RouterConfig(router="prefix_hash"), 4)
    keys = [1, 2, 3, 4]
    ring = router.route(rq("a", keys), RanksView((0, 0, 0, 0)), 0).rank
    # Total 12 + 1 incoming over 4 ranks: the bound is 13 / 4 × 1.25 = 4.06.
    loads = [3, 3, 3, 3]
    loads[ring] = 8
    others = [r for r in range(4) if r != ring]
    loads[others[0]], loads[others[1]], loads[others[2]] = 2, 1, 1
    total = sum(loads)
    d = router.route(rq("b", keys), RanksView(tuple(loads)), 1)
    limit = (total + 1) / 4 * 1.25
    assert d.branch == "load_walk" and d.rank == others[1]  # the first least loaded within the bound
    assert d.reason == (f"prefix_hash: first 4 pages hash to rank {ring}, overloaded (load 8 > {limit:.2f}): "
                        f"rank {others[1]}")


def test_prefix_hash_places_a_request_without_a_full_page_on_the_least_loaded_rank():
    router = make_router(RouterConfig(router="prefix_hash"), 3)
    d = router.route(rq("tiny", [], extra_tokens=30), RanksView((4, 2, 2)), 0)
    assert (d.rank, d.branch) == (1, "no_full_page")


# --- cache_aware: cache_aware.rs CacheAwarePolicy::select_worker, tree.rs Tree ---------------------

def test_cache_aware_routes_by_its_approximate_match_and_else_to_the_smallest_tree():
    gw = gateway("cache_aware", 2)
    # A: nothing in the tree; match 0 <= 0.3, both trees empty: the first smallest tree.
    d = gw.route(rq("A", [1, 2, 3, 4]), 0)
    assert (d.rank, d.branch) == (0, "cache_miss")
    assert d.reason == "cache_aware: best match 0.00 <= 0.30: smallest tree rank 0 (0 tokens)"
    # B: unrelated; rank 0's tree has 4 pages, rank 1's none.
    d = gw.route(rq("B", [20, 21, 22, 23]), 1)
    assert d.rank == 1 and d.reason == "cache_aware: best match 0.00 <= 0.30: smallest tree rank 1 (0 tokens)"
    # A grown by two pages: 4 of 6 pages match on rank 0 -> 0.67 > 0.3.
    d = gw.route(rq("A2", [1, 2, 3, 4, 5, 6]), 2)
    assert (d.rank, d.branch, d.reason) == (0, "cache_hit", "cache_aware: match 0.67 > 0.30 on rank 0")
    assert d.score == pytest.approx(4 / 6) and d.scores == pytest.approx((4 / 6, 0.0))
    # C shares only the first page with A: 1 of 4 = 0.25 <= 0.3, so the smaller tree (rank 1, 4 pages
    # against rank 0's 6) gets it, and now holds page 1 too.
    d = gw.route(rq("C", [1, 12, 13, 14]), 3)
    assert d.rank == 1 and d.reason == "cache_aware: best match 0.25 <= 0.30: smallest tree rank 1 (256 tokens)"
    # D: pages 1 and 2 of A. Page 1 is on both ranks, page 2 on rank 0 only: the deepest match is
    # rank 0's, 2 of 4 = 0.5; rank 1's own tree holds 1 page of it (0.25).
    d = gw.route(rq("D", [1, 2, 30, 31]), 4)
    assert (d.rank, d.reason) == (0, "cache_aware: match 0.50 > 0.30 on rank 0")
    assert d.scores == pytest.approx((0.5, 0.25))


def test_cache_aware_match_rate_counts_the_partial_last_page_as_unmatched():
    gw = gateway("cache_aware", 2)
    gw.route(rq("A", [1, 2]), 0)  # rank 0
    # 2 full pages of 64 matched out of 128 + 200 tokens: 128 / 328 = 0.39.
    d = gw.route(rq("A+", [1, 2, 3, 4, 5], extra_tokens=8), 1)
    assert d.score == pytest.approx(128 / 328) and d.rank == 0


def test_cache_aware_sends_misses_to_the_least_loaded_rank_under_the_gateways_later_rule():
    # sgl-model-gateway's select_worker: a miss goes to min_by_key(worker.load()).
    gw = gateway("cache_aware", 3, router_cache_miss="min_load")
    gw.route(rq("A", [1, 2]), 0)  # miss: (0, 0, 0) -> rank 0
    gw.route(rq("B", [3, 4]), 1)  # miss: (1, 0, 0) -> rank 1
    d = gw.route(rq("C", [5, 6]), 2)
    assert d.rank == 2 and d.reason == "cache_aware: best match 0.00 <= 0.30: least loaded rank 2 (0 in flight)"


@pytest.mark.parametrize("loads, imbalanced", [
    ((130, 40), True),    # 90 > 64 and 130 > 60
    ((104, 40), False),   # 64 is not more than 64
    ((105, 40), True),
    ((200, 134), False),  # 66 > 64 but 200 <= 1.5 x 134 = 201
    ((202, 134), True),
    ((65, 0), True),      # an idle rank: any max above 0 passes the relative test
    ((64, 0), False),
])
def test_cache_aware_imbalance_needs_both_thresholds(loads, imbalanced):
    assert is_imbalanced(loads, 64, 1.5) is imbalanced


def test_cache_aware_switches_to_the_shortest_queue_at_the_default_thresholds():
    router = make_router(RouterConfig(router="cache_aware"), 3)
    hot = [1, 2, 3, 4]
    router.route(rq("warm", hot), RanksView((0, 0, 0)), 0)  # miss -> rank 0; rank 0's tree holds it
    d = router.route(rq("hot1", hot), RanksView((100, 40, 60)), 1)  # 60 <= 64: balanced, a full match
    assert (d.rank, d.branch) == (0, "cache_hit")
    d = router.route(rq("hot2", hot), RanksView((130, 40, 60)), 2)
    assert (d.rank, d.branch) == (1, "imbalanced")
    assert d.reason == "imbalanced: max load 130 - min 40 > 64 and 130 > 1.5 × 40: shortest queue rank 1"
    assert d.scores == (130.0, 40.0, 60.0) and d.score_name == "in flight"


def test_cache_aware_leaves_its_prefix_when_imbalanced_and_comes_back_when_balanced():
    # Thresholds small enough to narrate: imbalanced when max - min > 2 and max > 1.5 x min.
    gw = gateway("cache_aware", 2, router_balance_abs_threshold=2)
    hot = [1, 2, 3, 4]
    sent = []

    def send(name):
        d = gw.route(rq(name, hot), len(sent))
        sent.append((d.rank, rq(name, hot)))
        return d

    assert send("h0").rank == 0  # a miss; both trees empty
    for i in (1, 2):  # in flight (1, 0), (2, 0): balanced (difference <= 2); full matches on rank 0
        assert (send(f"h{i}").rank, sent[-1][0]) == (0, 0)
    assert gw.in_flight == (3, 0)
    d = send("h3")  # (3, 0): 3 > 2 and 3 > 0: imbalanced, the prefix goes to rank 1 anyway
    assert (d.rank, d.branch) == (1, "imbalanced")
    # The gateway records h3 on rank 1 too: both ranks' trees now hold the hot prefix.
    d = send("h4")  # (3, 1): 2 is not > 2: balanced; the full match's deepest node is held by both,
    assert (d.rank, d.branch) == (1, "cache_hit")  # and rank 1 touched it last (h3's insert)
    for rank, r in sent[:3]:  # the three on rank 0 finish: (0, 2)
        gw.finish(rank, r, 10)
    assert gw.in_flight == (0, 2)
    d = send("h5")  # balanced; rank 1 still the latest toucher of the prefix
    assert (d.rank, d.branch) == (1, "cache_hit")
    d = send("h6")  # (0, 3): imbalanced the other way
    assert (d.rank, d.branch) == (0, "imbalanced")
    d = send("h7")  # (1, 3): balanced again; rank 0 touched the prefix last
    assert (d.rank, d.branch) == (0, "cache_hit")


def test_cache_aware_believes_what_it_sent_not_what_the_rank_kept():
    # Finishing never edits the tree (on_request_complete only logs): a rank that evicted the
    # prefix long ago is still where the router sends it.
    gw = gateway("cache_aware", 2)
    a = rq("A", [1, 2, 3, 4])
    assert gw.route(a, 0).rank == 0
    gw.finish(0, a, 1)
    tree = gw.router.tree
    before = (len(tree), list(tree.pages))
    gw.route(rq("B", [9]), 2)
    d = gw.route(rq("A-again", [1, 2, 3, 4]), 3 * S)
    assert (d.rank, d.branch) == (0, "cache_hit")
    assert before == (4, [4, 0])


def test_cache_aware_evicts_its_approximate_tree_every_interval_over_the_size_limit():
    # A rank's tree may hold 4 pages (256 tokens); the gateway's thread runs every 1 s here.
    gw = gateway("cache_aware", 2, router_max_tree_tokens=4 * PS, router_eviction_interval_s=1.0)
    router = gw.router
    assert gw.route(rq("A", [1, 2, 3, 4]), int(0.1 * S)).rank == 0
    assert gw.route(rq("B", [20, 21]), int(0.2 * S)).rank == 1
    d = gw.route(rq("A2", [1, 2, 3, 4, 5, 6, 7, 8]), int(0.3 * S))  # 0.5 > 0.3: rank 0, now 8 pages
    assert d.rank == 0 and router.tree.pages == [8, 2]
    gw.route(rq("B2", [20, 21, 22]), int(0.9 * S))  # 2/3 on rank 1: 3 pages; still before the first pass
    assert router.evictions == 0 and router.tree.pages == [8, 3]
    # The first request at or after 1 s runs the pass first: rank 0 is over 4 pages and drops its
    # least recently touched leaves (8, 7, 6, 5: A2's tail) until it holds 4; rank 1 is under.
    d = gw.route(rq("A3", [1, 2, 3, 4, 5, 6, 7, 8]), int(1.5 * S))
    assert router.evictions == 1 and router.evicted_pages == 4
    assert d.score == pytest.approx(0.5) and d.rank == 0  # only A's 4 pages left to match
    assert router.tree.pages == [8, 3]  # A3 inserted its 8 pages again after the pass
    gw.route(rq("B3", [20]), int(1.9 * S))  # no second pass before 2 s
    assert router.evictions == 1
    gw.route(rq("B4", [20]), int(7.2 * S))  # many intervals idle: one pass, the next at 8 s
    assert router.evictions == 2 and router.tree.pages == [4, 3]
    router.tree.check()


def test_cache_aware_touches_the_best_match_even_when_the_request_goes_elsewhere():
    # Tree::prefix_match refreshes the matched worker's path before select_worker decides: a miss
    # sent to another rank still keeps that path fresh in the holder's tree.
    gw = gateway("cache_aware", 2)
    assert gw.route(rq("X", [1, 2]), 0).rank == 0  # tick 1; both trees empty
    assert gw.route(rq("B", [20, 21, 22]), 1).rank == 1  # rank 1 had the smaller tree (0 < 2)
    assert gw.route(rq("Y", [5, 6]), 2).rank == 0  # tick 3; 2 pages < 3
    d = gw.route(rq("C", [1, 10, 11, 12]), 3)  # tick 4: 1/4 on rank 0, a miss; 4 pages vs 3: rank 1
    assert (d.rank, d.reason) == (1, "cache_aware: best match 0.25 <= 0.30: smallest tree rank 1 (192 tokens)")
    tree = gw.router.tree
    # Rank 0 down to 2 pages: leaf 2 (tick 1) goes; page 1, touched at tick 4, is now younger than
    # Y's leaf 6 (tick 3), which goes next. Without the touch, page 1 (tick 1) would go and Y stay.
    tree.evict(2)
    assert [tree.holds(0, k) for k in (1, 2, 5, 6)] == [True, False, True, False]
    tree.check()


def test_cache_aware_with_eviction_off_keeps_everything():
    gw = gateway("cache_aware", 1, router_max_tree_tokens=PS, router_eviction_interval_s=0.0)
    for i in range(5):
        gw.route(rq(f"r{i}", [10 * i + 1, 10 * i + 2]), i * 100 * S)
    assert gw.router.evictions == 0 and gw.router.tree.pages == [10]


# --- the approximate tree alone: tree.rs Tree ---------------------------------------------------

def test_approx_tree_evicts_least_recently_touched_leaves_first():
    t = ApproxTree(2)
    t.insert([1, 2, 3], 0, tick=1)
    t.insert([1, 4, 5], 0, tick=2)
    t.insert([1, 2], 1, tick=3)
    assert t.pages == [5, 2] and len(t) == 5
    # Rank 0's leaves are 3 (tick 1) and 5 (tick 2). Down to 3 pages: 3 goes, then 2 becomes a leaf
    # of rank 0 (tick 1) and goes; rank 1, under the limit, keeps its pages 1 and 2.
    assert t.evict(3) == 2
    assert t.pages == [3, 2]
    assert [t.holds(0, k) for k in (1, 2, 3, 4, 5)] == [True, False, False, True, True]
    assert t.holds(1, 2) and len(t) == 4  # node 3 had no rank left and went; node 2 stays for rank 1
    t.check()


def test_approx_tree_match_touches_the_chosen_rank_so_its_branch_survives():
    t = ApproxTree(1)
    t.insert([1, 2, 3], 0, tick=1)
    t.insert([1, 4, 5], 0, tick=2)
    matched, rank, depths = t.prefix_match([1, 2, 3, 9], tick=3)  # Tree::prefix_match touches the path
    assert (matched, rank, depths) == (3, 0, [3])
    t.evict(3)  # now 5 (tick 2) is the oldest leaf, then 4
    assert [t.holds(0, k) for k in (1, 2, 3, 4, 5)] == [True, True, True, False, False]
    t.check()


def test_approx_tree_picks_the_latest_toucher_of_the_deepest_node_then_the_lowest_rank():
    t = ApproxTree(3)
    t.insert([1, 2], 2, tick=1)
    t.insert([1, 2], 1, tick=1)
    assert t.prefix_match([1, 2], tick=2)[1] == 1  # same tick: the lower rank
    t.insert([1, 2], 2, tick=3)
    assert t.prefix_match([1, 2], tick=4)[1] == 2
    assert t.prefix_match([7], tick=5) == (0, None, [0, 0, 0])
    assert t.smallest_rank() == 0


# ApproxTree keeps a tick a run of keys; ApproxTreeByKey, a tick a key, is its reference: the same
# operations give the same answers, page counts, ticks of every key and eviction order.
_tree_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=7), st.integers(0, 4)),
    st.tuples(st.just("match"), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=7), st.booleans()),
    st.tuples(st.just("evict"), st.integers(0, 12)),
)


# `key_runs`: ApproxTree is handed each request's keys as the deployment hands them, an int64 run
# (array('q')), the reference a list of the same keys; the runs it keeps stay lists.
@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4), ops=st.lists(_tree_op, max_size=60), key_runs=st.booleans())
def test_approx_tree_by_runs_answers_as_the_tree_by_key(n, ops, key_runs):
    runs, ref = ApproxTree(n), ApproxTreeByKey(n)
    for tick, op in enumerate(ops, 1):
        if op[0] == "insert":
            _, family, path, rank = op
            keys = _keys(family, path)
            runs.insert(array("q", keys) if key_runs else keys, rank % n, tick)
            ref.insert(keys, rank % n, tick)
        elif op[0] == "match":
            _, family, path, touch = op
            keys = _keys(family, path)
            run = array("q", keys) if key_runs else keys
            got, want = runs.prefix_match(run, tick, touch=touch), ref.prefix_match(keys, tick, touch=touch)
            assert got == want
            if not touch and got[1] is not None:  # cache_aware's own touch of the holder's path
                runs.touch(run[:got[0]], got[1], tick)
                ref.touch(keys[:got[0]], got[1], tick)
        else:
            assert runs.evict(op[1]) == ref.evict(op[1])
        assert runs.pages == ref.pages and len(runs) == len(ref)
        assert [runs._ticks_of(r) for r in range(n)] == ref._ticks
        runs.check()
        # a run keeps the routed keys' slice as it came: an int64 run's (no int object a page) or a list's
        assert all(type(r.keys) is (array if key_runs else list) for rank in range(n) for r in runs._runs(rank))
    assert runs.smallest_rank() == ref.smallest_rank()


def test_approx_tree_splits_a_run_where_a_touch_ends_so_its_keys_keep_their_own_ticks():
    t = ApproxTree(1)
    t.insert([1, 2, 3, 4], 0, tick=1)  # one run
    t.insert([1, 2, 7], 0, tick=2)  # the run splits after 2: [1, 2] at tick 2, [3, 4] still at 1
    assert t._ticks_of(0) == {1: 2, 2: 2, 3: 1, 4: 1, 7: 2}
    assert t.prefix_match([1, 2, 3], tick=3) == (3, 0, [3])  # touches [1, 2] and splits [3, 4]
    assert t._ticks_of(0) == {1: 3, 2: 3, 3: 3, 4: 1, 7: 2}
    assert t.evict(2) == 3  # leaves in (tick, key) order: 4 (tick 1), 7 (tick 2), then 3 (tick 3)
    assert t._ticks_of(0) == {1: 3, 2: 3}
    t.check()


# --- every router, any deployment, any stream (hypothesis) --------------------------------------

# A request: a path in a small forest of prefixes (so streams share prefixes), a session or none,
# a partial last page or not. Keys are (branch, depth) pairs folded to ints: key k always has the
# same parent, as chained page keys do.
_request = st.tuples(
    st.integers(0, 3),                      # root family
    st.lists(st.integers(0, 2), max_size=6),  # the branch taken at each depth
    st.one_of(st.none(), st.sampled_from(["s0", "s1", "s2"])),
    st.integers(0, PS - 1),                 # tokens after the last full page
)
_op = st.one_of(st.tuples(st.just("route"), _request), st.tuples(st.just("finish"), st.integers(0, 1000)))


def _keys(family: int, path: list[int]) -> list[int]:
    keys, key = [], family + 1
    for depth, branch in enumerate(path):
        key = key * 4 + branch + 1
        keys.append(key)
    return keys if keys else ([family + 1] if family % 2 else [])


def _replay(router: str, n: int, seed: int, ops, *, check_tree: bool, key_runs: bool = False) -> list[tuple]:
    gw = Gateway(RouterConfig(router=router, seed=seed, router_balance_abs_threshold=2,
                              router_max_tree_tokens=3 * PS, router_eviction_interval_s=0.5), n)
    open_requests: list[tuple[int, RequestView]] = []
    out = []
    for step, (kind, arg) in enumerate(ops):
        now_ns = step * S // 4
        if kind == "route":
            family, path, session, extra = arg
            keys = _keys(family, path)
            # (key_runs: the page keys as the deployment hands them, an int64 run)
            request = RequestView(f"r{step}", array("q", keys) if key_runs else keys, len(keys) * PS + extra, PS,
                                  session)
            d = gw.route(request, now_ns)
            assert 0 <= d.rank < n, (router, n, d)
            assert len(d.scores) == n and d.router == router and d.reason
            open_requests.append((d.rank, request))
            out.append((d.rank, d.branch, d.reason, d.score, d.scores))
        elif open_requests:
            rank, request = open_requests.pop(arg % len(open_requests))
            gw.finish(rank, request, now_ns)
        assert sum(gw.in_flight) == len(open_requests)
        assert all(gw.in_flight[r] == sum(1 for rr, _ in open_requests if rr == r) for r in range(n))
        if check_tree:
            gw.router.tree.check()
    return out


@settings(max_examples=40, deadline=None)
@given(router=st.sampled_from(sorted(ROUTERS)), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       ops=st.lists(_op, max_size=40))
def test_every_router_returns_a_valid_rank_for_any_deployment_and_stream(router, n, seed, ops):
    _replay(router, n, seed, ops, check_tree=router == "cache_aware")


@settings(max_examples=25, deadline=None)
@given(router=st.sampled_from(sorted(ROUTERS)), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       ops=st.lists(_op, max_size=40))
def test_routing_is_deterministic_given_the_seed(router, n, seed, ops):
    assert _replay(router, n, seed, ops, check_tree=False) == _replay(router, n, seed, ops, check_tree=False)


# The deployment hands a request's page keys as an int64 run (array('q'), deployment._arrive:
# no int object a page made to route it); every router decides, explains and scores exactly as
# with a list of the same keys, and cache_aware's tree stays the same tree.
@settings(max_examples=40, deadline=None)
@given(router=st.sampled_from(sorted(ROUTERS)), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       ops=st.lists(_op, max_size=40))
def test_every_router_decides_the_same_on_key_runs_as_on_lists(router, n, seed, ops):
    check = router == "cache_aware"
    assert (_replay(router, n, seed, ops, check_tree=check, key_runs=True)
            == _replay(router, n, seed, ops, check_tree=check))



# The routing views and decisions on the per-request path are built by tuple.__new__, as
# NamedTuple._make builds them (Gateway.route's RanksView, cache_aware's RouteDecision, the
# deployment's RequestView and Route): the generated __new__ is an interpreted frame more a
# request (issue 41, session 25). What they build is the constructor's: the same type, fields,
# defaults filled by the caller, equality, immutability.
def test_views_built_by_their_tuple_are_their_constructors():
    from tierdiag.engine import deployment
    from tierdiag.engine.routing.base import RouteDecision
    from tierdiag.probes.events import Route

    seen: list = []
    gw = gateway("cache_aware", 3)
    real = gw.router.route

    def spy(request, ranks, now_ns):
        seen.append(ranks)
        return real(request, ranks, now_ns)

    gw.router.route = spy
    d = gw.route(rq("a", [1, 2, 3]), 0)
    gw.route(rq("b", [1, 2, 7]), 1)
    (v0, v1) = seen
    assert type(v0) is RanksView and v0 == RanksView((0, 0, 0)) and v0.pending_tokens is None and v0.num_ranks == 3
    assert type(v1) is RanksView and v1 == RanksView((1, 0, 0), None)
    before = gw.in_flight
    assert gw.route(rq("c", [9]), 2, pending_tokens=[5, 6, 7]).rank in (0, 1, 2)
    assert type(seen[-1]) is RanksView and seen[-1] == RanksView(before, (5, 6, 7))
    assert type(d) is RouteDecision and d == RouteDecision(d.rank, "cache_aware", d.branch, d.reason, d.score,
                                                          "approx match", d.scores)
    assert d.router == "cache_aware" and d.score_name == "approx match"
    with pytest.raises(AttributeError):
        d.rank = 1  # type: ignore[misc]
    fields = ("r1", array("q", [1, 2]), 130, PS, None)
    built = deployment._new_tuple(RequestView, fields)
    assert type(built) is RequestView and built == RequestView(*fields) and built.session is None
    route = ("cache_hit", "why", 0.5, "approx match", 64, 0, 1, 128, 0, "[]")
    assert deployment._new_tuple(Route, route) == Route._make(route) and type(deployment._new_tuple(Route, route)) is Route


@given(pages=st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_first_smallest_is_min_by_key(pages):
    """smallest_rank's loop (both trees) answers as `min(range(n), key=pages.__getitem__)`,
    the reference it replaced: the fewest pages, the first rank on a tie (small values: many ties)."""
    want = min(range(len(pages)), key=pages.__getitem__)
    assert first_smallest(pages) == want
    for cls in (ApproxTree, ApproxTreeByKey):
        tree = cls(len(pages))
        tree.pages = list(pages)
        assert tree.smallest_rank() == want
