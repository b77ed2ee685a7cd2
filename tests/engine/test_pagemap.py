"""PageMap (engine/pagemap.py) behaves as the dict it replaces: page key -> eviction id, for
dense hash_ids keys (the array), far keys (the dict), growth, and both call sizes."""

import numpy as np
from hypothesis import given, settings, strategies as st

from tierdiag.engine.pagemap import DENSE_LIMIT, MISSING, PageMap

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
@given(st.lists(st.integers(1, 400), min_size=1, max_size=60), st.integers(0, 1))
def test_a_climbing_key_range_grows_the_array_by_an_eighth_not_double(steps, as_list):
    # A hash_ids trace's keys climb (synth, Mooncake): the array grows to the top key and an eighth
    # more, in 4096-slot pages (issue 41: doubling left up to half of a 1M run's ~134 MB map
    # unused), and every key set is still found in it, none pushed to the dict.
    pm, model, top = PageMap(), {}, 0
    for i, step in enumerate(steps):
        keys = list(range(top, top + step * 97, 7))
        top += step * 97
        pm.set_many(keys if as_list else np.array(keys, dtype=np.int64), i + 1)  # both call paths
        model.update(dict.fromkeys(keys, i + 1))
        high = max(model)
        assert high < len(pm._dense) <= max(1 << 12, high + (high >> 3) + 4096)
    assert not pm._sparse
    asked = list(model) + [top + 5, -1]
    assert pm.get_many(asked).tolist() == [model.get(k, MISSING) for k in asked]
