"""The line of an object inside a JSON document, for `file:line` errors in one-document formats.

Documents are parsed by the C scanner (fast); only when a record is bad is the text parsed
again by the pure-Python scanner with its object parser wrapped to remember where each object
starts, and the record found by its path (keys and indices from the top).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner


class _Located(dict):
    """A JSON object that knows the offset of its opening brace."""

    __slots__ = ("offset",)


def line_of(text: str, path: tuple) -> int:
    """1-based line where the object at `path` starts (the nearest object on the path if the
    path ends inside a list or at a value); 1 when the text cannot be walked that far."""
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, *args, **kwargs):
        start = s_and_end[1] - 1
        obj, end = json.decoder.JSONObject(s_and_end, *args, **kwargs)
        located = _Located(obj)
        located.offset = start
        return located, end

    decoder.parse_object = parse_object
    scan = json.scanner.py_make_scanner(decoder)
    start = len(text) - len(text.lstrip())
    try:
        node, _ = scan(text, start)
    except (StopIteration, ValueError, RecursionError):
        return 1
    offset = getattr(node, "offset", 0)
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
        offset = getattr(node, "offset", offset)
    return text.count("\n", 0, offset) + 1
