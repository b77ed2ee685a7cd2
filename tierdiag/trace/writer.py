"""Writing a trace: JSONL (gzip when the name ends in .gz) through the one output writer
(`paths.open_output`: never an input, never through a link at a temporary name, replaced
atomically, a FIFO or device streamed into). `synth` and `convert` both write through here."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from pathlib import Path

from tierdiag.paths import open_output


def write_jsonl(path: str | os.PathLike, lines: Iterable[str], *, what: str = "OUT.jsonl",
                inputs: Iterable[tuple[str, str | os.PathLike]] = (), chunked: bool = False) -> None:
    """Write one line per item (each without its newline) to `path`, replacing it whole.
    `inputs`: (label, path) pairs the command reads, which `path` must not be (exit 2).

    By default every line is made before the output is opened, so a line that fails leaves the
    path untouched, a FIFO included. `chunked`: lines that cannot fail (synth's, generated
    already) are written ~1 MB at a time, never held whole: a million requests' lines were
    ~800 MB at once as a list, its join and its encoding (issue 41). The bytes are the same."""
    path = Path(path)
    if not chunked:
        body = "".join(line + "\n" for line in lines).encode("utf-8")
        lines = ()
    with open_output(path, what=what, inputs=inputs) as fh:
        if path.suffix == ".gz":
            # mtime=0 and no embedded name: the same requests give the same bytes.
            with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
                if chunked:
                    _write_chunks(gz, lines)
                else:
                    gz.write(body)
        elif chunked:
            _write_chunks(fh, lines)
        else:
            fh.write(body)


_CHUNK_CHARS = 1 << 20


def _write_chunks(fh, lines: Iterable[str]) -> None:
    part: list[str] = []
    size = 0
    for line in lines:
        part.append(line)
        part.append("\n")
        size += len(line) + 1
        if size >= _CHUNK_CHARS:
            fh.write("".join(part).encode("utf-8"))
            part, size = [], 0
    if part:
        fh.write("".join(part).encode("utf-8"))
