"""A columnar hand-over's object columns of text sent as Arrow buffers (issue 41, session 34):
`_cplane.text_column` makes a list of str and None the offsets, UTF-8 data and validity of an
Arrow string array (None for any other list: the list is sent then), store/frames.py's
`out_of_band` sends them out of band, and the writer's `store/columns.py` `text_column` (Arrow)
and the recorder's `text_values` (Python values) read them back. Held here to the list path:
the same Arrow arrays (or the same refusal) and the same Python values for hostile text, NULLs,
str subclasses and other objects, through a real frame; hostile buffers refused, naming the
column."""

from __future__ import annotations

import enum
import pickle
import struct
from array import array

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.native import cplane
from tierdiag.probes.recorder import columns_of, text_values
from tierdiag.store import frames
from tierdiag.store.columns import arrow_column, table_columns, text_column

_needs_c = pytest.mark.skipif(cplane.compiled("text_column") is None, reason=f"_cplane: {cplane.WHY_NOT}")


class _Kind(enum.StrEnum):
    A = "a"
    B = "bé"


# unicode of every kind (NUL, escapes, astral), lone surrogates (no UTF-8 form), None, a str
# subclass, and objects that are no text
_TEXT = st.one_of(st.text(max_size=8), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2))
_VALUE = st.one_of(_TEXT, st.none(), st.sampled_from(list(_Kind)), st.integers(min_value=-2**70, max_value=2**70),
                   st.floats(allow_nan=False), st.binary(max_size=3))
_COLUMN = st.one_of(st.lists(st.one_of(st.text(max_size=8), st.none()), max_size=40), st.lists(_VALUE, max_size=40))


def _arrow_or_refusal(table, col, values):
    try:
        return arrow_column(table, col, values).to_pylist()
    except (OverflowError, UnicodeEncodeError, pa.ArrowException, TypeError) as exc:
        return ("refused", type(exc).__name__)


def _texts(values) -> bool:
    """What text_column takes: every value exactly a str with a UTF-8 form, or None; one str at least."""
    def encodes(v):
        try:
            v.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False
    return (all(v is None or (type(v) is str and encodes(v)) for v in values)
            and any(v is not None for v in values))


@_needs_c
@given(values=_COLUMN)
@settings(max_examples=300, deadline=None)
def test_text_column_is_the_arrow_string_array_of_the_values_or_none(values):
    got = cplane.compiled("text_column")(values)
    if not _texts(values):
        assert got is None
        return
    offsets, data, valid, nulls = got
    n = len(values)
    array_ = pa.Array.from_buffers(pa.string(), n, [None if valid is None else pa.py_buffer(valid),
                                                    pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)
    array_.validate(full=True)
    assert array_.equals(pa.array(values, type=pa.string()))
    assert nulls == values.count(None) and (valid is None) == (nulls == 0)
    assert text_values("c", n, (frames.TEXT, offsets, data, valid, nulls)) == values


@_needs_c
@pytest.mark.parametrize("values, taken", [
    # ASCII read in place (its own UTF-8), beside values encoded by the call, long and empty ones
    (["abc", "", "\x00x", "z" * 5000, None, "é", "日本", "\U0001F600", "abc"], True),
    # an ASCII value then one with no UTF-8 form: the list as it is
    (["abc", "\ud800"], False),
    # ASCII text in a str subclass: not exactly a str
    (["abc", _Kind.A], False),
])
def test_ascii_text_is_read_in_place_the_rest_encoded(values, taken):
    """`text_column` reads a compact ASCII str's bytes in place (issue 41, session 35), any other
    str through its UTF-8: both the values' bytes, in order, as pa.array makes them."""
    got = cplane.compiled("text_column")(values)
    if not taken:
        assert got is None
        return
    offsets, data, valid, nulls = got
    assert bytes(data) == "".join(v for v in values if v is not None).encode("utf-8")
    array_ = pa.Array.from_buffers(pa.string(), len(values), [None if valid is None else pa.py_buffer(valid),
                                                              pa.py_buffer(offsets), pa.py_buffer(data)],
                                   null_count=nulls)
    array_.validate(full=True)
    assert array_.equals(pa.array(values, type=pa.string()))


@_needs_c
@pytest.mark.parametrize("bad", [(), ("a",), [1], "abc", None, 3])
def test_text_column_takes_a_list_only(bad):
    if isinstance(bad, tuple):
        with pytest.raises(TypeError):
            cplane.compiled("text_column")(bad)
        return
    if isinstance(bad, list):
        assert cplane.compiled("text_column")(bad) is None
        return
    with pytest.raises(TypeError):
        cplane.compiled("text_column")(bad)


def _hand_over(n, objects):
    """A columnar hand-over as engine/emitters.py's Columns.take() makes one: `n` rows of one
    int column, the object columns given."""
    return {"n": n, "ints": (("eviction_id",), struct.pack(f"<{n}q", *range(n))), "coded": ((), []),
            "objects": objects, "constants": (), "tuples": (), "at": b"", "rows": []}


def _through_a_frame(tables):
    data = b"".join(bytes(p) for p in frames.encode(("row_tuples", frames.out_of_band(tables))))
    return frames.loads(data[8:])[1]


@given(cause=_COLUMN, data=st.data())
@settings(max_examples=200, deadline=None)
def test_a_hand_over_sent_through_a_frame_reads_back_as_its_lists(cause, data):
    """The evictions' request-id columns (VARCHAR) and a BIGINT column given anything: the
    writer's Arrow columns and the recorder's Python values are the list path's, or refused as it
    refuses them."""
    n = len(cause)
    owner = data.draw(st.lists(st.one_of(st.text(max_size=5), st.none()), min_size=n, max_size=n))
    odd = data.draw(st.lists(_VALUE, min_size=n, max_size=n))  # into a BIGINT column: text refused there as before
    fields = ("eviction_id", "cause_req_id", "owner_req_id", "tokens")
    tables = {"evictions": (fields, _hand_over(n, {"cause_req_id": cause, "owner_req_id": owner, "tokens": odd}))}
    back = _through_a_frame(tables)
    sent = back["evictions"][1]["objects"]
    if cplane.compiled("text_column") is not None:
        for name, values in (("cause_req_id", cause), ("owner_req_id", owner), ("tokens", odd)):
            assert isinstance(sent[name], tuple) == _texts(values), name
    else:
        assert all(isinstance(v, list) for v in sent.values())
    before = table_columns("evictions", fields, tables["evictions"][1])
    after = table_columns("evictions", fields, back["evictions"][1])
    for f in fields:
        assert _arrow_or_refusal("evictions", f, after[f]) == _arrow_or_refusal("evictions", f, before[f]), f
    assert columns_of(fields, back["evictions"][1]) == columns_of(fields, tables["evictions"][1])


def _sent(values):
    offsets = array("i", [0])
    data = b""
    bits = 0
    for i, v in enumerate(values):
        if v is not None:
            data += v.encode()
            bits |= 1 << i
        offsets.append(len(data))
    nulls = values.count(None)
    valid = bits.to_bytes((len(values) + 7) // 8, "little") if nulls else None
    return [frames.TEXT, offsets.tobytes(), data, valid, nulls]


@pytest.mark.parametrize("spoil", ["tag", "short", "long", "offsets down", "past data", "not utf-8", "nulls",
                                   "valid size", "no valid", "data at null", "first offset", "arity"])
def test_hostile_text_buffers_are_refused_naming_the_column(spoil):
    values = ["ab", None, "c", "dé"]
    sent = _sent(values)
    n = len(values)
    off = array("i")
    off.frombytes(sent[1])
    if spoil == "tag":
        sent[0] = "list"
    elif spoil == "short":
        sent[1] = sent[1][:-4]
    elif spoil == "long":
        sent[1] += b"\0\0\0\0"
    elif spoil == "offsets down":
        off[2], off[3] = off[3], off[2]
        sent[1] = off.tobytes()
    elif spoil == "past data":
        off[n] += 9
        sent[1] = off.tobytes()
    elif spoil == "not utf-8":
        sent[2] = b"\xff" + sent[2][1:]
    elif spoil == "nulls":
        sent[4] = 2
    elif spoil == "valid size":
        sent[3] += b"\0"
    elif spoil == "no valid":
        sent[3] = None
    elif spoil == "data at null":
        sent[3] = b"\x0c"  # row 0 ("ab") a null, row 1 valid: "ab"'s bytes at a null
        sent[4] = 2
    elif spoil == "first offset":
        off[0] = 1
        sent[1] = off.tobytes()
    elif spoil == "arity":
        sent = sent[:4]
    sent = tuple(sent)
    with pytest.raises(ValueError, match="owner_req_id"):
        text_values("owner_req_id", n, sent)
    if spoil in ("data at null", "first offset"):
        # Arrow reads its own layout: data at a null is allowed there, offsets need not start at 0
        return
    with pytest.raises(ValueError, match="evictions.owner_req_id"):
        text_column("evictions", "owner_req_id", n, sent)


def test_good_text_buffers_read_back_both_ways():
    values = ["ab", None, "c", "dé", "", "\0"]
    sent = tuple(_sent(values))
    assert text_values("owner_req_id", len(values), sent) == values
    assert text_column("evictions", "owner_req_id", len(values), sent).to_pylist() == values
    # a column the schema does not type VARCHAR: its Python values, for arrow_column to refuse as before
    assert text_column("evictions", "tokens", len(values), sent) == values


@_needs_c
def test_the_sent_frame_carries_no_text_object_a_row():
    """The point of it: a hand-over of 5,000 request ids pickles no str a row (the ids' bytes
    travel out of band, the pickle stays small)."""
    ids = [str(i) for i in range(5000)]
    tables = {"evictions": (("eviction_id", "cause_req_id"), _hand_over(5000, {"cause_req_id": ids}))}
    prefix, data, *views = frames.encode(("row_tuples", frames.out_of_band(tables)))
    assert len(data) < 1000 and len(views) == 3
    assert pickle.dumps(ids, protocol=5).__len__() > 20_000
