"""The storage re-queries' memo (`prefetch.query_match`, issue 41): a re-query whose tree path
nothing has changed since its request's last query gets that query's match again, its access
stamps made anew (`RadixTree.touch_path`), instead of walking the tree. SGLang's re-query
(`Scheduler._retry_storage_prefetch` -> `_prefetch_kvcache` -> `req.init_next_round_input`,
0.5.23 managers/scheduler.py) runs match_prefix again, which touches the path's access times; the
memo must leave the tree exactly as that match would: the same nodes, the same stamps in the
same order, the same splits (none), whatever changed in the tree between the queries.

- Two trees given the same operations (inserts, matches that split, copies gained and lost,
  leaves deleted), one answering its queries through the memo, the other through `match`: the
  answers and every node's keys, copies, access time and stamp order stay alike (Hypothesis).
- Whole replays with re-queries firing, with the memo and with it refused (on the Python twin):
  every event and the stats alike; and the memo is taken (not a test of nothing)."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, TREE_CHANGES, change_tree, patches_the_engine, req, small_config
from tests.engine.test_fast_paths import bursts
from tierdiag.engine import prefetch
from tierdiag.engine.request import Req
from tierdiag.engine.tree import RadixTree

PROBES = 4  # requests whose queries are memoised
_HOLDS = prefetch._memo_holds  # the module's own (the replays below wrap it)


def _state(tree: RadixTree) -> list[tuple]:
    """Every node: id, parent id, keys, copies, access time and stamp order (the match's marks)."""
    return sorted((n.id, n.parent.id if n.parent is not None else -1, list(n.keys), n.device is not None,
                   n.host is not None, n.last_access_ns, n.access_seq) for n in tree.nodes())


def _probe(i: int, keys: list[int], bound: int) -> Req:
    r = Req(req(f"p{i}", 0, keys, seq=i), 0)
    r.keys, r.max_match_pages = list(keys), bound
    return r


# Paths over a small alphabet so that they share prefixes, split each other and extend each other.
paths = st.lists(st.integers(1, 3), min_size=1, max_size=6).map(lambda ks: [sum(ks[:i + 1]) * 10 + k
                                                                               for i, k in enumerate(ks)])
op = st.one_of(
    st.tuples(st.just("insert"), paths),
    st.tuples(st.just("match"), paths),  # another request's match: it can split a memoised path
    st.tuples(st.just("query"), st.integers(0, PROBES - 1)),
    st.tuples(st.just("host"), st.integers(0, 40)),  # a node gains a host copy
    st.tuples(st.just("demote"), st.integers(0, 40)),  # a node loses its device copy
    st.tuples(st.just("drop_host"), st.integers(0, 40)),
    st.tuples(st.just("delete"), st.integers(0, 40)),
    st.tuples(st.just("rekey"), st.integers(0, PROBES - 1)),  # a new key run (an equal one)
    st.tuples(st.just("bound"), st.integers(0, PROBES - 1), st.integers(0, 6)),
)


def _apply(tree: RadixTree, probes: list[Req], o: tuple, now: int, memo: bool, slots) -> object:
    name = o[0]
    if name == "insert":
        keys = o[1]
        tree.insert(keys, 0, [next(slots) for _ in keys], now_ns=now)
    elif name == "match":
        tree.match(o[1], now)
    elif name == "query":
        r = probes[o[1]]
        if memo:
            m, matched = prefetch.query_match(tree, r, now, True)
        else:
            m = tree.match(prefetch._matchable(r), now)
            matched = m.device_pages + m.host_pages
        return [n.id for n in m.device_nodes], [n.id for n in m.host_nodes], matched
    elif name in TREE_CHANGES:
        change_tree(tree, o, slots)
    elif name == "rekey":
        r = probes[o[1]]
        r.keys = list(r.keys)
    elif name == "bound":
        probes[o[1]].max_match_pages = o[2]
    return None


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=40), probe_paths=st.lists(paths, min_size=PROBES, max_size=PROBES))
def test_a_memoised_requery_leaves_the_tree_as_a_match_would(ops, probe_paths):
    trees, answers = [], []
    for memo in (True, False):
        tree = RadixTree(PS)
        probes = [_probe(i, keys, len(keys)) for i, keys in enumerate(probe_paths)]
        slots = iter(range(1_000_000))
        seen = []
        for t, o in enumerate(ops):
            seen.append(_apply(tree, probes, o, t + 1, memo, slots))
            seen.append(_state(tree))
        trees.append(_state(tree))
        answers.append(seen)
    assert answers[0] == answers[1]
    assert trees[0] == trees[1]


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=40), probe_paths=st.lists(paths, min_size=PROBES, max_size=PROBES))
def test_where_the_memo_holds_a_locate_walks_its_path(ops, probe_paths):
    """`_prefetch_after_hit_loss` takes a holding memo's pages for `tree.locate`'s (issue 41):
    after every operation, each request whose memo holds locates exactly the memo's pages,
    ending at the memo's last node (the root for none), and that walk changes nothing (no split,
    no stamp)."""
    tree = RadixTree(PS)
    probes = [_probe(i, keys, len(keys)) for i, keys in enumerate(probe_paths)]
    slots = iter(range(1_000_000))
    for t, o in enumerate(ops):
        _apply(tree, probes, o, t + 1, True, slots)
        for r in probes:
            memo = r.storage_memo
            if memo is None or not prefetch._memo_holds(memo, tree, r):
                continue
            before = _state(tree)
            node, pages = tree.locate(prefetch._matchable(r))
            assert pages == memo.matched
            assert node is (memo.match.last_node or tree.root)
            assert _state(tree) == before


def test_the_memo_holds_on_an_unchanged_path_and_not_past_a_change():
    tree = RadixTree(PS)
    slots = iter(range(1000))
    tree.insert([1, 2, 3, 4], 0, [next(slots) for _ in range(4)], now_ns=1)
    r = _probe(0, [1, 2, 9, 8], 4)
    m, matched = prefetch.query_match(tree, r, 2, True)
    assert matched == 2 and r.storage_memo is not None  # the match split [1 2 | 3 4]
    memo = r.storage_memo
    # another request's insert elsewhere, a new child off the path's end not on its way
    tree.insert([1, 2, 5], 0, [next(slots) for _ in range(3)], now_ns=3)
    assert prefetch._memo_holds(memo, tree, r)
    m2, matched2 = prefetch.query_match(tree, r, 4, True)
    assert m2 is m and matched2 == 2 and r.storage_memo is memo
    assert [n.last_access_ns for n in m.device_nodes] == [4]  # stamped anew
    # a child on the keys' way: the walk would go further
    tree.insert([1, 2, 9], 0, [next(slots) for _ in range(3)], now_ns=5)
    assert not prefetch._memo_holds(memo, tree, r)
    m3, matched3 = prefetch.query_match(tree, r, 6, True)
    assert matched3 == 3 and r.storage_memo is not memo
    # a copy lost on the path, a split of it, another key run, another bound, another tree
    memo = r.storage_memo
    node = m3.device_nodes[-1]
    tree.set_host(node, [next(slots)])
    assert not prefetch._memo_holds(memo, tree, r)
    prefetch.query_match(tree, r, 7, True)
    memo = r.storage_memo
    tree.match([1], 8)  # splits [1 2] -> [1 | 2]
    assert not prefetch._memo_holds(memo, tree, r)
    prefetch.query_match(tree, r, 9, True)
    memo = r.storage_memo
    assert prefetch._memo_holds(memo, tree, r)
    r.keys = list(r.keys)
    assert not prefetch._memo_holds(memo, tree, r)
    prefetch.query_match(tree, r, 10, True)
    r.max_match_pages = 2
    assert not prefetch._memo_holds(r.storage_memo, tree, r)
    assert not prefetch._memo_holds(r.storage_memo, RadixTree(PS), r)
    # each residency change of a path node, and its deletion, refuses the memo
    for change in ("demote", "drop_host", "delete"):
        t2 = RadixTree(PS)
        t2.insert([1, 2], 0, [0, 1], now_ns=1)
        leaf = t2.match([1, 2], 1).device_nodes[-1]
        if change != "delete":
            t2.set_host(leaf, [5, 6])
        r2 = _probe(2, [1, 2, 3], 3)
        prefetch.query_match(t2, r2, 2, True)
        assert prefetch._memo_holds(r2.storage_memo, t2, r2)
        getattr(t2, change)(leaf)
        assert not prefetch._memo_holds(r2.storage_memo, t2, r2), change
        m, matched = prefetch.query_match(t2, r2, 3, True)
        fresh = t2.match([1, 2, 3], 4)
        assert (m.device_nodes, m.host_nodes, matched) == (fresh.device_nodes, fresh.host_nodes,
                                                          fresh.device_pages + fresh.host_pages), change
    # without re-queries no memo is kept
    fresh = _probe(1, [1, 2], 2)
    prefetch.query_match(tree, fresh, 11, False)
    assert fresh.storage_memo is None


# --- whole replays, with the memo and with it refused (patches the module: the Python twin) --------

def _replay(reqs, cfg, memo: bool, monkeypatch, taken: list) -> tuple[list, dict]:
    from tests.engine.test_fast_paths import replay_through_memo
    return replay_through_memo(reqs, cfg, memo, monkeypatch, taken, prefetch, "_memo_holds", _HOLDS)


@patches_the_engine
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=bursts(), dp=st.integers(1, 2), device=st.integers(12, 30), host=st.integers(0, 30),
       policy=st.sampled_from(["fcfs", "lpm"]), prefetch_policy=st.sampled_from(["best_effort", "wait_complete",
                                                                               "timeout"]),
       write_policy=st.sampled_from(["write_through", "write_back"]))
def test_requeries_through_the_memo_change_no_event(reqs, dp, device, host, policy, prefetch_policy, write_policy,
                                                    tmp_path_factory, monkeypatch):
    runs = []
    for memo in (False, True):
        cfg = small_config(dp=dp, device_tokens=device * PS, host_tokens=(device + host) * PS,
                           storage_tokens=200 * PS, storage_dir=str(tmp_path_factory.mktemp("memo")),
                           schedule_policy=policy, prefetch_policy=prefetch_policy, write_policy=write_policy,
                           sglang_rules="0.5.23")
        taken: list = []
        runs.append(_replay(reqs, cfg, memo, monkeypatch, taken))
    assert runs[0][1] == runs[1][1]
    assert runs[0][0] == runs[1][0]


@patches_the_engine
@pytest.mark.parametrize("dp", [1, 2])
def test_a_queue_of_misses_requeries_through_the_memo(dp, tmp_path, monkeypatch):
    """Requests that wait behind a small device, their prefixes never stored: each re-query
    misses on a path nothing changed, and the memo answers most of them; every event and the
    stats are the re-walked queries'."""
    from tierdiag.trace.reader import TraceRequest

    reqs = [TraceRequest(f"r{i}", i, i + 1, 0, 6 * PS + 1, 60, tuple(1000 * i + j for j in range(7)),
                         None) for i in range(12)]
    runs, taken = [], []
    for memo in (False, True):
        taken.clear()
        cfg = small_config(dp=dp, device_tokens=16 * PS, host_tokens=32 * PS, storage_tokens=200 * PS,
                           storage_dir=str(tmp_path / f"m{memo}"), prefetch_policy="timeout",
                           write_policy="write_through", sglang_rules="0.5.23")
        runs.append(_replay(reqs, cfg, memo, monkeypatch, taken))
    assert runs[0] == runs[1]
    assert sum(taken) > 0, "no re-query took the memo"
