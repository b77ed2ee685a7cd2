"""Page keys: one per full page, chained so that equal keys mean equal prefixes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.errors import ConfigError
from tierdiag.trace.pages import _NUMPY_OUTPUT_PAGES, output_page_keys, page_keys, page_keys_array
from tierdiag.trace.reader import TraceRequest, max_hash_id

PAGE_SIZES = [1, 16, 64, 128, 512]


def hreq(input_len: int, hash_ids) -> TraceRequest:
    return TraceRequest("r", 0, 1, 0, input_len, 1, tuple(hash_ids), None)


def treq(tokens) -> TraceRequest:
    return TraceRequest("r", 0, 1, 0, len(tokens), 1, None, tuple(tokens))


def test_hash_ids_pages_narrated():
    # 1100 tokens in 512-token blocks [7, 9, 11]; 64-token pages, r = 8 a block:
    #   block 7 -> pages 56..63, block 9 -> 72..79, block 11 holds 76 tokens -> one full page, 88.
    keys = page_keys(hreq(1100, [7, 9, 11]), page_size=64, block_size=512)
    assert keys == [*range(56, 64), *range(72, 80), 88]
    assert len(keys) == 1100 // 64


def test_page_size_equal_to_block_size_uses_hash_ids_of_full_blocks():
    assert page_keys(hreq(1100, [7, 9, 11]), page_size=512, block_size=512) == [7, 9]


def test_input_shorter_than_a_page_has_no_keys():
    assert page_keys(hreq(63, [4]), page_size=64, block_size=512) == []
    assert page_keys(treq([1] * 63), page_size=64, block_size=512) == []


def test_block_size_must_be_a_multiple_of_page_size():
    with pytest.raises(ConfigError, match="block size 512 is not a multiple of page size 48"):
        page_keys(hreq(1000, [1, 2]), page_size=48, block_size=512)
    # Token traces have no blocks, so any page size works.
    assert len(page_keys(treq([1] * 100), page_size=48, block_size=512)) == 2


def test_page_size_must_be_positive():
    with pytest.raises(ConfigError, match="page size must be a positive"):
        page_keys(hreq(10, [1]), page_size=0, block_size=512)


def test_token_keys_are_63_bit_and_deterministic():
    tokens = list(range(300))
    keys = page_keys(treq(tokens), page_size=64, block_size=512)
    assert len(keys) == 4
    assert all(0 <= k < 2**63 for k in keys)
    # The first key is blake2b-64 of the first page's tokens as little-endian uint32 words.
    first = hashlib.blake2b(b"".join(t.to_bytes(4, "little") for t in tokens[:64]), digest_size=8).digest()
    assert keys[0] == int.from_bytes(first, "little") >> 1


# --- properties ---------------------------------------------------------------------------------

@st.composite
def _two_chained_requests(draw, block_size: int):
    """Two Mooncake-style requests that share their first `shared` blocks, then diverge."""
    n1 = draw(st.integers(1, 6 * block_size))
    n2 = draw(st.integers(1, 6 * block_size))
    b1, b2 = -(-n1 // block_size), -(-n2 // block_size)
    shared = draw(st.integers(0, min(b1, b2)))
    base = draw(st.integers(0, 10**6))
    ids1 = [base + i for i in range(b1)]
    ids2 = ids1[:shared] + [base + 100 + i for i in range(b2 - shared)]  # fresh ids never reused
    return hreq(n1, ids1), hreq(n2, ids2), shared


@settings(max_examples=200, deadline=None)
@given(data=st.data(), page_size=st.sampled_from(PAGE_SIZES))
def test_hash_id_prefix_shared_iff_key_prefix_shared(data, page_size):
    block_size = 512
    r1, r2, shared_blocks = data.draw(_two_chained_requests(block_size))
    k1 = page_keys(r1, page_size=page_size, block_size=block_size)
    k2 = page_keys(r2, page_size=page_size, block_size=block_size)
    assert len(k1) == r1.input_len // page_size and len(k2) == r2.input_len // page_size
    assert all(k >= 0 for k in k1 + k2)
    per_block = block_size // page_size
    for p in range(min(len(k1), len(k2))):
        # Page p lies in block p // per_block: the keys agree exactly when that block is shared.
        assert (k1[p] == k2[p]) == (p // per_block < shared_blocks)
    # No key of one request's unshared part appears anywhere in the other's.
    common = set(k1) & set(k2)
    assert common == set(k1[: shared_blocks * per_block]) & set(k2[: shared_blocks * per_block])


@st.composite
def _two_token_sequences(draw):
    vocab = st.integers(0, 2**32 - 1) if draw(st.booleans()) else st.integers(0, 3)  # tiny vocab: many equal pages
    prefix = draw(st.lists(vocab, max_size=300))
    # At least one token each: the reader never yields an empty input.
    t1 = prefix + draw(st.lists(vocab, min_size=1, max_size=200))
    t2 = prefix + draw(st.lists(vocab, min_size=1, max_size=200))
    return t1, t2


@settings(max_examples=200, deadline=None)
@given(seqs=_two_token_sequences(), page_size=st.sampled_from([1, 3, 16, 64]))
def test_token_keys_equal_iff_token_prefixes_equal(seqs, page_size):
    t1, t2 = seqs
    k1 = page_keys(treq(t1), page_size=page_size, block_size=512)
    k2 = page_keys(treq(t2), page_size=page_size, block_size=512)
    assert (len(k1), len(k2)) == (len(t1) // page_size, len(t2) // page_size)
    assert all(0 <= k < 2**63 for k in k1 + k2)
    for p in range(min(len(k1), len(k2))):
        end = (p + 1) * page_size
        assert (k1[p] == k2[p]) == (t1[:end] == t2[:end])


def test_equal_pages_after_different_prefixes_get_different_keys():
    # The same page content under a different prefix is a different key: keys chain.
    page = [5] * 64
    a = page_keys(treq([1] * 64 + page), page_size=64, block_size=512)
    b = page_keys(treq([2] * 64 + page), page_size=64, block_size=512)
    assert a[1] != b[1]


# --- a key names its prefix (what the storage tier keys pages by) ------------------------------

@settings(max_examples=100, deadline=None)
@given(pages=st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4), min_size=1, max_size=8),
       at=st.integers(0, 7), token=st.integers(0, 3))
def test_a_changed_token_changes_its_page_key_and_every_later_one(pages, at, token):
    """The storage tier keys pages by page key alone (engine/storage.py), which holds because a
    token key is chained through every page before it: a change in page `at` leaves the keys
    before it and changes its own and every later one."""
    at %= len(pages)
    changed = [list(p) for p in pages]
    changed[at][token] = (changed[at][token] + 1) % 2**32
    a = page_keys(treq([t for p in pages for t in p]), page_size=4, block_size=512)
    b = page_keys(treq([t for p in changed for t in p]), page_size=4, block_size=512)
    assert a[:at] == b[:at]
    assert all(x != y for x, y in zip(a[at:], b[at:]))


# --- output pages ------------------------------------------------------------------------------

def _output_keys_reference(req_id: str, last_input_key: int, num_pages: int) -> list[int]:
    """output_page_keys as its docstring says it, in Python ints: seed + j * step modulo 2**63,
    negated below zero."""
    digest = hashlib.blake2b(b"out" + last_input_key.to_bytes(8, "little", signed=True) + req_id.encode(),
                             digest_size=8).digest()
    seed = int.from_bytes(digest, "little") >> 1
    step = 0x9E3779B97F4A7C15 >> 1 | 1
    return [-((seed + j * step) % 2**63) - 1 for j in range(num_pages)]


@settings(max_examples=300, deadline=None)
@given(req_id=st.text(min_size=1, max_size=12), last=st.integers(0, 2**63 - 1),
       num_pages=st.one_of(st.integers(0, 40), st.integers(0, 2000)))
def test_output_page_keys_match_the_python_reference_on_both_sides_of_the_numpy_switch(req_id, last, num_pages):
    # From _NUMPY_OUTPUT_PAGES pages on the keys come from uint64 numpy arithmetic (wrapping
    # modulo 2**64, then masked to 63 bits): the same ints as the Python expression.
    got = output_page_keys(req_id, [last], num_pages)
    assert got == _output_keys_reference(req_id, last, num_pages)
    assert all(type(k) is int and k < 0 for k in got)


def test_output_page_keys_switch_is_where_the_tests_look():
    assert 0 < _NUMPY_OUTPUT_PAGES <= 40  # the property above draws 0..40 pages to cross it


# --- hash ids to keys -------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(data=st.data(), page_size=st.sampled_from(PAGE_SIZES + [256]), block_size=st.sampled_from([512, 1024]))
def test_hash_id_keys_are_id_times_pages_a_block_plus_page(data, page_size, block_size):
    input_len = data.draw(st.integers(1, 8 * block_size))
    num_blocks = -(-input_len // block_size)
    ids = data.draw(st.lists(st.integers(0, max_hash_id(block_size)), min_size=num_blocks, max_size=num_blocks))
    req = hreq(input_len, ids)
    per_block = block_size // page_size
    want = [ids[p // per_block] * per_block + p % per_block for p in range(input_len // page_size)]
    keys = page_keys_array(req, page_size=page_size, block_size=block_size)
    assert keys.dtype == np.int64 and keys.tolist() == want
    keys ^= 1  # the engine's arrays are its own: salting one leaves the next request's alone
    assert page_keys(req, page_size=page_size, block_size=block_size) == want
