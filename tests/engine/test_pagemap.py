"""PageMap (engine/pagemap.py) behaves as the dict it replaces: page key -> eviction id, for
dense hash_ids keys (the array), far keys (the dict), growth, and both call sizes."""

from unittest.mock import patch

import numpy as np
from hypothesis import given, settings, strategies as st

from tierdiag.engine import pagemap
from tierdiag.engine.pagemap import (DENSE_LIMIT, DOUBLE_SLOTS, GROW_SHIFT, GROW_SHIFT_MANY, LEAF, LEAF_SHIFT, MISSING,
                                     PageMap)

_KEYS = st.one_of(st.integers(0, 5_000), st.integers(0, 3 << 20), st.integers(DENSE_LIMIT - 4, (1 << 63) - 1),
                  st.integers(-(1 << 63), -1))  # output pages: never kept
_OPS = st.lists(st.tuples(st.lists(_KEYS, max_size=120), st.integers(0, (1 << 31) - 1)), max_size=25)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.lists(_KEYS, max_size=150))
def test_page_map_matches_a_dict(ops, probe):
    pm, model = PageMap(), {}
    for keys, value in ops:
        pm.set_many(keys, value)
        model.update(dict.fromkeys((k for k in keys if k >= 0), value))
    asked = probe + [k for keys, _ in ops for k in keys]
    expected = [model.get(k, MISSING) for k in asked]
    assert pm.get_list(asked) == expected
    assert pm.get_many(asked).tolist() == expected
    assert len(pm) == len(model)
    for k in asked[:20]:
        assert pm.get(k) == model.get(k)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.one_of(st.integers(0, 5_000), st.integers(DENSE_LIMIT - 4, (1 << 62))),
                                   max_size=60),
                          st.lists(st.integers(-(1 << 63), -1), max_size=8), st.integers(0, (1 << 31) - 1)),
                max_size=20),
       st.lists(st.one_of(st.integers(0, 6_000), st.integers(DENSE_LIMIT - 4, (1 << 62))), max_size=80))
def test_the_engines_shortcuts_give_the_general_answers(nodes, probe):
    """set_many(outputs_last=True) on tree-node keys (input pages, then output pages) and
    get_many(inputs=True) on input pages: the same map and answers as the general calls."""
    fast, general = PageMap(), PageMap()
    for inputs, outputs, value in nodes:
        fast.set_many(inputs + outputs, value, outputs_last=True)
        general.set_many(inputs + outputs, value)
    asked = probe + [k for inputs, _, _ in nodes for k in inputs]
    assert fast.get_many(asked, inputs=True).tolist() == general.get_many(asked).tolist()
    assert fast.get_list(asked) == general.get_list(asked)


def test_a_far_key_set_before_the_array_reaches_it_is_still_found():
    pm = PageMap()
    far = (1 << 21) + 5  # beyond the first reach: goes to the dict
    pm.set_many([far], 7)
    pm.set_many(list(range(0, 1 << 22, 1 << 16)) + [(1 << 22) - 1], 3)  # the array grows past it
    assert pm.get(far) == 7
    pm.set_many([far], 9)  # now inside the array: the array's value wins from here on
    assert pm.get_many([far, 1 << 16, 12]).tolist() == [9, 3, MISSING]


def test_values_outside_int32_are_refused():
    import pytest

    with pytest.raises(OverflowError):
        PageMap().set_many([1], 1 << 31)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=60), st.integers(0, 1), st.sampled_from([1 << 12, 1 << 14, 1 << 16, DOUBLE_SLOTS]))
def test_a_climbing_key_range_doubles_the_array_below_double_slots_then_grows_by_an_eighth(steps, as_list, double_slots):
    # A hash_ids trace's keys climb (synth, Mooncake). Below DOUBLE_SLOTS the array (on glibc's
    # heap: each grow a copy of it) at least doubles: ~50 grows by an eighth a map in the
    # conversation trace's first 3,000 requests were copies of ~7 times the final array (issue
    # 41, session 30). From DOUBLE_SLOTS on (mmapped: realloc remaps) it grows to the top key and
    # an eighth more, in 4096-slot pages (doubling left up to half of a 1M run's ~134 MB map
    # unused). Every key set is still found in the array, none pushed to the dict.
    pm, model, top = PageMap(), {}, 0
    with patch.object(pagemap, "DOUBLE_SLOTS", double_slots):
        for i, step in enumerate(steps):
            keys = list(range(top, top + step * 97, 7))
            top += step * 97
            before = pm._n
            pm.set_many(keys if as_list else np.array(keys, dtype=np.int64), i + 1)  # both call paths
            model.update(dict.fromkeys(keys, i + 1))
            high, now = max(model), pm._n
            assert high < now and now % 4096 == 0
            assert now <= max(1 << 12, high + (high >> 3) + 4096, min(2 * high, double_slots))
            if now != before:
                assert now >= min(2 * before, double_slots)  # doubled, or grown past the threshold
                if before >= double_slots:
                    assert now <= high + (high >> 3) + 4096  # an eighth: no doubling
    assert not pm._sparse
    asked = list(model) + [top + 5, -1]
    assert pm.get_many(asked).tolist() == [model.get(k, MISSING) for k in asked]
    # every slot of the grown array (the kernel's zero pages, ~MISSING: session 36) that no key
    # set is MISSING, to the last one; a slot holds its value's complement
    dense = [~v for v in pm._flat().tolist()]
    assert [k for k, v in enumerate(dense) if v != MISSING] == sorted(model)
    assert all(dense[k] == model[k] for k in model)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12), st.sampled_from([0, (1 << 31) - 1]))
def test_grown_slots_are_missing_and_a_slot_holds_the_complement(steps, low):
    # A grow leaves its new slots to the kernel's zero pages (mremap of the map's mapping): zero
    # bytes are MISSING, a value v is held as ~v (session 36). Several maps grow over the same
    # keys (the ranks' maps), values at both ends of [0, 2**31): every slot no key set is zero.
    maps, model, top = [PageMap(GROW_SHIFT_MANY), PageMap(), PageMap(GROW_SHIFT_MANY)], {}, 0
    for i, step in enumerate(steps):
        keys = list(range(top, top + step * 97, 13))
        top += step * 97
        value = low if i % 2 else i + 1
        model.update(dict.fromkeys(keys, value))
        for pm in maps:
            pm.set_many(keys, value)
    for pm in maps:
        raw = pm._flat()
        assert np.flatnonzero(raw).tolist() == sorted(model)
        assert np.invert(raw[sorted(model)]).tolist() == [model[k] for k in sorted(model)]
        assert pm.get_many(list(model)).tolist() == list(model.values())


def test_a_grow_touches_no_page_of_its_unset_slots():
    # The point of the zero-bytes MISSING (session 36): at --dp 8 the 16 maps, each over the
    # whole trace's key range, were filled with -1 on every grow, every page touched (+38 k
    # minor faults of the engine). A map grown to ~48 MiB of slots by far keys (each inside its
    # reach) faults in a few pages, not the ~12 k pages a fill would write.
    import resource

    pm = PageMap(GROW_SHIFT_MANY)
    pm.set_many([0], 1)
    far = [1 << 20, 10 << 20]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for k in far:
        pm.set_many([k], 2)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert pm._n > 10 << 20 and not pm._sparse
    assert faults < 1024, faults
    assert pm.get_list([0, 1, *far]) == [1, MISSING, 2, 2]


@settings(max_examples=100, deadline=None)
@given(_OPS, st.integers(0, 1))
def test_a_leaf_is_made_for_each_range_a_key_was_set_in_in_the_order_first_set(ops, as_array):
    # The array is two-level (session 37): `_top[k >> LEAF_SHIFT]` names the leaf that holds
    # key k's slot, 0 for none; the leaves are made on a range's first set, numbered 1, 2, ...
    # in the order their first key comes (the C map_set's order, so both leave the same bytes),
    # and leaf 0, the zero leaf every range without one reads, is never written.
    pm, order = PageMap(), []
    for keys, value in ops:
        pm.set_many(np.array(keys, dtype=np.int64) if as_array else keys, value)
        for k in keys:
            if 0 <= k < pm._n and k >> LEAF_SHIFT not in order:
                order.append(k >> LEAF_SHIFT)
    top = np.frombuffer(pm._top, dtype=np.int32)
    assert pm._nleaves == len(order) and top.size == pm._n >> LEAF_SHIFT
    assert np.flatnonzero(top).tolist() == sorted(order)
    assert [int(top[r]) for r in order] == list(range(1, len(order) + 1))
    assert not any(pm._leaves[:LEAF])  # the zero leaf
    assert not any(pm._leaves[(len(order) + 1) * LEAF:])  # no leaf past those made
    assert len(pm._leaves) == pm._n + LEAF  # room for a leaf a range, and the zero one


def test_reads_and_sets_touch_only_the_leaves_of_the_keys_set():
    # The point of the leaves (session 37): at --dp 8 a rank sets ~8 % of its maps' key range,
    # in runs of ~120 keys a set key every ~12 slots on average: a flat array of zero pages
    # still touched 45 % of its pages (13.8 k), and reading never-set keys (blame of another
    # rank's pages) mapped ~5 k more. Runs of 128 keys every 4096 over ~40 MiB of slots make 2
    # leaves (512 bytes) a run; reading every key of the range touches no leaf page beyond them.
    import resource

    pm = PageMap(GROW_SHIFT_MANY)
    for k in (1 << 20, 10 << 20):  # grown first (each inside its reach): no grow inside the measure
        pm.set_many([k], 1)
    assert not pm._sparse and pm._n > 10 << 20
    runs = [np.arange(s, s + 128, dtype=np.int64) for s in range(0, 10 << 20, 4096)]  # 2,560 runs
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i, run in enumerate(runs):
        pm.set_many(run, i % 7)
    asked = np.arange(0, 10 << 20, 61, dtype=np.int64)  # every 4 KiB page of a flat array read
    got = pm.get_many(asked, inputs=True)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert pm._nleaves == 2 * len(runs) + 1
    # the leaves: 5,121 x 256 bytes = 320 pages; the top 40 KiB; numpy's temporaries of 172 k keys
    # (~1.4 MiB each); a flat array touched 2,560 pages set and all 10,240 read
    assert faults < 4_000, faults  # here ~2.2 k
    want = np.full(asked.size, MISSING)
    inrun = (asked % 4096) < 128
    want[inrun] = ((asked[inrun] // 4096) % 7)
    assert np.array_equal(got, want)


def test_a_mapping_that_cannot_be_resized_in_place_is_copied_into_a_new_one():
    # Where there is no mremap (CPython's mmap.resize raises SystemError there) a grow makes a
    # new mapping and copies the old bytes: the same bytes, zero beyond.
    import mmap

    class NoRemap(mmap.mmap):
        def resize(self, nbytes):
            raise SystemError("mmap: resizing not available--no mremap()")

    old = NoRemap(-1, 8192, flags=mmap.MAP_PRIVATE)
    old[:8] = b"\x01\x02\x03\x04\xfb\xff\xff\xff"
    grown = pagemap._resized(old, 3 * 8192)
    assert grown is not old and old.closed and len(grown) == 3 * 8192
    assert grown[:8] == b"\x01\x02\x03\x04\xfb\xff\xff\xff" and grown[8:] == bytes(3 * 8192 - 8)
    same = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)
    assert pagemap._resized(same, 8192) is same and len(same) == 8192


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=60), st.integers(0, 1), _OPS)
def test_a_map_of_one_of_several_ranks_grows_by_half_with_the_same_answers(steps, as_list, ops):
    # At --dp N every rank's two maps climb the same keys, each grow a copy of the array and a
    # fill: a --dp 8 conversation replay grew its 16 maps 500 times by an eighth (681 MB copied;
    # issue 41), 190 times by half (206 MB). The controller gives a rank of several
    # GROW_SHIFT_MANY; which keys the array holds never changes an answer.
    half, eighth, model, top = PageMap(GROW_SHIFT_MANY), PageMap(), {}, 0
    for i, step in enumerate(steps):
        keys = list(range(top, top + step * 97, 7))
        top += step * 97
        for pm in (half, eighth):
            pm.set_many(keys if as_list else np.array(keys, dtype=np.int64), i + 1)
        model.update(dict.fromkeys(keys, i + 1))
        high = max(model)
        assert high < half._n <= max(1 << 12, high + (high >> 1) + 4096, min(2 * high, DOUBLE_SLOTS))
    for keys, value in ops:
        for pm in (half, eighth):
            pm.set_many(keys, value)
        model.update(dict.fromkeys((k for k in keys if k >= 0), value))
    asked = list(model) + [top + 5, -1] + [k for keys, _ in ops for k in keys]
    expected = [model.get(k, MISSING) for k in asked]
    for pm in (half, eighth):
        assert pm.get_many(asked).tolist() == expected
        assert pm.get_list(asked) == expected
        assert len(pm) == len(model)


def test_the_grow_shift_survives_copy_and_pickle():
    import copy
    import pickle

    pm = PageMap(GROW_SHIFT_MANY)
    pm.set_many([5, 70_000], 3)
    for again in (copy.deepcopy(pm), pickle.loads(pickle.dumps(pm))):
        assert again._grow_shift == GROW_SHIFT_MANY
        again.set_many([200_000], 4)
        assert again._n == ((200_000 + (200_000 >> GROW_SHIFT_MANY)) | 4095) + 1
        assert again.get_list([5, 70_000, 200_000, 6]) == [3, 3, 4, MISSING]
    assert PageMap()._grow_shift == GROW_SHIFT
    # the state as before session 36: an array('i') of the values, MISSING where never set
    state = pm.__getstate__()["_dense"]
    assert state.typecode == "i" and state[5] == 3 and state[6] == MISSING


@settings(max_examples=100, deadline=None)
@given(_OPS)
def test_a_copy_answers_as_its_original(ops):
    import copy
    import pickle

    pm = PageMap()
    for keys, value in ops:
        pm.set_many(keys, value)
    asked = [k for keys, _ in ops for k in keys] + [0, 1, pm._n - 1, pm._n]
    for again in (copy.deepcopy(pm), pickle.loads(pickle.dumps(pm))):
        assert bytes(again._flat()) == bytes(pm._flat())
        assert again.get_list(asked) == pm.get_list(asked)
        assert again._sparse == pm._sparse and len(again) == len(pm)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=17), st.floats(), st.booleans(), st.none(),
                 st.text(), st.just("3"), st.just("\x00"), st.just(float("nan"))))
def test_a_grow_shift_outside_0_to_16_is_refused_in_one_line(bad):
    import pytest

    with pytest.raises(ValueError) as err:
        PageMap(bad)
    text = str(err.value)
    assert "\n" not in text and text.startswith("page map grow_shift ")


def test_the_controller_gives_a_rank_of_several_maps_that_grow_by_half():
    from tests.engine.helpers import small_config
    from tierdiag.engine.engine import Engine

    for dp, shift in ((1, GROW_SHIFT), (3, GROW_SHIFT_MANY)):
        engine = Engine(small_config(dp=dp, router="round_robin"))
        for rank in engine.ranks:
            assert rank.ctrl.cached_once._grow_shift == shift
            assert rank.ctrl.demoted_by._grow_shift == shift
