"""The one validated boundary for what configures a replay: config keys (EngineConfig), `--set`
values, replay options and profiles are checked against typed declarations, one per field,
by msgspec (`msgspec.convert(..., strict=True)`): a bool is not a number, a string is not a
number, NaN fails every bound, a float field refuses inf because every number has a finite
upper bound, and an integer past its bound (10**400 included) is refused without converting it.

A field is declared as `Int(lo, hi)`, `Float(lo, hi)`, `Choice(names)`, `Text()` or `Flag()`
(an `Annotated` type whose `Bounds` carries the bounds, and in `extra` the option that sets it
and the words of its error; a schema's msgspec Struct, with each Bounds as a `msgspec.Meta`, is
made when a value is first checked, so that importing a declaration imports no msgspec: the
read commands import the router's defaults, never check a value, and msgspec was ~20 ms of
their start-up). msgspec decides whether a value is valid and which key is
wrong; the message is written from the declaration, so it is the same wherever the value came
from, only the name changes: `--page-size` on the command line, `page_size` in a `--config`
file (`--config FILE: page_size ...`, exit 3), `--set page_size=...` in a sweep.

Errors that involve several keys (a block size that is not a multiple of the page size) are
`KeyedConfigError`s: they list the keys and render their message with whatever each key is
called where it came from, so `load_config` can say which file or option is to blame without
reading its own messages back.
"""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping

from tierdiag.errors import ConfigError, ConfigFileError, ExitCode

INT64_MAX = 2**63 - 1

# --- declarations ---------------------------------------------------------------------------


def _extra(option: str | None, cli: bool, what: str | None, noun: str | None) -> dict[str, Any]:
    return {"option": option, "cli": cli, "what": what, "noun": noun}


@dataclass(frozen=True)
class Bounds:
    """A declaration's bounds and words: msgspec.Meta's fields of the same names, made a Meta
    (`meta()`) when its schema's Struct is."""

    gt: float | int | None = None
    ge: float | int | None = None
    le: float | int | None = None
    extra: dict | None = None

    def __hash__(self) -> int:  # `extra` is a dict: hashed by what it says
        return hash((self.gt, self.ge, self.le, tuple(sorted((self.extra or {}).items()))))

    def meta(self):
        from msgspec import Meta

        return Meta(**{k: v for k, v in (("gt", self.gt), ("ge", self.ge), ("le", self.le)) if v is not None},
                    extra=self.extra)


def _with_meta(hint: Any) -> Any:
    """`hint` with every Bounds in it (Annotated, inside a Union or not) made a msgspec.Meta."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *metadata = typing.get_args(hint)
        return Annotated[(_with_meta(base), *(m.meta() if isinstance(m, Bounds) else m for m in metadata))]
    if origin is typing.Union or isinstance(hint, types.UnionType):
        return typing.Union[tuple(_with_meta(a) for a in typing.get_args(hint))]
    return hint


def Int(lo: int = 0, hi: int = INT64_MAX, *, option: str | None = None, cli: bool = True,
        what: str | None = None) -> Any:
    """An integer from `lo` to `hi` (every integer is int64 at most: DuckDB BIGINT, numpy)."""
    return Annotated[int, Bounds(ge=lo, le=hi, extra=_extra(option, cli, what, None))]


def Float(lo: float, hi: float, *, lo_open: bool = False, option: str | None = None, cli: bool = True,
          what: str | None = None) -> Any:
    """A finite number in [lo, hi] ((lo, hi] with lo_open); an integer is taken as a number.
    `what`: its noun, without an article ("time in ns")."""
    bound = {"gt": lo} if lo_open else {"ge": lo}
    return Annotated[float, Bounds(le=hi, extra=_extra(option, cli, what, None), **bound)]


def Choice(names: Iterable[str], *, option: str | None = None, cli: bool = True, noun: str | None = None) -> Any:
    """One of `names` (a registry's keys, read when the declaring class is made)."""
    return Annotated[Literal[tuple(names)], Bounds(extra=_extra(option, cli, None, noun))]


def Text(*, option: str | None = None, cli: bool = True) -> Any:
    return Annotated[str, Bounds(extra=_extra(option, cli, None, None))]


def Flag(*, option: str | None = None, cli: bool = True) -> Any:
    return Annotated[bool, Bounds(extra=_extra(option, cli, None, None))]


@dataclass(frozen=True)
class FieldSpec:
    """One declared field, read back from its annotation."""

    key: str
    kind: type  # int, float, str, bool
    optional: bool  # None allowed (unset)
    choices: tuple[str, ...] | None = None
    lo: float | int | None = None
    hi: float | int | None = None
    lo_open: bool = False
    option: str | None = None  # its command-line option; None: a config key only
    what: str | None = None  # words for the kind of value ("a power of two")
    noun: str | None = None  # "preset": "unknown --model preset 'x'"

    @classmethod
    def of(cls, key: str, hint: Any) -> "FieldSpec":
        optional = False
        if typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional, hint = True, args[0]
        meta = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Bounds)), Bounds())
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        extra = meta.extra or {}
        option = extra.get("option") or ("--" + key.replace("_", "-"))
        common = dict(key=key, optional=optional, option=option if extra.get("cli", True) else None,
                      what=extra.get("what"), noun=extra.get("noun"))
        if typing.get_origin(base) is Literal:
            return cls(kind=str, choices=tuple(typing.get_args(base)), **common)
        lo = meta.gt if meta.gt is not None else meta.ge
        return cls(kind=base, lo=lo, hi=meta.le, lo_open=meta.gt is not None, **common)

    # -- words -------------------------------------------------------------------------------
    def expected(self) -> str:
        """What a valid value is, in words (the docs' table says the same)."""
        if self.choices is not None:
            return "one of " + ", ".join(sorted(self.choices))
        if self.kind is bool:
            return "true or false"
        if self.kind is str:
            return "a string"
        if self.kind is int:
            top = "2^63 - 1" if self.hi == INT64_MAX else f"{self.hi:,}"
            return f"an integer from {self.lo:,} to {top}" + (f", {self.what}" if self.what else "")
        return f"a {self.what or 'number'} in {self.interval()}"

    def interval(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"

    def problem(self, name: str, value: Any) -> str:
        """Why `value` is not valid here, `name` being what the key is called where it was
        written (`--page-size`, `page_size`)."""
        shown = show(value)
        if self.choices is not None and isinstance(value, str):
            noun = f" {self.noun}" if self.noun else ""
            return f"unknown {name}{noun} {shown}; known: {', '.join(sorted(self.choices))}"
        if not _right_type(self, value):
            return f"{name} {shown} must be {self.expected()} (not a {_type_word(value)})"
        if self.kind is int:
            if self.hi == INT64_MAX and value > self.hi:
                return f"{name} {shown} is out of range (at most {INT64_MAX:,})"
            if self.hi == INT64_MAX and self.what is None:
                return f"{name} {shown} must be at least {self.lo:,}"
            return f"{name} {shown} must be {self.expected()}"
        if not _finite(value):
            return f"{name} {shown} must be a finite {self.what or 'number'} in {self.interval()}"
        return f"{name} {shown} must be {'a ' + self.what + ' ' if self.what else ''}in {self.interval()}"


def _right_type(spec: FieldSpec, value: Any) -> bool:
    if isinstance(value, bool):
        return spec.kind is bool
    if spec.kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, spec.kind)


def _finite(value: int | float) -> bool:
    """False for NaN, the infinities and an integer past every float (10**400)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _type_word(value: Any) -> str:
    return {bool: "boolean", int: "whole number", float: "fraction", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__)


def show(value: Any, limit: int = 60) -> str:
    """A value as an error shows it: short, whatever it is (a 400-digit integer, a long list)."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 128:  # str() of a huge int is slow, past 4,300 digits an error
            return f"{'-' if value < 0 else ''}(an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits)"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = repr(value[:limit] + ("..." if len(value) > limit else ""))
        return text
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlevel, r.maxlist, r.maxdict = 30, 30, 2, 4, 4
    r.repr_int = lambda x, level: show(x)  # type: ignore[method-assign]
    return r.repr(value)[:limit * 2]


# --- schemas --------------------------------------------------------------------------------

_PATH = re.compile(r"at `\$((?:\.[A-Za-z0-9_]+|\[[0-9]+\])+)`")


class Schema:
    """The declared fields of a class (its type hints, Annotated as above) and a msgspec Struct
    that checks a mapping of some or all of them in one call."""

    def __init__(self, name: str, hints: Mapping[str, Any], defaults: Mapping[str, Any] | None = None,
                 *, strict_keys: bool = True):
        self.fields = {k: FieldSpec.of(k, h) for k, h in hints.items()}
        self._name, self._hints, self._defaults, self._strict_keys = name, dict(hints), dict(defaults or {}), strict_keys
        self._struct = None

    @property
    def struct(self) -> Any:
        """The msgspec Struct that checks the fields, made on first use (msgspec imported then)."""
        if self._struct is None:
            import msgspec

            spec = [(k, _with_meta(h), self._defaults[k]) if k in self._defaults else (k, _with_meta(h))
                    for k, h in self._hints.items()]
            spec.sort(key=lambda s: len(s) == 3)  # required fields first
            self._struct = msgspec.defstruct(self._name, spec, kw_only=True, forbid_unknown_fields=self._strict_keys)
        return self._struct

    @classmethod
    def of_class(cls, klass: type, *, strict_keys: bool = True) -> "Schema":
        import dataclasses

        hints = typing.get_type_hints(klass, include_extras=True)
        if dataclasses.is_dataclass(klass):
            names = [f.name for f in dataclasses.fields(klass)]
            defaults = {f.name: f.default for f in dataclasses.fields(klass)
                        if f.default is not dataclasses.MISSING}
        else:
            names, defaults = list(hints), {}
        return cls(klass.__name__ + "Checked", {n: hints[n] for n in names}, defaults, strict_keys=strict_keys)

    def first_error(self, values: Mapping[str, Any]) -> tuple[str, Any] | None:
        """(key, value) of the first invalid value of `values` (its own keys only), or None."""
        import msgspec

        struct = self.struct
        try:
            msgspec.convert(dict(values), struct, strict=True)
        except msgspec.ValidationError as exc:
            m = _PATH.search(str(exc))
            if m is None:
                raise  # an unknown key: the callers list the known ones before this
            key = m.group(1).split(".")[1].split("[")[0]
            return key, values[key]
        return None

    def convert(self, values: Mapping[str, Any]) -> Any:
        import msgspec

        return msgspec.convert(dict(values), self.struct, strict=True)


# --- errors that know their keys -------------------------------------------------------------

Namer = Callable[[str], str]


class KeyedConfigError(ConfigError):
    """A bad value of the config keys `keys`. `render(name)` writes the message (and `hint`
    the hint) with `name(key)` for each key: how the key is called where it came from."""

    def __init__(self, keys: Iterable[str], render: Callable[[Namer], str],
                 hint: Callable[[Namer], str | None] | str | None = None, *, name: Namer | None = None,
                 file_error: bool = False):
        self.keys = tuple(keys)
        self.render = render
        self.render_hint = hint
        # A bad file named by the keys (a profile's own content): bad input wherever it was named.
        self.file_error = file_error
        if file_error:
            self.exit_code = ExitCode.BAD_INPUT
        name = name or option_name
        super().__init__(render(name), hint=self._hint(name))

    def _hint(self, name: Namer) -> str | None:
        return self.render_hint(name) if callable(self.render_hint) else self.render_hint

    def renamed(self, name: Namer, *, prefix: str = "", file: bool = False) -> ConfigError:
        """The same error with the keys named by `name`: a ConfigFileError (exit 3) when `file`."""
        kind = ConfigFileError if file or self.file_error else ConfigError
        return kind(prefix + self.render(name), hint=self._hint(name))


_OPTIONS: dict[str, str | None] = {}  # key -> its option (None: a config key only), per registered schema


def register_options(schema: Schema) -> None:
    _OPTIONS.update({k: f.option for k, f in schema.fields.items()})


def option_name(key: str) -> str:
    """How the command line calls `key`: its option, else the config key itself."""
    return _OPTIONS.get(key) or key


def key_name(key: str) -> str:
    return key


def check_values(schema: Schema, values: Mapping[str, Any], name: Namer = option_name) -> None:
    """Raise a KeyedConfigError for the first invalid value of `values`, named by `name`."""
    bad = schema.first_error(values)
    if bad is not None:
        key, value = bad
        spec = schema.fields[key]
        raise KeyedConfigError((key,), lambda n: spec.problem(n(key), value), name=name)


def markdown_table(schema: Schema, *, default: Mapping[str, Any] | None = None, prefix: str = "",
                   options: bool = True) -> list[str]:
    """The declared fields as a Markdown table (docs/contract.md holds it; a test keeps it equal).
    A preset name is said as such: the registries grow (config/presets.py), the table need not."""
    head = ["key", "option", "type and range", "default"] if options else ["key", "type and range"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, f in schema.fields.items():
        expected = f"a {key} preset's name" if f.noun == "preset" else f.expected()
        cells = [f"`{prefix}{key}`", expected + (" or unset" if f.optional else "")]
        if options:
            value = (default or {}).get(key)
            cells[1:1] = ["`" + f.option + "`" if f.option else "(config key only)"]
            cells.append("unset" if value is None else f"`{value!r}`".replace("'", '"'))
        rows.append("| " + " | ".join(cells) + " |")
    return rows
