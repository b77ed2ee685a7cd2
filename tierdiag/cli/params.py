"""What every command's parameters go through, declared once: checks at the edge, and plain
coercion instead of Typer's pydantic.

- Every integer fits int64 (what DuckDB and the engine hold): a larger one is an option value
  out of range (exit 2) naming the option, never a crash later.
- Text from the command line is text: bytes that were not UTF-8 (`--run-name $'\\xff'`) are
  taken written as `\\xff` (report.text.as_text), so they can be stored and printed. A file or
  folder name must stay the exact bytes that name it, and tierdiag records names as text (the
  store, the views, the HTML page): one that is not UTF-8 is refused (exit 2) before any file
  is opened or made.
- Typer 0.29 turns every parameter value into its annotated type through a pydantic TypeAdapter,
  and importing pydantic for that (and its plugin scan) was a third of `explain`'s import time
  (0.15 s of every `replay`). A str, bool, int, float or Path parameter needs none of it: click
  has the text already; numbers are read here as pydantic's lax mode reads them ('1_000',
  ' 12 ', '12.0' for an int; 'inf' for a float, which the config's own range checks refuse);
  a Path keeps Typer's own path checks. Lists, enums and custom parsers keep Typer's coercion,
  and so does everything where this Typer's internals differ.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from tierdiag.errors import ConfigError

_INT64_MAX = 2**63 - 1
_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's NAME_MAX (bytes a file or folder name) and PATH_MAX (a path, with its NUL)
_PLAIN = (str, bool, int, float)


def _flag(name: str) -> str:
    """Parameter `name` (Typer passes values by name) as --help shows it: its flag, or an
    argument's metavar."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name:
            return param.opts[0] if param.param_type_name == "option" else (param.metavar or name.upper())
    return "--" + name.rstrip("_").replace("_", "-")


def _checked_value(name: str, value):
    if type(value) is int and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ConfigError(f"{_flag(name)} {value} is out of range (at most {_INT64_MAX:,})")
    if isinstance(value, str):
        from tierdiag.report.text import as_text

        return as_text(value)
    if isinstance(value, Path):
        from tierdiag.report.text import as_text, visible

        text = str(value)
        if as_text(text) != text:
            shown = visible(as_text(text), lines=False)
            if as_text(text) == os.fsencode(text).decode("utf-8", "replace"):  # UTF-8 after all: this
                # locale's file names are ASCII (LC_ALL=C PYTHONUTF8=0) and cannot name it
                raise ConfigError(f"{_flag(name)} '{shown}' cannot be named under this locale's ASCII file names",
                                  hint="run under a UTF-8 locale (LC_ALL=C.UTF-8)")
            raise ConfigError(f"{_flag(name)} '{shown}' is not a UTF-8 file name",
                              hint="tierdiag records file names as text; rename it, or link to it under a UTF-8 name")
        # A name no file system takes (ENAMETOOLONG): refused here, where any stat of it (an
        # exists() in the store's open) raised an OSError, exit 1 (h41safe's hostile sweep)
        encoded = os.fsencode(text)
        if len(encoded) >= _PATH_MAX or max(map(len, encoded.split(b"/"))) > _NAME_MAX:
            from tierdiag.report.text import visible

            raise ConfigError(f"{_flag(name)} '{visible(text[:40], lines=False)}...' is too long a file name "
                              f"({len(encoded):,} bytes; at most {_NAME_MAX} a name, {_PATH_MAX - 1:,} a path)")
    if isinstance(value, (list, tuple)):
        return type(value)(_checked_value(name, v) for v in value)
    return value


def checked(fn):
    """`fn` (a command), its arguments checked as the module docstring says first."""
    @functools.wraps(fn)
    def command(**kwargs):
        return fn(**{name: _checked_value(name, value) for name, value in kwargs.items()})

    return command


def _parse_number(text: str, kind: type, param, ctx):
    from decimal import Decimal, InvalidOperation

    try:
        if kind is float:
            return float(text)
        try:
            return int(text)
        except ValueError:
            d = Decimal(text.strip().replace("_", ""))
            if d.is_finite() and d == d.to_integral_value() and "e" not in text.lower():
                return int(d)
    except (ValueError, InvalidOperation):
        pass
    from typer._click.exceptions import BadParameter

    raise BadParameter(f"{text!r} is not {'an integer' if kind is int else 'a number'}", ctx=ctx, param=param)


class _PlainCoercion:
    """A str/bool/int/float/Path parameter's coercion, in place of Typer's RuntimeParam (which
    `_TyperParameter.process_value` asks for through `get_runtime_param().coerce`)."""

    def __init__(self, info, annotation):
        self.info, self.annotation = info, annotation

    def coerce(self, value, param, ctx):
        kind = self.annotation
        if value is None:
            return None
        if kind in _PLAIN:
            if type(value) is kind:  # exact: a bool is an int, and is not one here
                return value
            if isinstance(value, str) and kind in (int, float):
                return _parse_number(value, kind, param, ctx)
        else:
            from typer._param_types import coerce_cli_path

            path_type = self.info.path_type or kind
            if isinstance(value, str):
                value = path_type(value)
            if isinstance(value, path_type):
                return coerce_cli_path(value, self.info, path_type=path_type, param=param, ctx=ctx)
        # Anything unexpected (bytes, another type): Typer's own coercion decides.
        from typer._coercion import build_runtime_param

        return build_runtime_param(param.type_descriptor).coerce(value, param=param, ctx=ctx)


def plain_coercion(params) -> None:
    """Give each plain parameter of `params` the coercion above (see the module docstring)."""
    try:
        from typer.core import _TyperParameter
    except ImportError:
        return
    for param in params:
        desc = getattr(param, "type_descriptor", None)
        if (not isinstance(param, _TyperParameter) or getattr(param, "_runtime_param", False) is not None
                or desc is None or getattr(desc, "file_annotation", True) is not None
                or param.multiple or param.nargs != 1):
            continue
        info, annotation = desc.parameter_info, desc.annotation
        if getattr(info, "parser", True) is not None:
            continue
        path_type = getattr(info, "path_type", None) or annotation
        if annotation in _PLAIN or (isinstance(annotation, type) and issubclass(annotation, Path)
                                    and isinstance(path_type, type) and issubclass(path_type, Path)):
            param._runtime_param = _PlainCoercion(info, annotation)
