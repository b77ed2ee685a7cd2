"""lru's heap entries in C (issue 41, session 27): `_cplane.lru_entry` and `_cplane.lru_id` make
an entry and read its node id back without big-int operations in compiled code. Each must answer
what the Python expression it replaced answers, for any input: checked here against that
expression, hostile values included."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import tree as tree_mod
from tierdiag.engine.tree import RadixTree
from tierdiag.engine.tree_node import TreeNode
from tierdiag.native import cplane

C = cplane.C
needs_c = pytest.mark.skipif(C is None, reason="the compiled data plane is not built")

HOSTILE_INTS = st.one_of(st.integers(-2**70, 2**70), st.integers(-3, 2**64 + 3),
                         st.sampled_from([0, -1, 2**48 - 1, 2**48, 2**62, 2**63 - 1, 2**63, 2**64, -2**63 - 1]))


def _entry(ns: int, seq: int, nid: int) -> int:
    return ((((ns << 64) | seq)) << 48) | nid


@needs_c
@settings(max_examples=400, deadline=None)
@given(ns=HOSTILE_INTS, seq=HOSTILE_INTS, nid=HOSTILE_INTS)
def test_lru_entry_is_the_expression_or_none_outside_its_ranges(ns, seq, nid):
    got = C.lru_entry(ns, seq, nid)
    inside = 0 <= ns < 2**63 and 0 <= seq < 2**63 and 0 <= nid < 2**48
    if inside:
        assert got == _entry(ns, seq, nid) and type(got) is int
    else:
        assert got is None


@needs_c
@settings(max_examples=300, deadline=None)
@given(ns=st.integers(0, 2**63 - 1), seq=st.integers(0, 2**63 - 1), nid=st.integers(0, 2**48 - 1),
       shift=st.integers(0, 62))
def test_lru_entry_is_exact_at_every_digit_boundary(ns, seq, nid, shift):
    """Values whose top lands on every 30-bit digit (the C writes an int's digits itself):
    equal, hashing and printing as the expression's (a leading zero digit would not)."""
    for args in ((ns >> shift, seq >> shift, nid >> min(shift, 47)), (0, 0, nid >> shift), (0, seq >> shift, 0),
                 (ns >> shift, 0, 0), (2**63 - 1, 2**63 - 1, 2**48 - 1)):
        got, want = C.lru_entry(*args), _entry(*args)
        assert got == want and hash(got) == hash(want) and str(got) == str(want)
        assert got.bit_length() == want.bit_length() and (got > want - 1) and not (got < want)


@needs_c
def test_lru_entry_declines_what_is_not_an_exact_int():
    for bad in (1.0, True, "1", None, np.int64(1)):
        assert C.lru_entry(bad, 1, 1) is None
        assert C.lru_entry(1, bad, 1) is None
        assert C.lru_entry(1, 1, bad) is None
    with pytest.raises(TypeError):
        C.lru_entry(1, 2)


@needs_c
@settings(max_examples=400, deadline=None)
@given(entry=st.one_of(HOSTILE_INTS, st.integers(-2**200, 2**200)))
def test_lru_id_is_the_mask_for_any_int(entry):
    got = C.lru_id(entry)
    assert got == entry & ((1 << 48) - 1) and type(got) is int


@needs_c
def test_lru_id_of_other_objects_is_python_s_and():
    assert C.lru_id(True) == 1
    assert C.lru_id(np.int64(-5)) == np.int64(-5) & ((1 << 48) - 1)
    with pytest.raises(TypeError):
        C.lru_id(1.5)


@settings(max_examples=200, deadline=None)
@given(ns=st.one_of(st.integers(-2**70, 2**70), st.integers(0, 2**63 - 1)), seq=st.integers(0, 2**63 - 1),
       nid=st.integers(0, 2**48 - 1))
def test_a_node_s_lru_entry_is_the_expression_whatever_its_stamp(ns, seq, nid):
    """RadixTree._lru_entry (the C where the stamp is in range, else the expression: a
    negative or huge access time) against the expression; and the id read back from it."""
    tree = RadixTree(1)
    node = TreeNode(nid, tree.root, array("q", [1]), [], None, 0, None)
    node.last_access_ns, node.access_seq = ns, seq
    entry = tree._lru_entry(node)
    assert entry == _entry(ns, seq, nid)
    assert (entry & tree_mod._ID_MASK) == nid
    if C is not None:
        assert C.lru_id(entry) == nid


def test_lru_victims_come_out_in_stamp_order():
    """A small tree under lru: the victims leave oldest stamp first, through the C entries and
    ids (or the expression on the numpy data plane), a negative stamp among them."""
    tree = RadixTree(1)
    nodes = []
    for k, ns in enumerate([50, -7, 3, 2**40, 0]):
        node = tree._new_node(tree.root, array("q", [k + 1]), array("q", [k]), None, ns, None)
        node.last_access_ns = ns
        tree._stamp(node, ns)
        tree._push_device(node)
        nodes.append(node)
    order = []
    while (victim := tree.pop_device_victim()) is not None:
        order.append(victim.last_access_ns)
        tree.delete(victim)
    assert order == sorted([50, -7, 3, 2**40, 0])
