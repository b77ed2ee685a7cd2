"""Trace lines and converter records as typed models: each field declared once (type and bounds,
msgspec `Meta`), and one wording of what is wrong with a value.

msgspec (already tierdiag's JSON library, for the SGLang importer) checks a decoded object
against a `Struct` in C: booleans are not integers, a string is not a number, every element of
a list is checked, each bound is applied. Its error names the field (`... - at $.key[3]`); the
sentence the user reads is worded here from the field's declaration and the value actually
found, so the bounds live in one place and the messages stay tierdiag's
(`'think_ms' 1000... is too large (at most 4,611,686,018,427 ms)`). Values are compared as
Python numbers, so an integer of 400 digits is "too large", never an OverflowError.

`Meta(extra=...)` words a field: `unit` (after a bound; after the value too with `value_unit`), `number` (what a float field must be:
"a number", "a finite number of seconds"), `range` (the whole sentence for a value out of range,
after the value), `low` (the reason after a value below a lower bound that is not 0).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

import msgspec
from msgspec import inspect as mi

# msgspec's error messages, read back when a value is refused (`word`): compiled then, not at
# every replay's start (`_patterns`).
_AT = r" - at `\$((?:\.[^.\[`]+|\[\d+\])*)`$"
_MISSING = r"^Object missing required field `([^`]+)`"
_STEP = r"\.([^.\[]+)|\[(\d+)\]"


@lru_cache(maxsize=None)
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    return re.compile(_AT), re.compile(_MISSING), re.compile(_STEP)


class FieldError(ValueError):
    """A value that does not fit its field's declaration; the message is one line."""


def convert(obj: dict, model: type, *, style: str = "trace", null_is_missing: bool = False):
    """`obj` (a decoded JSON object) as a `model` instance, or FieldError worded from the model's
    declaration. `style` words integers out of range: "trace" (`is negative`, `is too large`)
    or "record" (`is V, expected LO to HI`). `null_is_missing`: a required field given as null
    reads as missing (the converters' sources write null for "none")."""
    try:
        return msgspec.convert(obj, model, strict=True)
    except msgspec.ValidationError as exc:
        raise FieldError(word(str(exc), obj, model, style=style, null_is_missing=null_is_missing)) from None
    except UnicodeEncodeError:
        # A string holding a lone surrogate (JSON's "\ud800", which json.loads takes) where a
        # number belongs: msgspec fails to encode it while wording its error. The same check on
        # a copy whose strings are made encodable finds the field; the words use the original.
        try:
            msgspec.convert(_encodable(obj), model, strict=True)
        except msgspec.ValidationError as exc:
            raise FieldError(word(str(exc), obj, model, style=style, null_is_missing=null_is_missing)) from None
        raise FieldError("a value holds text that is not valid Unicode (a lone surrogate)") from None


def _encodable(value):
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    return value


def word(message: str, obj: dict, model: type, *, style: str = "trace", null_is_missing: bool = False) -> str:
    """The sentence for msgspec's `message` about `obj`, worded from `model`'s declaration."""
    at_re, missing_re, step_re = _patterns()
    missing = missing_re.match(message)
    if missing:
        return f"missing field '{missing.group(1)}'"
    at = at_re.search(message)
    steps = [(m.group(1), m.group(2)) for m in step_re.finditer(at.group(1))] if at else []
    if not steps or steps[0][0] is None:
        return message  # not about one field: msgspec's own words (cannot happen for a dict)
    key = steps[0][0]
    info = _fields(model).get(key)
    value = obj.get(key)
    if info is None:
        return f"'{key}': {message}"
    if value is None and null_is_missing and info[1]:
        return f"missing field '{key}'"
    index = int(steps[1][1]) if len(steps) > 1 and steps[1][1] is not None else None
    return _word_value(key, value, info[0], info[2], index, style)


@lru_cache(maxsize=64)
def _fields(model: type) -> dict[str, tuple[Any, bool, dict]]:
    """JSON name -> (the field's type less None/UNSET, required, its Meta extra)."""
    out = {}
    for f in mi.type_info(model).fields:
        t, extra = _plain(f.type)
        out[f.encode_name] = (t, f.required, extra)
    return out


def _plain(t) -> tuple[Any, dict]:
    extra: dict = {}
    while True:
        if isinstance(t, mi.Metadata):
            extra = {**(t.extra or {}), **extra}
            t = t.type
        elif isinstance(t, mi.UnionType):
            rest = [u for u in t.types if not isinstance(u, mi.NoneType)]  # UNSET is no member here
            if len(rest) != 1:
                return t, extra
            t = rest[0]
        else:
            return t, extra


def _word_value(key: str, value: object, t, extra: dict, index: int | None, style: str) -> str:
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        item, _ = _plain(t.item_type)
        if not isinstance(item, mi.IntType):
            return f"'{key}' must be a list, got {json_type(value)}"
        if not isinstance(value, list):
            return f"'{key}' must be a list of integers, got {json_type(value)}"
        bad = value[index] if index is not None and index < len(value) else None
        if not _is_int(bad):
            return f"'{key}' must hold only integers, found {json_type(bad)} {show(bad)}"
        if item.ge is not None and bad < item.ge:
            return f"'{key}' holds a negative value ({show(bad)})" if item.ge == 0 else \
                f"'{key}' holds {show(bad)}, smaller than the minimum {item.ge}"
        return f"'{key}' holds {show(bad)}, larger than the maximum {item.le}"
    if isinstance(t, mi.IntType):
        if not _is_int(value):
            return f"'{key}' must be an integer, got {json_type(value)} {show(value)}"
        return _out_of_range(key, value, t.ge, t.le, extra, style)
    if isinstance(t, mi.FloatType):
        words = extra.get("number", "a number")
        if not _is_number(value):
            return f"'{key}' must be {words}, got {json_type(value)} {show(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"'{key}' must be {'a finite number' if words == 'a number' else words}, got {value}"
        return _out_of_range(key, value, t.ge, t.le, extra, "trace")
    if isinstance(t, mi.LiteralType):
        return f"'{key}' is {show(value)}, expected one of {', '.join(map(str, t.values))}"
    if isinstance(t, mi.StrType):
        if not isinstance(value, str):
            return f"'{key}' must be a string, got {json_type(value)} {show(value)}"
        if t.max_length is not None and len(value) > t.max_length:
            return f"'{key}' is {len(value):,} characters long (at most {t.max_length})"
        return f"'{key}' is too short"
    return f"'{key}' has an unexpected value {show(value)}"


def _out_of_range(key: str, value, ge, le, extra: dict, style: str) -> str:
    unit = extra.get("unit", "")
    if "range" in extra:
        return f"'{key}' {show(value)} {extra['range']}"
    if style == "record" and isinstance(value, int):
        return f"'{key}' is {show(value)}, expected {ge:,} to {le:,}"
    if ge is not None and value < ge:
        if value < 0 <= ge:
            return f"'{key}' is negative ({show(value)})"
        low = extra.get("low")
        return f"'{key}' is {show(value)}" + (f" ({low})" if low else f", at least {ge:,}{unit}")
    limit = f"{int(le):,}" if le == int(le) else f"{le:g}"
    after = unit if extra.get("value_unit") else ""
    return f"'{key}' {show(value)}{after} is too large (at most {limit}{unit})"


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; JSON true is not a count


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def show(value: object, limit: int = 40) -> str:
    """A short one-line rendering of a value for an error message (a huge integer cut, never
    converted to a float)."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):  # an integer past Python's digit limit for str()
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
