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
                inputs: Iterable[tuple[str, str | os.PathLike]] = ()) -> None:
    """Write one line per item (each without its newline) to `path`, replacing it whole.
    `inputs`: (label, path) pairs the command reads, which `path` must not be (exit 2)."""
    path = Path(path)
    body = "".join(line + "\n" for line in lines).encode("utf-8")
    with open_output(path, what=what, inputs=inputs) as fh:
        if path.suffix == ".gz":
            # mtime=0 and no embedded name: the same requests give the same bytes.
            with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
                gz.write(body)
        else:
            fh.write(body)
