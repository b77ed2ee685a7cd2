"""The contract a user reads (docs/contract.md, README.md) matches the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

from tierdiag.errors import ExitCode
from tierdiag.store.schema import TABLES

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_contract_lists_every_table_and_column_of_the_schema():
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"```\n(\w+)\n(.*?)```", CONTRACT, re.S)}
    for table, columns in TABLES.items():
        assert table in blocks, f"docs/contract.md has no block for table {table} (see tierdiag/store/schema.py)"
        listed = [line.split()[0] for line in blocks[table].splitlines() if line.strip()]
        assert listed == list(columns), f"docs/contract.md, table {table}: columns differ from schema.py"


def test_contract_lists_every_exit_code():
    table = CONTRACT[CONTRACT.index("## 7. Exit codes"):]
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", table, re.M), code


def test_readme_points_into_the_repository_not_beside_it():
    # A user's clone has no ../shared: everything the README cites lives in the repository.
    assert "../shared" not in README and "DESIGN.md" not in README
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).exists(), link
    assert "docs/contract.md" in README
