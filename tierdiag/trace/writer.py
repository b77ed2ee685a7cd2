"""Writing a trace: JSONL (gzip when the name ends in .gz), atomically, so a failed write leaves
no half file. `synth` and `convert` both write through here."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from pathlib import Path

from tierdiag.errors import OutputError
from tierdiag.paths import prepare_output_path


def write_jsonl(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Write one line per item (each without its newline) to `path`, replacing it whole."""
    path = Path(path)
    prepare_output_path(path, what="OUT.jsonl")
    tmp = path.with_name(f".{path.name}.tmp")
    body = "".join(line + "\n" for line in lines).encode("utf-8")
    try:
        if path.suffix == ".gz":
            # mtime=0 and no embedded name: the same requests give the same bytes.
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(body)
        else:
            tmp.write_bytes(body)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
