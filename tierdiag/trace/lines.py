"""Lines of an input file, and what a bad one does: one definition for every reader of lines
(the trace reader, `convert`'s readers, the SGLang export importer).

- `numbered_lines`: (1-based line number, raw bytes), gzip told by its magic bytes, read once
  front to back so pipes work; a pipe's digest is taken on the way (`report.sha256`).
- `BadLine`: a problem confined to one line; `skip_bad_line` turns it into the one-line
  `file:line: message` error (exit 3) or, under --skip-bad, counts it and says whether it is one
  of the first few a report keeps.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tierdiag.errors import TraceError

SKIP_HINT = "fix the line, or pass --skip-bad to skip bad lines"
FIRST_BAD_KEPT = 5  # a report keeps this many bad lines' messages
_GZIP_MAGIC = b"\x1f\x8b"


class BadLine(Exception):
    """A problem confined to one line: fatal, or skipped under --skip-bad."""


def skip_bad_line(path, lineno: int, exc: BadLine, skip_bad: bool, count: int) -> bool:
    """Raise the line's one-line error unless `skip_bad`; else True when this bad line (the
    `count`-th) is one the report keeps."""
    if not skip_bad:
        raise TraceError(f"{path}:{lineno}: {exc}", hint=SKIP_HINT) from None
    return count <= FIRST_BAD_KEPT


def is_seekable_file(path: str | os.PathLike) -> bool:
    """A regular file can be read more than once; a pipe (`/dev/stdin`, a FIFO) cannot."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def open_raw(path: Path, what: str = "trace") -> BinaryIO:
    """The file opened for reading; what cannot be opened is a TraceError naming it as `what`,
    a device that never ends a ConfigError (paths.refuse_endless_input)."""
    from tierdiag.paths import refuse_endless_input

    refuse_endless_input(path, what=f"{what} file")
    try:
        return open(path, "rb", buffering=1 << 20)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a {what} file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot open {what}: {exc.strerror or exc}") from None


class _Hashing(io.RawIOBase):
    """A raw stream that hashes what is read through it (a pipe is read once: the digest of a
    trace given as /dev/stdin is taken on the way)."""

    def __init__(self, raw: BinaryIO, digest):
        self._raw, self._digest = raw, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def numbered_lines(path: Path, report=None, *, what: str = "trace") -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) for each line; gzip by magic bytes. Read once, front to
    back, so pipes work; a pipe's digest goes to `report.sha256` at the end."""
    raw = open_raw(path, what)
    digest = None
    if report is not None and not is_seekable_file(path):
        import hashlib  # here: a file's lines need neither OpenSSL nor gzip (issue 41's start-up)

        digest = hashlib.sha256()
        raw = io.BufferedReader(_Hashing(raw, digest))
    elif not isinstance(raw, io.BufferedReader):
        raw = io.BufferedReader(raw)
    lineno = 0
    try:
        is_gzip = raw.peek(2)[:2] == _GZIP_MAGIC
        fh: BinaryIO = raw
        errors: tuple[type[BaseException], ...] = (OSError, EOFError)
        if is_gzip:
            import gzip
            import zlib

            fh = gzip.GzipFile(fileobj=raw, mode="rb")
            errors += (zlib.error,)
        try:
            for lineno, data in enumerate(fh, start=1):
                yield lineno, data
            if digest is not None:
                report.sha256 = digest.hexdigest()
        except errors as exc:
            # gzip.BadGzipFile is an OSError; a truncated member is EOFError.
            what = "corrupt or truncated gzip data" if is_gzip else f"read error: {exc}"
            raise TraceError(f"{path}:{lineno + 1}: {what}") from None
    finally:
        raw.close()
