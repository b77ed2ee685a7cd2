"""The one output sink of the commands: a command parses its options, makes one call that returns
a typed result, and hands the result here. `--json` prints the result's documented JSON view (its
`to_json()`, docs/contract.md); otherwise the text renderer registered for the result's type draws
it. No command assembles JSON or a Rich table itself.

The sink writes to stdout, or to stderr where stdout is a file the command writes (`convert -o
/dev/stdout`). Data is never markup and never raw terminal escapes: the JSON is ASCII with every
control character escaped, and text goes through report.console's SafeConsole (no markup, controls
escaped), which `line` uses for a plain line too. JSON never imports Rich.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

# result type (or its "module.QualName", for a type whose module the command imports only when it
# runs) -> fn(result, console, **context): the text view of that result.
_RENDERERS: dict[type | str, Callable[..., None]] = {}


def renders(*types: type | str):
    """Register the decorated function as the text view of results of `types` (and their subclasses)."""

    def register(fn):
        for t in types:
            if t in _RENDERERS and _RENDERERS[t] is not fn:
                raise TypeError(f"{t} already has a text view: {_RENDERERS[t].__qualname__}")
            _RENDERERS[t] = fn
        return fn

    return register


def renderer_for(result: object) -> Callable[..., None]:
    """The text view registered for `result`'s type, nearest class first."""
    for cls in type(result).__mro__:
        fn = _RENDERERS.get(cls) or _RENDERERS.get(f"{cls.__module__}.{cls.__qualname__}")
        if fn is not None:
            return fn
    raise TypeError(f"no text view registered for {type(result).__name__}")


def json_text(view: Any) -> str:
    """A JSON view as printed: two-space indent, ASCII (controls and non-ASCII escaped), anything
    else JSON cannot hold (a path, a date) as its str."""
    return json.dumps(view, indent=2, default=str) + "\n"


class Sink:
    """Where one command's result goes: `json` picks the JSON view, `stderr` the stream."""

    def __init__(self, *, json: bool = False, stderr: bool = False):
        self.json = json
        self.stderr = stderr

    @property
    def console(self):
        """The SafeConsole the text views draw on (made on first use: JSON never needs it)."""
        from tierdiag.cli.common import err, out

        return err if self.stderr else out

    def emit(self, result: Any, **context: Any) -> None:
        """The result: its JSON view, or its registered text view (`context`: what the view needs
        beside the result, e.g. the store a hint names)."""
        if self.json:
            stream = sys.stderr if self.stderr else sys.stdout
            stream.write(json_text(result.to_json()))
            stream.flush()
            note = getattr(result, "json_note", None)
            if note is not None:  # what the text view says beside the data, kept off the JSON's stream
                from tierdiag.cli.common import err

                err.print(note(), markup=False, highlight=False)
            return
        renderer_for(result)(result, self.console, **context)

    def emit_answer(self, view: Callable[..., Any], *args: Any) -> None:
        """`emit(view(*args))` (a read command's view, app/views.py), the text views' modules
        (Rich's ~25 ms of import) left for the first wait of this thread on another while the view
        runs (threads.idle_work: the store still opening, explain's reads still running), so that
        the import fills a wait instead of following the answer. --json imports no view."""
        if self.json:
            self.emit(view(*args))
            return
        from tierdiag.threads import idle_work

        with idle_work(_import_text_views):
            result = view(*args)
        self.emit(result)


def _import_text_views() -> None:
    import tierdiag.report.terminal  # noqa: F401 - Rich and the views, imported as the text view will
    import tierdiag.report.views  # noqa: F401
