"""Options shared by several commands (declared once) and the one place errors become exits.

stdout is data, stderr is diagnostics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from tierdiag.store.reader import DEFAULT_DB

DbOpt = Annotated[Path, typer.Option("--db", help="Run-store file (DuckDB).")]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Run id, id prefix or name; default: newest.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DEFAULT_DB_PATH = Path(DEFAULT_DB)

def _styling() -> dict:
    """NO_COLOR (https://no-color.org, any non-empty value) turns off all styling, bold and dim
    included: Rich's own NO_COLOR support drops only the colours."""
    return {"color_system": None} if os.environ.get("NO_COLOR") else {}


out = Console(soft_wrap=True, **_styling())
err = Console(stderr=True, soft_wrap=True, **_styling())


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
