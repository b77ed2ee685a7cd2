"""Data as text for a person: the one escaping helper every view and error line goes through.

No Rich here (an error line, `report` and the HTML pages use it without loading Rich). Data (a
run name, a request id, a path, a server's backend name) is never markup and never reaches a
terminal raw: `visible` shows control characters escaped, the Rich views wrap it in a `Text`
(`report.terminal.plain`), and their console never parses markup at all.
"""

from __future__ import annotations

import re
from typing import Any

from tierdiag.units import fmt_tokens

# C0 and C1 controls (ESC starts ANSI/OSC sequences, BEL ends OSC ones), DEL, and the invisible
# Unicode format characters that reorder or hide text (bidi overrides, zero-width); lone
# surrogates are the bytes of a command-line argument or file name that were not UTF-8.
# Compiled where first used (`_controls`): each is a class of ~4,000 code points, ~1 ms to compile,
# and a replay's start imports this module for `as_text` alone (issue 41).
_CONTROL = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
_CONTROL_ANY = "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
_COMPILED: dict[bool, re.Pattern] = {}


def _controls(lines: bool) -> re.Pattern:
    pattern = _COMPILED.get(lines)
    if pattern is None:
        pattern = _COMPILED[lines] = re.compile(_CONTROL if lines else _CONTROL_ANY)
    return pattern


def _escape(m: re.Match) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # Python's stand-in for the undecodable byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, *, lines: bool = True) -> str:
    """`text` with every control character shown escaped (ESC as `\\x1b`, an undecodable byte
    as `\\xff`), so that data (a run name, a request id, a path) can never move the cursor,
    clear the screen or set a window title. Newlines and tabs stay unless `lines=False` (a
    table cell, a title: one line)."""
    return _controls(lines).sub(_escape, str(text))


# An error line quotes what the user gave (an option's value, a request id, a path); a hostile
# one (a 3,000-character name, a file pasted into an option) would make it a screenful. Each run
# of non-blank characters past WORD_MAX is shown by its ends, and a line still past LINE_MAX by
# its first and last characters: the option's name and the reason stay readable.
WORD_MAX = 160
LINE_MAX = 600
_LONG_WORD = re.compile(r"\S{%d,}" % (WORD_MAX + 1))


def _cut(text: str, head: int, tail: int) -> str:
    return f"{text[:head]}...[{len(text) - head - tail:,} characters]...{text[-tail:]}"


def abbreviated(line: str) -> str:
    """`line` with every run of non-blank characters longer than WORD_MAX shown by its first
    100 and last 40 characters (how many were left out between), then, if it is still longer
    than LINE_MAX, by its first 400 and last 160 characters; a line within both is unchanged."""
    line = _LONG_WORD.sub(lambda m: _cut(m[0], 100, 40), line)
    return _cut(line, 400, 160) if len(line) > LINE_MAX else line


def as_text(value: str) -> str:
    """A command-line string as text that can be stored and printed: bytes that were not UTF-8
    (Python hands them over as lone surrogates) written as `\\xff`; anything else unchanged."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def fmt_option(value: Any) -> str:
    """An option value as a person reads it: token counts with separators, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return fmt_tokens(value)
    return str(value)
