"""The one way tests write a trace: lines as JSON text or as dicts, one a line, Mooncake's
format by default (`line`), and a handful of valid lines every request of which shares block 0
(`good_lines`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping, Union

Line = Union[str, Mapping]


def line(ts: int, input_length: int, hash_ids: list[int], *, output_length: int = 8, **extra) -> str:
    """One Mooncake-format request (ours: any extra key, e.g. id, session, think_ms)."""
    return json.dumps({"timestamp": ts, "input_length": input_length, "output_length": output_length,
                       "hash_ids": hash_ids, **extra})


def good_lines(n: int, *, start_ts: int = 0) -> list[str]:
    """n valid Mooncake lines: every request shares block 0, then has its own block."""
    return [line(start_ts + 100 * i, 1000, [0, 1000 + i]) for i in range(n)]


def write_trace(path: Path, lines: Iterable[Line]) -> Path:
    """`lines` (JSON text, taken as it is, or dicts, dumped) into `path`, one a line."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path
