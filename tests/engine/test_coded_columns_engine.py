"""engine/emitters.py's coded columns (issue 41, session 28): an object column of few
values (tiers, actions, kinds, reasons), written as a code a row into the int block, the values
themselves once a hand-over (`dictionary`; `Columns._code` finds a column's last values by
identity). Held here, the compiled class and its Python source alike, to the values appended
(every row's, through columns_of and table_columns), whatever the sequence of values: more
distinct ones than are kept, equal strings that are other objects, NULLs, takes between."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import source_twin
from tierdiag.config.names import EvictionAction, Tier
from tierdiag.engine import emitters
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import columns_of
from tierdiag.store.columns import arrow_column, table_columns

TWIN = source_twin("emitters", "_emitters_coded_twin")
MODULES = [pytest.param(emitters, id="as imported"), pytest.param(TWIN, id="python source")]
FIELDS = ev.Eviction._fields


def _counter():
    from librt.vecs import vec
    from mypy_extensions import i64

    return vec[i64]([0])


# values for the coded columns: a few objects, two of them equal strings that are not the same
# object, a str member, NULL, and more of them than a column keeps (emitters._RECENT)
_POOL = ["device", "".join(["dev", "ice"]), Tier.HOST, EvictionAction.DEMOTE, None, "storage",
         "r-1", "r-2", "r-3", "r-4", "r-5", "\x00", "é" * 3]


def _add(cols, i: int, tier, action, cause, owner) -> tuple:
    kw = dict(eviction_id=i, t_ns=i * 10, tier=tier, node_id=i, tokens=16, action=action, cause_req_id=cause,
              owner_req_id=owner, pool_used_tokens=1, pool_capacity_tokens=2, locked_tokens=0, node_hit_count=3,
              node_last_access_ns=4, dp_rank=0)
    cols.add(**kw)
    return tuple(kw[f] for f in FIELDS)


def _check(hand, want):
    py = columns_of(FIELDS, hand)
    assert list(zip(*(py[f] for f in FIELDS))) == want or (not want and all(py[f] == () for f in FIELDS))
    arrow = table_columns("evictions", FIELDS, hand)
    for j, f in enumerate(FIELDS):
        assert arrow_column("evictions", f, arrow[f]).to_pylist() == [w[j] for w in want], f


@pytest.mark.parametrize("module", MODULES)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_coded_values_come_back_as_appended(module, data):
    cols = module.EvictionColumns([], _counter())
    pick = st.sampled_from(range(len(_POOL)))
    ops = data.draw(st.lists(st.one_of(st.tuples(pick, pick, pick, pick), st.just("take")), max_size=40))
    want: list[tuple] = []
    for i, op in enumerate(ops + ["take"]):
        if op == "take":
            hand = cols.take()
            coded, dictionary = hand["coded"]
            assert coded == emitters.EVICTION_CODED and len(dictionary) <= 4 * len(want)
            _check(hand, want)
            want = []
        else:
            want.append(_add(cols, i, *(_POOL[k] for k in op)))


@pytest.mark.parametrize("module", MODULES)
def test_a_run_of_one_value_is_one_dictionary_entry(module):
    cols = module.EvictionColumns([], _counter())
    want = [_add(cols, i, "device", "demote", "r-9", None) for i in range(1000)]
    hand = cols.take()
    assert hand["coded"][1] == ["device", "demote"]
    _check(hand, want)
    cols.clear()
    assert cols.dictionary == [] and cols.take()["coded"][1] == []


@pytest.mark.parametrize("module", MODULES)
def test_a_row_refused_leaves_the_rows_whole(module):
    """An int past int64 is refused at the call (compiled: TypeError or OverflowError where it is
    passed; the twin's vec at its item set): no row kept, the dictionary may hold a value no row
    refers to, and the rows after it come back as appended."""
    cols = module.EvictionColumns([], _counter())
    want = [_add(cols, 0, "device", "drop", "a", "b")]
    with pytest.raises((OverflowError, TypeError)):
        _add(cols, 2**63, "host", "drop", "c", "d")
    want.append(_add(cols, 1, "host", "demote", "c", None))
    assert len(cols) == 2
    _check(cols.take(), want)


@pytest.mark.parametrize("module", MODULES)
@given(picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=60),
       takes=st.sets(st.integers(0, 60), max_size=4))
@settings(max_examples=60, deadline=None)
def test_a_fresh_object_a_row_is_never_taken_for_another(module, picks, takes):
    """`_code` knows its recent values by id (issue 41, session 35): a value made for its row
    and let go of by the caller (its only reference the buffer's) is kept alive by the
    dictionary, so no later value can take its address and be given its code; equal values
    that are other objects each get their own entry, across takes too."""
    cols = module.EvictionColumns([], _counter())
    want: list[tuple] = []
    fresh = nones = 0

    def took() -> None:
        hand = cols.take()
        # every fresh object its own entry; None (one object) once, or again after it left the slots
        assert fresh + min(nones, 1) <= len(hand["coded"][1]) <= fresh + nones
        _check(hand, want)

    for i, (t, a) in enumerate(picks):
        if i in takes:
            took()
            want, fresh, nones = [], 0, 0
        # fresh objects every row: equal strings, never the same object twice
        tier = "".join(["tier-", str(t)])
        action = "".join(["act-", str(a)]) if a else None
        want.append(_add(cols, i, tier, action, None, None))
        del tier, action
        fresh += 2 if a else 1
        nones += 0 if a else 1
    took()


def _scan_codes(rows, columns: int):
    """The codes `_code` gave before it compared its last hit first (session 35): a column's
    kept values scanned slot by slot (the first that is the value, by identity), else the next
    code, the dictionary appended and the slots taken in turn."""
    dictionary: list = []
    slots = [[None] * emitters._RECENT for _ in range(columns)]
    codes = []
    for row in rows:
        got = []
        for c, value in enumerate(row):
            for kept in slots[c]:
                if kept is not None and kept[0] is value:
                    got.append(kept[1])
                    break
            else:
                code = len(dictionary)
                dictionary.append(value)
                slots[c][code % emitters._RECENT] = (value, code)
                got.append(code)
        codes.append(tuple(got))
    return dictionary, codes


@pytest.mark.parametrize("module", MODULES)
@given(runs=st.lists(st.tuples(st.integers(0, len(_POOL) - 1), st.integers(0, len(_POOL) - 1),
                               st.integers(1, 6)), max_size=30),
       takes=st.sets(st.integers(0, 30), max_size=3))
@settings(max_examples=80, deadline=None)
def test_the_codes_are_the_scans_whatever_slot_was_hit_last(module, runs, takes):
    """The codes themselves: runs of one value, values alternating, more than a column keeps,
    one object in both columns, takes between: the codes of every row and the dictionary are
    those of a slot-by-slot scan of the column's kept values (what any faster search of them,
    e.g. the last hit's slot first, tried in session 36, must keep)."""
    import numpy as np

    cols = module.EvictionColumns([], _counter())
    rows: list[tuple] = []

    def took() -> None:
        hand = cols.take()
        names, block = hand["ints"]
        ints = np.frombuffer(block, dtype=np.int64).reshape(hand["n"], len(names)) if hand["n"] else None
        dictionary, codes = _scan_codes(rows, 2)
        assert hand["coded"] == (emitters.EVICTION_CODED, dictionary)
        got = [] if ints is None else [tuple(int(v) for v in row[-2:]) for row in ints]
        assert got == codes

    i = 0
    for j, (t, a, repeat) in enumerate(runs):
        if j in takes:
            took()
            rows = []
        for _ in range(repeat):
            rows.append((_POOL[t], _POOL[a]))
            _add(cols, i, _POOL[t], _POOL[a], None, None)
            i += 1
    took()


def _add_keyed(cols, i: int, key: int, cause, owner) -> tuple:
    """The engine's own eviction row (CacheController.record_eviction): tier and action by the
    EngineStats key; the row it stands for, with the key's tier and action as values."""
    from tierdiag.engine.controller import EVICTION_KEYS

    kw = dict(eviction_id=i, t_ns=i * 10, key=key, node_id=i, tokens=16, cause_req_id=cause, owner_req_id=owner,
              pool_used_tokens=1, pool_capacity_tokens=2, locked_tokens=0, node_hit_count=3, node_last_access_ns=4,
              dp_rank=0)
    cols.add_keyed(**kw)
    tier, action = EVICTION_KEYS[key].split("/")
    row = {**kw, "tier": tier, "action": action}
    return tuple(row[f] for f in FIELDS)


def test_the_keyed_words_are_the_controllers_keys_split():
    """`add_keyed`'s codes by place (tier EVICTION_WORDS[key >> 1], action [3 + key], key 4's
    [5]) say each of controller.EVICTION_KEYS' `tier/action`, the very members the controller
    records (the values the DB stores: equal text, the same StrEnum members)."""
    from tierdiag.engine import controller

    words = emitters.EVICTION_WORDS
    assert len(controller.EVICTION_KEYS) == 5
    for key, name in enumerate(controller.EVICTION_KEYS):
        tier, action = words[key >> 1], words[3 + (key if key < 4 else 2)]
        assert f"{tier}/{action}" == name
    assert words[:2] == (controller._DEVICE, controller._HOST) and words[3:] == (
        controller._DEMOTE, controller._DROP, controller._DELETE, controller._FREE_DUPLICATE)
    assert all(type(w) in (Tier, EvictionAction) for w in words)


@pytest.mark.parametrize("module", MODULES)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_keyed_rows_and_coded_rows_interleaved_come_back_as_appended(module, data):
    """`add_keyed` (the codes by place in the fixed words, appended once a hand-over at its first
    row) and `add` (the codes `_code` finds) in any order, takes between: every row's tier and
    action, through columns_of and table_columns, are the ones appended; the words go into a
    hand-over's dictionary once, only where a keyed row is in it."""
    cols = module.EvictionColumns([], _counter())
    pick = st.sampled_from(range(len(_POOL)))
    ops = data.draw(st.lists(st.one_of(st.tuples(st.just("coded"), st.tuples(pick, pick, pick, pick)),
                                       st.tuples(st.just("keyed"), st.tuples(st.integers(0, 4), pick, pick)),
                                       st.just(("take", None))), max_size=40))
    want: list[tuple] = []
    keyed = False
    for i, (op, arg) in enumerate(ops + [("take", None)]):
        if op == "take":
            hand = cols.take()
            dictionary, words = hand["coded"][1], emitters.EVICTION_WORDS
            runs = [i for i in range(len(dictionary) - len(words) + 1)
                    if all(d is w for d, w in zip(dictionary[i:i + len(words)], words))]
            assert len(runs) == (1 if keyed else 0)
            _check(hand, want)
            want, keyed = [], False
        elif op == "coded":
            want.append(_add(cols, i, *(_POOL[k] for k in arg)))
        else:
            key, cause, owner = arg
            want.append(_add_keyed(cols, i, key, _POOL[cause], _POOL[owner]))
            keyed = True


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("key", [-1, 5, 6, 2**62, -(2**63), 2**63 - 1])
def test_a_key_outside_the_five_is_refused_and_no_row_kept(module, key):
    cols = module.EvictionColumns([], _counter())
    want = [_add_keyed(cols, 0, 2, "r-1", None)]
    with pytest.raises(ValueError, match="0-4"):
        cols.add_keyed(eviction_id=1, t_ns=1, key=key, node_id=1, tokens=16, cause_req_id=None, owner_req_id=None,
                       pool_used_tokens=1, pool_capacity_tokens=2, locked_tokens=0, node_hit_count=3,
                       node_last_access_ns=4, dp_rank=0)
    assert len(cols) == 1 and cols.counter[0] == 1
    _check(cols.take(), want)


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("key", [2**63, -(2**63) - 1, "2", 2.0, None])
def test_a_key_that_is_no_int64_is_refused_and_no_row_kept(module, key):
    cols = module.EvictionColumns([], _counter())
    with pytest.raises((OverflowError, TypeError, ValueError)):
        cols.add_keyed(eviction_id=1, t_ns=1, key=key, node_id=1, tokens=16, cause_req_id=None, owner_req_id=None,
                       pool_used_tokens=1, pool_capacity_tokens=2, locked_tokens=0, node_hit_count=3,
                       node_last_access_ns=4, dp_rank=0)
    assert len(cols) == 0 and cols.take()["n"] == 0
