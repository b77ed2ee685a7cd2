"""Options shared by several commands (declared once) and the one place errors become exits.

stdout is data, stderr is diagnostics.
"""

from __future__ import annotations

import json
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

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
