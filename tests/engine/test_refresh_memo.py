"""The walk memo (`RadixTree.touch_walk`, issue 41 session 28): 0.5.23's
`_touch_waiting_prefixes` walks the first waiting requests' prefixes every `refresh_interval`-th
pass, for the walk's access stamps alone, and an admission matches a request's whole key run; a
request whose path nothing has changed since its last walk gets that path's nodes stamped again
(and owned, for a match), in path order, instead of the walk. The memo must leave the tree
exactly as the walk would: the same nodes, owners, stamps in the same order, the same splits
(none), whatever changed in the tree between two walks.

- Two trees given the same operations (inserts, matches that split, copies gained and lost,
  leaves deleted, key runs replaced or extended in place, admissions' matches with owners), one
  walking through its memos, the other through `walk` / `match`: the answers and every node's
  keys, copies, owner, access time and stamp order stay alike, and the heaps' victims too, under
  both rule sets and an eviction policy that re-pushes a touched node (Hypothesis).
- The memo is refused where the walk could differ (a unit test of each cause), and taken where
  nothing changed (not a test of nothing).
- Whole replays under 0.5.23 walk through the memo: the rows are those of the walk (the memo
  refused), on the Python twin."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, TREE_CHANGES, change_tree, patches_the_engine, pick_node, small_config
from tests.engine.test_fast_paths import bursts
from tests.engine.test_requery_memo import paths  # paths that share, split and extend each other
from tierdiag.engine.rules import RULE_SETS
from tierdiag.engine.tree import RadixTree
from tierdiag.engine.tree_node import WalkMemo

PROBES = 4  # waiting requests whose prefixes are refreshed
_HOLDS = RadixTree._memo_path_holds  # the class's own (the replays below wrap it)

op = st.one_of(
    st.tuples(st.just("insert"), paths),
    st.tuples(st.just("match"), paths),  # another request's match: it can split a memoised path
    st.tuples(st.just("refresh"), st.integers(0, PROBES - 1)),
    st.tuples(st.just("refresh"), st.integers(0, PROBES - 1)),  # (twice as likely)
    st.tuples(st.just("host"), st.integers(0, 40)),
    st.tuples(st.just("demote"), st.integers(0, 40)),
    st.tuples(st.just("drop_host"), st.integers(0, 40)),
    st.tuples(st.just("delete"), st.integers(0, 40)),
    st.tuples(st.just("evict"), st.booleans()),  # the heaps' next victim, deleted
    st.tuples(st.just("rekey"), st.integers(0, PROBES - 1)),  # a new key run (an equal one)
    st.tuples(st.just("extend"), st.integers(0, PROBES - 1), st.integers(1, 9)),  # a retraction's output pages
    st.tuples(st.just("lock"), st.integers(0, 40)),
    st.tuples(st.just("admit"), st.integers(0, PROBES - 1), st.sampled_from(["a", "b", "r0"])),  # a match, an owner
)


def _state(tree: RadixTree) -> list[tuple]:
    return sorted((n.id, n.parent.id if n.parent is not None else -1, list(n.keys), n.device is not None,
                   n.host is not None, n.last_access_ns, n.access_seq, n.lock_ref, n.owner) for n in tree.nodes())


def _apply(tree: RadixTree, keys: list, memos: list, o: tuple, now: int, memo: bool, slots) -> object:
    name = o[0]
    if name == "insert":
        tree.insert(o[1], 0, [next(slots) for _ in o[1]], now_ns=now)
    elif name == "match":
        tree.match(o[1], now)
    elif name == "refresh":
        i = o[1]
        if memo:
            memos[i] = tree.touch_walk(keys[i], now, memos[i])
            return [n.id for n in memos[i].path], memos[i].pages
        path = tree.walk(keys[i], now, None)
        return [n.id for n in path], sum(len(n.keys) for n in path)
    elif name == "admit":  # an admission's match of the whole run, with its owner
        i = o[1]
        if memo:
            memos[i] = tree.touch_walk(keys[i], now, memos[i], o[2])
            m = tree.match_of(memos[i].path)
        else:
            m = tree.match(keys[i], now, o[2])
        return [n.id for n in m.device_nodes], [n.id for n in m.host_nodes]
    elif name in TREE_CHANGES:
        change_tree(tree, o, slots)
    elif name == "evict":
        n = tree.pop_device_victim() if o[1] else tree.pop_host_victim()
        if n is not None and not n.children and n.lock_ref == 0:
            tree.delete(n)
        return None if n is None else n.id
    elif name == "rekey":
        keys[o[1]] = list(keys[o[1]])
    elif name == "extend":
        keys[o[1]].extend(keys[o[1]][-1] * 100 + j for j in range(o[2]))  # in place, as a retraction's
    elif name == "lock":
        n = pick_node(tree, o[1], lambda n: n.device is not None)
        if n is not None:
            tree.inc_lock(n)
    return None


@pytest.mark.parametrize("version", sorted(RULE_SETS))
@pytest.mark.parametrize("policy", ["lru", "mru"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=40), probe_paths=st.lists(paths, min_size=PROBES, max_size=PROBES))
def test_a_memoised_refresh_leaves_the_tree_as_the_walk_would(version, policy, ops, probe_paths):
    runs = []
    for memo in (True, False):
        tree = RadixTree(PS, policy, RULE_SETS[version])
        keys = [list(p) for p in probe_paths]
        memos: list = [None] * PROBES
        slots = iter(range(1_000_000))
        seen = []
        for t, o in enumerate(ops):
            seen.append(_apply(tree, keys, memos, o, t + 1, memo, slots))
            seen.append(_state(tree))
        # the heaps' order too: every victim in turn
        victims = []
        for device in (True, False):
            while (n := tree.pop_device_victim() if device else tree.pop_host_victim()) is not None:
                victims.append((device, n.id))
                if not n.children and n.lock_ref == 0:
                    tree.delete(n)
                else:
                    break
        runs.append((seen, victims, tree._seq))
    assert runs[0] == runs[1]


def _tree() -> RadixTree:
    tree = RadixTree(PS)
    tree.insert([1, 2, 3, 4], 0, [0, 1, 2, 3], now_ns=1)
    return tree


def test_the_memo_holds_on_an_unchanged_path_and_is_refused_past_a_change():
    tree = _tree()
    keys = [1, 2, 9, 8]
    memo = tree.touch_walk(keys, 2, None)  # splits [1 2 | 3 4]
    assert isinstance(memo, WalkMemo) and memo.pages == 2 and [list(n.keys) for n in memo.path] == [[1, 2]]
    tree.insert([1, 2, 5], 0, [7, 8, 9], now_ns=3)  # a child off the path's end, not on the keys' way
    assert tree._memo_path_holds(memo, keys)
    seq = tree._seq
    assert tree.touch_walk(keys, 4, memo) is memo
    assert memo.path[0].last_access_ns == 4 and memo.path[0].access_seq == seq + 1  # stamped anew
    tree.insert([1, 2, 9], 0, [10, 11, 12], now_ns=5)  # a child on the keys' way: the walk goes further
    assert not tree._memo_path_holds(memo, keys)
    again = tree.touch_walk(keys, 6, memo)
    assert again is memo and memo.pages == 3  # updated in place
    node = memo.path[-1]
    tree.set_host(node, [20])  # a copy gained on the path
    assert not tree._memo_path_holds(memo, keys)
    tree.touch_walk(keys, 7, memo)
    tree.match([1], 8)  # splits [1 2] -> [1 | 2]
    assert not tree._memo_path_holds(memo, keys)
    tree.touch_walk(keys, 9, memo)
    assert tree._memo_path_holds(memo, keys)
    assert not tree._memo_path_holds(memo, list(keys))  # another key run
    keys.append(7)  # the run extended in place (a retraction's output pages)
    assert not tree._memo_path_holds(memo, keys)
    tree.touch_walk(keys, 10, memo)
    assert not RadixTree(PS)._memo_path_holds(memo, keys)  # another tree
    leaf = memo.path[-1]
    tree.delete(leaf)  # a node of the path deleted
    assert not tree._memo_path_holds(memo, keys)


def test_a_memo_of_no_path_checks_the_roots_child():
    tree = RadixTree(PS)
    keys = [5, 6]
    memo = tree.touch_walk(keys, 1, None)
    assert memo.path == [] and memo.pages == 0 and tree._memo_path_holds(memo, keys)
    tree.insert([5], 0, [0], now_ns=2)
    assert not tree._memo_path_holds(memo, keys)
    assert tree.touch_walk([], 3, None).pages == 0  # no keys: nothing to walk, a memo that holds


# --- whole replays, with the memo and with it refused (patches the class: the Python twin) ------

def _replay(reqs, cfg, memo: bool, monkeypatch, taken: list) -> tuple[list, dict]:
    from tests.engine.test_fast_paths import replay_through_memo
    return replay_through_memo(reqs, cfg, memo, monkeypatch, taken, RadixTree, "_memo_path_holds", _HOLDS)


@patches_the_engine
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=bursts(), dp=st.integers(1, 2), device=st.integers(12, 30), host=st.integers(0, 30),
       policy=st.sampled_from(["fcfs", "hrrn", "shortest-prefill-first"]), write_policy=st.sampled_from(["write_through", "write_back"]),
       eviction=st.sampled_from(["lru", "mru"]), rules=st.sampled_from(["0.5.23", "0.5.9"]))
def test_walks_through_the_memo_change_no_event(reqs, dp, device, host, policy, write_policy, eviction, rules,
                                                monkeypatch):
    """Under 0.5.9 (no refresh) the admissions' matches alone go through the memo."""
    runs = []
    for memo in (False, True):
        cfg = small_config(dp=dp, device_tokens=device * PS, host_tokens=(device + host) * PS,
                           schedule_policy=policy if rules == "0.5.23" else "fcfs", write_policy=write_policy,
                           eviction_policy=eviction, sglang_rules=rules)
        runs.append(_replay(reqs, cfg, memo, monkeypatch, []))
    assert runs[0][1] == runs[1][1]
    assert runs[0][0] == runs[1][0]


@patches_the_engine
def test_a_long_queue_refreshes_through_the_memo(monkeypatch):
    """Requests that wait behind a small device: the refresh passes find most paths unchanged and
    the memo answers them; every event and the stats are the walked refreshes'."""
    from tierdiag.trace.reader import TraceRequest

    # every other request shares one prefix (cached in whole after the first: nothing on its way
    # changes), the others have their own
    reqs = [TraceRequest(f"r{i}", i, i + 1, 0, 6 * PS + 1, 200,
                         tuple(range(7)) if i % 2 else tuple(1000 * i + j for j in range(7)), None)
            for i in range(60)]
    runs, taken = [], []
    for memo in (False, True):
        taken.clear()
        cfg = small_config(device_tokens=16 * PS, host_tokens=32 * PS, sglang_rules="0.5.23")
        runs.append(_replay(reqs, cfg, memo, monkeypatch, taken))
    assert runs[0] == runs[1]
    assert sum(taken) > 0, "no refresh took the memo"
