"""The hash-chain check of a trace's lines (trace/chain.py): the compiled loop
(native/csrc/trace_chain.c) and its Python reference keep the same links and raise the same
message as the plain loop over a dict, on every line; the C function changes nothing where it
leaves a case to the reference."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.native import cplane
from tierdiag.trace import chain
from tierdiag.trace.chain import ChainLinks, _check_chain_slow, _link_chain_c, _link_chain_python
from tierdiag.trace.lines import BadLine
from tierdiag.trace.reader import _link_chain, max_hash_id

from tests.trace.test_trace_reader import _links  # the links read at C speed (numpy)

NONE = ChainLinks.NONE
needs_c = pytest.mark.skipif(cplane.C is None, reason="the compiled data plane is not built")
IMPLS = [pytest.param(_link_chain_python, id="python"),
         pytest.param(_link_chain_c, id="c", marks=needs_c)]


def test_the_reader_checks_with_the_chosen_side():
    compiled, reference = cplane.pairs()["reader.link_chain"]
    assert (compiled, reference) == (_link_chain_c, _link_chain_python)
    assert _link_chain is chain.link_chain is (reference if cplane.C is None else compiled)


_ID = st.one_of(st.integers(0, 12), st.integers(0, 40), st.sampled_from([10**6, 2**40, max_hash_id(1) - 1]))
# Lines past the C loop's stack buffer (256 ids): a known prefix, new ids, and maybe a break
# (a repeat, a fork) far in, whose links the loop must take back.
_LONG = st.tuples(st.integers(0, 40), st.integers(250, 600), st.one_of(st.none(), st.integers(1, 599)),
                  st.integers(0, 700)).map(
    lambda t: [*range(t[0], t[0] + t[1])][:t[2]] + [t[3]] + [*range(t[0] + t[1], t[0] + t[1] + 3)]
    if t[2] is not None else list(range(t[0], t[0] + t[1])))
_LINES = st.lists(st.one_of(st.lists(_ID, min_size=1, max_size=8),
                            st.integers(0, 30).map(lambda n: list(range(n, n + 5))),
                            st.tuples(st.lists(st.integers(0, 12), max_size=3),
                                      st.sampled_from([13, 20, 38, 10**6, 2**40, max_hash_id(1) - 6]),
                                      st.integers(1, 6)).map(lambda t: t[0] + list(range(t[1], t[1] + t[2]))),
                            _LONG),
                  max_size=12)


@pytest.mark.parametrize("link", IMPLS)
@pytest.mark.parametrize("slack", [ChainLinks.DENSE_SLACK, 0, 3])
@settings(max_examples=150, deadline=None)
@given(lines=_LINES)
def test_each_side_keeps_the_loops_links_or_raises_its_message(link, slack, lines):
    fast = ChainLinks()
    slow: dict[int, int] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ChainLinks, "DENSE_SLACK", slack)
        for ids in map(tuple, lines):
            try:
                want = _check_chain_slow(ids, slow)
            except BadLine as exc:
                with pytest.raises(BadLine) as got:
                    link(ids, fast)
                assert str(got.value) == str(exc)
            else:
                slow.update(want)
                link(ids, fast)
            assert _links(fast) == slow and len(fast) == len(slow)
            assert all(fast.get(h) == slow.get(h) for h in (*ids, -1, 0, 41, 10**6, 2**40))


def _dense(*links: int) -> array:
    return array("q", links)


@needs_c
@pytest.mark.parametrize("ids", [(0, 1, 1), (0, 2, 0), (1, 0, 1), (0, 1, 2, 3, 1), (3, 3), (0, 5), (5,), (0, -1),
                                 (0, 2**63), (0, 2**70), (0, -(2**70)), (0, True), (0, 1.0), (0, "1"), (0, None)])
def test_the_c_loop_changes_nothing_where_it_answers_minus_one(ids):
    # A repeat, a fork, an id outside the array (past it, negative, past int64), anything not an
    # exact int: -1 with the array as it was, every link this call wrote taken back.
    c = cplane.compiled("link_chain")
    dense = _dense(-1, 0, NONE, NONE, NONE)
    before = dense.tolist()
    assert c(dense, ids) == -1
    assert dense.tolist() == before


@needs_c
@pytest.mark.parametrize("dense, ids", [(bytearray(40), (0,)), (b"\xfe" * 40, (0,)), (array("i", [-2] * 4), (0,)),
                                        (array("d", [-2.0] * 4), (0,)), (memoryview(array("q", [-2] * 4))[::2], (0,)),
                                        (array("q", [-2] * 4), [0, 1]), (array("q", [-2] * 4), range(2)),
                                        (None, (0,)), ([-2, -2], (0,))])
def test_the_c_loop_leaves_what_is_not_its_case(dense, ids):
    # Not a writable native int64 array, not a tuple: the reference's case (nothing written).
    c = cplane.compiled("link_chain")
    before = bytes(dense) if isinstance(dense, (bytes, bytearray)) else None
    assert c(dense, ids) == -1
    if before is not None:
        assert bytes(dense) == before


@needs_c
def test_the_c_loop_links_and_counts():
    c = cplane.compiled("link_chain")
    dense = _dense(*[NONE] * 8)
    assert c(dense, (0, 1, 2)) == 3 and dense.tolist()[:3] == [-1, 0, 1]
    assert c(dense, (0, 1, 2)) == 0
    assert c(dense, (0, 1, 5, 4)) == 2 and dense[5] == 1 and dense[4] == 5
    assert c(dense, ()) == 0
    with pytest.raises(TypeError):
        c(dense)
    with pytest.raises(TypeError):
        c(dense, (0,), 1)


@pytest.mark.parametrize("link", IMPLS)
def test_a_rejected_line_leaves_no_links(link):
    links = ChainLinks()
    link((0, 1, 2), links)
    with pytest.raises(BadLine, match="id 1 at position 2 follows id 8 here but id 0 before"):
        link((7, 8, 1), links)  # 7 and 8 would be new: neither may stay linked
    assert links.get(7) is None and links.get(8) is None and len(links) == 3
