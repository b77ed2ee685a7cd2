"""Choice options from the registries: Typer checks the value, --help lists the names.

`tierdiag replay --eviction-policy mru` is refused by Typer itself (exit 2, naming the choices)
and `--help` shows `[lru | lfu | ...]`, both derived from the registry a module already keeps,
so a new policy or preset appears in the CLI with no edit here.
"""

from __future__ import annotations

from typing import Iterable, Literal, Optional


def choice(names: Iterable[str], *, optional: bool = False) -> object:
    """Literal[...] of the names (Optional[...] when None means "not given")."""
    lit = Literal[tuple(names)]
    return Optional[lit] if optional else lit


def listed(names: Iterable[str]) -> str:
    """The choices as --help shows them; spaced, so a narrow terminal wraps between names."""
    return "[" + " | ".join(names) + "]"
