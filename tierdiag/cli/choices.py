"""Choice options from the registries: --help lists the names, the shell completes them.

`--help` shows `[lru | lfu | ...]` and tab completion offers the same names, both derived from
the registry a module already keeps, so a new policy or preset appears in the CLI with no edit
here. The value itself is checked where the registry is (EngineConfig, slow, synth), so an
unknown name gets the one registry error: "unknown eviction policy 'lr'; known: ...", exit 2.
"""

from __future__ import annotations

from typing import Callable, Iterable


def listed(names: Iterable[str]) -> str:
    """The choices as --help shows them; spaced, so a narrow terminal wraps between names."""
    return "[" + " | ".join(names) + "]"


def completer(names: Iterable[str]) -> Callable[[str], list[str]]:
    known = tuple(names)
    return lambda incomplete: [n for n in known if n.startswith(incomplete)]


def choices(names: Iterable[str]) -> dict:
    """typer.Option(...) keywords for a choice among `names`."""
    known = tuple(names)
    return {"metavar": listed(known), "autocompletion": completer(known)}
