"""store/frames.py's frames with out-of-band buffers (issue 41, session 28): a PickleBuffer in the
object travels after the pickle, written from its own memory and read back as a slice of the
frame's bytes; WriterProcess.append_rows wraps the columnar hand-overs' int blocks so
(`out_of_band`). Held here to the object sent (every shape, any bytes), over a real pipe, and
hostile frame bodies to a ValueError or the unpickler's own error, never a wrong object."""

from __future__ import annotations

import os
import pickle
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.store.frames import encode, loads, out_of_band, read_frame, read_raw, send_frame

_BLOBS = st.binary(max_size=300)
_VALUES = st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=6), _BLOBS,
                                 _BLOBS.map(pickle.PickleBuffer)),
                       lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                               st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=12)


def _plain(value):
    """`value` as it reads back: a PickleBuffer's (or a buffer slice's) bytes as bytes."""
    if isinstance(value, (pickle.PickleBuffer, memoryview)):
        return bytes(memoryview(value))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _body(obj) -> bytes:
    """The frame's body as read_raw hands it over (the length header taken off)."""
    data = b"".join(bytes(p) for p in encode(obj))
    (size,) = struct.unpack_from("<Q", data)
    assert size == len(data) - 8
    return data[8:]


@given(obj=_VALUES)
@settings(max_examples=200, deadline=None)
def test_a_frame_reads_back_as_sent_its_buffers_out_of_band(obj):
    prefix, data, *views = encode(obj)
    assert all(isinstance(v, memoryview) for v in views)
    assert _plain(loads(_body(obj))) == _plain(obj)


def test_a_buffer_travels_after_the_pickle_not_in_it():
    blob = bytes(range(256)) * 64
    prefix, data, *views = encode(("rows", pickle.PickleBuffer(blob)))
    assert blob not in data and len(views) == 1 and views[0].obj is blob  # its own memory, not a copy
    back = loads(_body(("rows", pickle.PickleBuffer(blob))))
    assert bytes(back[1]) == blob


def test_out_of_band_wraps_only_a_columnar_hand_overs_int_block():
    block = b"\x01" * 16
    tables = {"evictions": (("a",), {"n": 1, "ints": (("a", "b"), block), "objects": {}}),
              "request_evictions": (("x",), [(1,)])}
    out = out_of_band(tables)
    assert isinstance(out["evictions"][1]["ints"][1], pickle.PickleBuffer)
    assert out["request_evictions"] is tables["request_evictions"] or out["request_evictions"] == tables["request_evictions"]
    assert tables["evictions"][1]["ints"][1] is block  # the hand-over itself untouched
    back = loads(_body(("row_tuples", out)))[1]
    assert bytes(back["evictions"][1]["ints"][1]) == block and back["request_evictions"] == (("x",), [(1,)])


@pytest.mark.parametrize("size", [0, 100, 70_000, 3_000_000])
def test_frames_through_a_pipe_in_order(size):
    r, w = os.pipe()
    sent = [("rows", pickle.PickleBuffer(os.urandom(size)), size), ("finish", None), ("rows", b"z" * 4000)]
    got = []

    def reader():
        got.append(read_frame(r))
        got.append(read_frame(r))
        got.append(loads(read_raw(r)))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for msg in sent:
            send_frame(w, msg)
    finally:
        t.join(30)
        os.close(w)
        os.close(r)
    assert [_plain(m) for m in got] == [_plain(m) for m in sent]


@given(obj=_VALUES, cut=st.integers(min_value=1, max_value=64))
@settings(max_examples=100, deadline=None)
def test_a_short_or_long_frame_body_is_refused(obj, cut):
    body = _body(obj)
    for bad in (body[:-cut] if cut <= len(body) else b"", body + b"\0" * cut):
        with pytest.raises(ValueError):
            loads(bad)


@given(head=st.tuples(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=0, max_value=2**64 - 1)),
       rest=st.binary(max_size=64))
@settings(max_examples=200, deadline=None)
def test_a_hostile_header_is_refused_not_read_past(head, rest):
    """Any pickle length and buffer count over any bytes: a ValueError, or the unpickler's own
    refusal, unless the lengths add up to the body exactly (then the pickle is read, and never
    anything outside the body)."""
    body = struct.pack("<QQ", *head) + rest
    size, count = head
    try:
        loads(body)
    except ValueError:
        return
    except Exception:  # noqa: BLE001 - the unpickler's own refusal of bytes that are no pickle
        pass
    assert count <= len(rest) // 8 and 16 + 8 * count + size <= len(body)
    sizes = struct.unpack_from(f"<{count}Q", body, 16)
    assert 16 + 8 * count + size + sum(sizes) == len(body)
