"""The pipe between a replay's engine and its writer process: length-prefixed pickled frames,
read and written whole (store/writer_process.py is the engine's side, writer_serve.py the
writer's), and how an exception crosses the pipe (`portable`)."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct("<Q")


def send_frame(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data) if len(data) < 65536 else None
    if view is None:
        _write_all(fd, memoryview(_HEADER.pack(len(data))))
        view = memoryview(data)
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
    return EOF if body is None else pickle.loads(body)


def read_raw(fd: int) -> bytes | None:
    """One frame's pickled body, unpickled by the caller (the writer's reader thread hands it on
    as it is); None at the end of the pipe."""
    head = read_exact(fd, _HEADER.size)
    return None if head is None else read_exact(fd, _HEADER.unpack(head)[0])


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


