"""The live pass's index made from the trace's hash ids (`block_ids`, stackdist.c, issue 41: the
writer's read-ahead never makes the page keys) against its numpy twin, a plain dict, and the index
of the same pages' keys (`dense_ids`): other names, the same stack answers. Hostile hash ids
(repeats within and across requests, the int64 extremes, shared low or high bits), requests with
no block, no page, or part of their last block; malformed arguments refused by both; and
`_Pages` keeping a chunk's hash ids only while unsampled, its keys made where a sample or the
close's lines need them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tierdiag.diagnose.run import live_curves as lc
from tierdiag.diagnose.run import size_curves as sc
from tests.diagnose.test_size_curves import _request, pages_both_ways  # a read request; two _Pages of them

_GOLDEN = 0x9E3779B97F4A7C15
# Hash ids hard on a hash table (test_live_curves_native's kinds), small enough that a page key
# (hash id x pages a block + page) stays in int64 for the key route compared against.
_HOSTILE = st.one_of(
    st.integers(0, 2**40),
    st.sampled_from([0, 1, 2**31, 2**32, 2**40 - 1]),
    st.integers(0, 40).map(lambda k: 1 << k),
    st.integers(0, 255).map(lambda k: k << 32),
    st.integers(0, 1000).map(lambda k: (k * _GOLDEN) % 2**41),
)


@st.composite
def chunks(draw):
    """(hash ids end to end, blocks a request, pages a request, pages a block): a few distinct
    hostile ids repeated, some requests with no block, pages from none to all of their blocks'."""
    per = draw(st.sampled_from([1, 2, 3, 8, 64]))
    pool = draw(st.lists(_HOSTILE, min_size=1, max_size=12, unique=True))
    blocks = draw(st.lists(st.integers(0, 5), max_size=12))
    hids = draw(st.lists(st.sampled_from(pool), min_size=sum(blocks), max_size=sum(blocks)))
    lens = [draw(st.integers(0, b * per)) for b in blocks]
    return (np.array(hids, dtype=np.int64), np.array(blocks, dtype=np.int64), np.array(lens, dtype=np.int64),
            per)


def _dict_ids(hids, blocks, lens, per) -> tuple[list[int], int]:
    """The plain reference: a dict numbers the hash ids as they first come; a page's id is its
    block's number x per + its place; each request's pages reversed."""
    number: dict[int, int] = {}
    nums = [number.setdefault(h, len(number)) for h in hids.tolist()]
    out, at = [], 0
    for b, n in zip(blocks.tolist(), lens.tolist()):
        out += [nums[at + p // per] * per + p % per for p in range(n)][::-1]
        at += b
    return out, len(number) * per


def _compiled():
    return pytest.importorskip("tierdiag.native._stackdist")


@settings(max_examples=400, deadline=None)
@given(chunks())
def test_block_ids_compiled_and_numpy_give_the_dicts_numbers(drawn):
    hids, blocks, lens, per = drawn
    want, n = _dict_ids(hids, blocks, lens, per)
    twin, tn = lc._block_ids_numpy(hids, blocks, lens, per)
    assert tn == n and twin.tolist() == want
    compiled = _compiled()
    out = np.empty(int(lens.sum()), dtype=np.int64)
    assert compiled.block_ids(hids, blocks, lens, per, out) == n and out.tolist() == want
    got, gn = lc.block_ids(hids, blocks, lens, per)
    assert gn == n and got.tolist() == want


def _same_names(a: list[int], b: list[int]) -> bool:
    """Whether `a` and `b` name the same keys alike (a one-to-one renaming of each other)."""
    fwd: dict[int, int] = {}
    back: dict[int, int] = {}
    return len(a) == len(b) and all(fwd.setdefault(x, y) == y and back.setdefault(y, x) == x for x, y in zip(a, b))


@settings(max_examples=300, deadline=None)
@given(chunks())
def test_an_index_of_hash_ids_answers_as_the_index_of_their_page_keys(drawn):
    """`of_blocks` against `of_flat` of the same pages' keys (`_hid_keys`): the ids rename the
    keys one to one, and a walk of every request (each looked up whole, then again) answers the
    same depths on stacks of either index's size."""
    hids, blocks, lens, per = drawn
    keys, klens, _ = sc._hid_keys(hids, blocks, lens, per)
    seq = np.arange(len(lens), dtype=np.int64)
    by_keys = lc.TraceIndex.of_flat(seq, keys, klens)
    by_hids = lc.TraceIndex.of_blocks(seq, hids, blocks, lens, per)
    assert by_hids.lens.tolist() == by_keys.lens.tolist() and by_hids.off.tolist() == by_keys.off.tolist()
    assert _same_names(by_keys.rev_ids.tolist(), by_hids.rev_ids.tolist())
    assert by_hids.n_ids >= by_keys.n_ids and by_hids.rev_ids.dtype == np.int32
    order = np.r_[np.arange(len(lens)), np.arange(len(lens))[::-1]]
    answers = []
    for ix in (by_keys, by_hids):
        ln = ix.lens.astype(np.int64)[order]
        answers.append([lc.walk(make(ix.n_ids), ix.rev_ids, ix.off[order], ln, ln, np.zeros(len(order), np.int64))
                        .tolist() for make in (lc.StackPython, lc.new_stack)])
    assert answers[0][0] == answers[0][1] == answers[1][0] == answers[1][1]


_BAD = [
    ([1, 2], [1], [3], 1, 3),      # lens past blocks x per_block
    ([1, 2], [3], [2], 1, 2),      # blocks past the hash ids
    ([1, 2], [1], [1], 1, 1),      # blocks short of the hash ids
    ([1], [1], [1], 0, 1),         # per_block 0
    ([1], [1], [1], -2, 1),        # per_block negative
    ([1], [1], [1], 2**31, 1),     # per_block past int32
    ([1], [-1], [0], 1, 0),        # a negative block count
    ([1], [1], [-1], 1, 0),        # a negative page count
    ([1], [1, 0], [1], 1, 1),      # blocks and lens of other lengths
]


@settings(deadline=None)  # a loaded machine's pauses are not the test's subject
@given(st.sampled_from(_BAD))
def test_block_ids_refuse_what_does_not_add_up(bad):
    hids, blocks, lens, per, n_out = bad
    args = [np.array(x, dtype=np.int64) for x in (hids, blocks, lens)]
    with pytest.raises(ValueError):
        lc._block_ids_numpy(*args, per)
    compiled = _compiled()
    out = np.full(max(n_out, 0), 7, dtype=np.int64)
    with pytest.raises(ValueError):
        compiled.block_ids(*args, per, out)
    assert out.tolist() == [7] * max(n_out, 0)  # nothing written


def test_block_ids_refuse_an_out_of_another_length():
    compiled = _compiled()
    args = [np.array(x, dtype=np.int64) for x in ([4, 5], [2], [3])]
    for n in (2, 4):
        with pytest.raises(ValueError):
            compiled.block_ids(*args, 2, np.zeros(n, dtype=np.int64))
    with pytest.raises((ValueError, TypeError, BufferError)):
        compiled.block_ids(*args, 2, np.zeros(3, dtype=np.int64)[::1].copy().astype(np.int32))


def test_block_ids_of_nothing():
    empty = np.zeros(0, dtype=np.int64)
    assert lc._block_ids_numpy(empty, empty, empty, 8)[1] == 0
    assert lc.block_ids(empty, empty, empty, 8)[0].tolist() == []
    out, n = lc.block_ids(empty, np.array([0, 0]), np.array([0, 0]), 8)
    assert n == 0 and out.tolist() == []


def test_block_ids_past_the_tables_first_sizes():
    """200k hash ids over ~60k distinct: the table grows; the same numbers as the numpy twin."""
    rng = np.random.default_rng(11)
    pool = rng.integers(0, 2**40, 60_000, dtype=np.int64)
    hids = pool[rng.integers(0, len(pool), 200_000)]
    blocks = np.diff(np.r_[0, np.sort(rng.integers(0, len(hids), 5000)), len(hids)]).astype(np.int64)
    lens = (blocks * 8 - rng.integers(0, 8, len(blocks))).clip(0)
    assert [a.tolist() if isinstance(a, np.ndarray) else a for a in lc.block_ids(hids, blocks, lens, 8)] == \
        [a.tolist() if isinstance(a, np.ndarray) else a for a in lc._block_ids_numpy(hids, blocks, lens, 8)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(st.lists(_HOSTILE, min_size=1, max_size=6, unique=True), st.integers(0, 31),
                                st.booleans()),
                      min_size=1, max_size=25),
       chunk=st.sampled_from([1, 3, 4096]), budget=st.one_of(st.just(2**62), st.integers(-1, 300)),
       page=st.sampled_from([16, 64, 512]))
def test_pages_keep_hash_ids_while_unsampled_and_index_as_their_keys_would(monkeypatch, lines, chunk, budget,
                                                                           page):
    """`_Pages.add_request` keeps plain chunks' hash ids (`_HashIds`) only while unsampled; its
    index (from the hash ids where every chunk kept them) renames the index that the same
    requests' keys give (`add`, the key route), with the same columns, and its key chunks and
    lines are the key route's; a tokens line among them, or a sample, makes the keys."""
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    monkeypatch.setattr(sc._Pages, "_CHUNK", chunk)
    reqs = []
    for i, (hids, extra, tokens) in enumerate(lines):
        if tokens and i % 5 == 4:
            reqs.append(_request(i, None, tokens=tuple(range(i, i + 40)), input_len=40))
        else:
            block_pages = 16  # input lengths anywhere in the hash ids' last block (32 steps of 16)
            reqs.append(_request(i, tuple(hids), input_len=len(hids) * 512 - extra * block_pages))
    by_keys, by_hids = pages_both_ways(reqs, page)
    kept = any(isinstance(c, sc._HashIds) for c in by_hids.chunks)
    assert not (kept and by_hids.sampled)
    assert kept == (not by_hids.sampled and all(r.hash_ids is not None for r in reqs[:chunk]))
    one, two = by_keys.index(), by_hids.index()
    for name in ("seq", "lens", "off", "arrival_ns", "pred", "line", "req_hash", "input_len", "full_lens"):
        assert getattr(one, name).tolist() == getattr(two, name).tolist(), name
    assert (one.keep is None) == (two.keep is None) and one.rate == two.rate
    assert _same_names(one.rev_ids.tolist(), two.rev_ids.tolist())
    if by_hids.sampled:  # the key route taken: the same ids
        assert one.rev_ids.tolist() == two.rev_ids.tolist() and one.looks.tolist() == two.looks.tolist()


def test_pages_lines_make_the_keys_of_kept_hash_ids():
    """The close's lines (`_Pages.lines`, an unsampled read the index did not take) are the key
    route's, from a read that kept only hash ids."""
    reqs = [_request(i, (3 * i, 3 * i + 1, 7), input_len=1500) for i in range(9)]
    by_keys, by_hids = sc._Pages(64), sc._Pages(64)
    for r in reqs:
        by_keys.add(r.line, r.seq, r.req_id, r.input_len, sc._request_keys(r, 64, 512), r.arrival_ns, r.session,
                    r.output_len)
        by_hids.add_request(r, 512)
    by_keys.finish()
    by_hids.finish()
    assert all(isinstance(c, sc._HashIds) for c in by_hids.chunks)
    want = [(a, b, c, d, k.tolist()) for a, b, c, d, k in by_keys.lines()]
    assert [(a, b, c, d, k.tolist()) for a, b, c, d, k in by_hids.lines()] == want
