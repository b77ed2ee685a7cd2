"""The pipe between a replay's engine and its writer process: length-prefixed pickled frames (the
row frames' int columns out of band), read and written whole (store/writer_process.py is the
engine's side, writer_serve.py the writer's), and how an exception crosses the pipe (`portable`)."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

from tierdiag.native import cplane

_HEADER = struct.Struct("<Q")


# A frame: its length (8 bytes), then the body: the pickle's length and the number of
# out-of-band buffers (8 bytes each), each buffer's length (8 bytes each), the pickle
# (protocol 5), the buffers' bytes. A PickleBuffer in the object (WriterProcess.append_rows
# wraps the columnar hand-overs' int blocks in one) travels out of band: written to the pipe
# from its own memory, never copied into the pickle, and read back as a slice of the frame's
# bytes (`loads`), so a row frame's encode copies no int column (issue 41, session 28).
_COUNT = struct.Struct("<QQ")


def encode(obj: Any) -> list:
    """The frame of `obj` as the pieces written one after the other: its header, its pickle,
    then each out-of-band buffer as it is (a memoryview of its own memory)."""
    buffers: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(b.raw()) for b in buffers]
    sizes = [v.nbytes for v in views]
    head = _COUNT.size + 8 * len(sizes) + len(data) + sum(sizes)
    prefix = _HEADER.pack(head) + _COUNT.pack(len(data), len(sizes)) + struct.pack(f"<{len(sizes)}Q", *sizes)
    return [prefix, data, *views]


def loads(body) -> Any:
    """A frame's body (read_raw's) unpickled, its out-of-band buffers slices of it (no copy)."""
    view = memoryview(body)
    if view.nbytes < _COUNT.size:
        raise ValueError(f"a frame of {view.nbytes} bytes: no header")
    size, count = _COUNT.unpack_from(view, 0)
    at = _COUNT.size + 8 * count
    if count > view.nbytes or at > view.nbytes:
        raise ValueError(f"a frame of {view.nbytes} bytes says {count} buffers")
    sizes = struct.unpack_from(f"<{count}Q", view, _COUNT.size)
    if at + size + sum(sizes) != view.nbytes:
        raise ValueError(f"a frame of {view.nbytes} bytes says {size} bytes of pickle and {sum(sizes)} of buffers")
    buffers = []
    start = at + size
    for n in sizes:
        buffers.append(view[start:start + n])
        start += n
    return pickle.loads(view[at:at + size], buffers=buffers)


# A columnar hand-over's object column of text sent as an Arrow string array's buffers (`TEXT`,
# int32 offsets, UTF-8 data, validity bitmap or None, nulls), made by the compiled data plane's
# `text_column` (None on the numpy data plane: the lists go as they are)
TEXT = "text"
_text_column = cplane.compiled("text_column")


def out_of_band(tables: dict) -> dict:
    """A rows hand-over ({table: (fields, rows)}, Recorder's rows sink) with each columnar
    buffer's int block (engine/emitters.py's Columns.take(): "ints") wrapped to travel out of
    band (a PickleBuffer over the same bytes), and each of its object columns whose values are
    all str or None (the request ids: ~100k values a conversation replay) as a `TEXT` tuple of
    Arrow buffers, its offsets and UTF-8 data out of band too: no per-row object pickled here,
    unpickled and converted by pa.array in the writer (store/columns.py's `_columnar` builds the
    array on the buffers; probes/recorder.py's `text_values` reads the values back). Any other
    column, or any column on the numpy data plane, stays the list; the other rows as they are."""
    out = {}
    for table, (fields, rows) in tables.items():
        if isinstance(rows, dict) and isinstance(rows.get("ints"), tuple):
            names, block = rows["ints"]
            if isinstance(block, (bytes, memoryview)):  # (Columns.take(): a view of its block)
                rows = {**rows, "ints": (names, pickle.PickleBuffer(block))}
            objects = rows.get("objects")
            if _text_column is not None and isinstance(objects, dict):
                sent = {}
                for name, values in objects.items():
                    text = _text_column(values) if type(values) is list else None
                    if text is None:
                        sent[name] = values
                    else:
                        offsets, data, valid, nulls = text
                        sent[name] = (TEXT, pickle.PickleBuffer(offsets), pickle.PickleBuffer(data), valid, nulls)
                rows = {**rows, "objects": sent}
        out[table] = (fields, rows)
    return out


def send_frame(fd: int, obj: Any) -> None:
    prefix, data, *views = encode(obj)
    if len(data) < 65536:  # one write; a longer pickle is written from its own bytes (no copy)
        _write_all(fd, memoryview(prefix + data))
    else:
        _write_all(fd, memoryview(prefix))
        _write_all(fd, memoryview(data))
    for view in views:
        _write_all(fd, view)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int) -> bytes | None:
    """n bytes, or None at end of file (the other side is gone)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return bytes(buf) if n < 65536 else buf


def read_frame(fd: int):
    """The next object, or EOF (None would be ambiguous: the protocol never sends it)."""
    head = read_exact(fd, _HEADER.size)
    if head is None:
        return EOF
    body = read_exact(fd, _HEADER.unpack(head)[0])
    return EOF if body is None else loads(body)


def read_raw(fd: int) -> bytes | None:
    """One frame's body, unpickled by the caller (`loads`: the writer's reader thread hands it on
    as it is); None at the end of the pipe."""
    head = read_exact(fd, _HEADER.size)
    return None if head is None else read_exact(fd, _HEADER.unpack(head)[0])


# The engine's "stop now" (`send_stop`): a frame of no body, which no pickle is. The writer's reader
# thread acts on it itself (writer_serve.py `_read_requests`), not its busy main thread: a second
# SIGINT/SIGTERM once an interrupted run's status is committed (issue 41, session 37 h47sig).
STOP = b""


def send_stop(fd: int) -> None:
    """Send STOP on `fd`."""
    _write_all(fd, memoryview(_HEADER.pack(0)))


class _Eof:
    def __repr__(self) -> str:
        return "EOF"


EOF = _Eof()


def portable(exc: BaseException) -> BaseException:
    """`exc` if it pickles and reads back, else a RuntimeError saying what it was (DuckDB's own
    exceptions do not travel); with the writer's traceback as a note, for --debug."""
    import traceback

    tb = "".join(traceback.format_exception(exc)).rstrip()
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - whatever does not travel becomes a RuntimeError below
        text = str(exc).strip()
        back = RuntimeError(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
    if not isinstance(back, BaseException):
        back = RuntimeError(f"{type(exc).__name__}: {exc}")
    back.add_note(f"in the store's writer process:\n{tb}")
    return back


