"""docs/architecture.md cannot go stale: every path it names into the code exists.

It names paths three ways, all checked:
- from the repository root: `tierdiag/...`, `tests/...`, `benchmarks/...`;
- from the package: `diagnose/request/claims.py`, `engine/rules.py`, `app/` (a top-level package of
  tierdiag first);
- in a table row that opens with a folder (a layer, `| `engine` |`, or a package,
  `| `diagnose/run/` |`), the row names its files from that folder: each backticked `name.py`
  or `folder/` in the row.
Placeholders (`<name>.py`) and globs (`*`) are not paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "tierdiag"
LAYERS = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
ROOTED = ("tierdiag", "tests", "benchmarks")

# a path: a known first folder, then name characters and slashes (a file's suffix included)
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*)" % "|".join(map(re.escape, ROOTED + tuple(LAYERS))))
ROW = re.compile(r"^\|\s*`([\w/]+)`\s*\|(.*)$", re.M)
TICKED = re.compile(r"`([\w./-]+)`")


def _exists(path: str, base: Path) -> bool:
    path = path.rstrip(".,;:)'")
    target = base / path
    return target.exists() or target.with_suffix(".py").exists() if not path.endswith("/") else target.is_dir()


def named_paths(text: str) -> list[tuple[str, Path]]:
    """(path as written, the folder it is relative to) for every path the page names."""
    out = []
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".,;:)'")
        if not p or "<" in text[m.end():m.end() + 1] or "*" in text[m.end():m.end() + 1]:
            continue  # a placeholder (advice/rules/<name>.py) or a glob (diagnose/*)
        base = ROOT if p.split("/")[0] in ROOTED else PKG
        out.append((p, base))
    for row in ROW.finditer(text):
        first, rest = row.group(1), row.group(2)
        if first.split("/")[0] not in LAYERS or (first not in LAYERS and not first.endswith("/")):
            continue  # a row about a name, not a folder
        for t in TICKED.findall(rest):
            if (t.endswith(".py") or t.endswith("/")) and t.split("/")[0] not in ROOTED + tuple(LAYERS):
                out.append((t, PKG / first.rstrip("/")))
    return out


def test_every_path_the_architecture_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    paths = named_paths(text)
    assert len(paths) > 50, "the page names the code's paths; the pattern finds them"
    missing = sorted({f"{base.relative_to(ROOT)}/{p}" if base != ROOT else p
                      for p, base in paths if not _exists(p, base)})
    assert missing == [], "docs/architecture.md names paths that do not exist:\n" + "\n".join(missing)


def test_every_diagnose_package_is_on_the_page():
    """Each subpackage of diagnose/ has its row in the page's table of questions."""
    text = DOC.read_text(encoding="utf-8")
    packages = sorted(p.name for p in (PKG / "diagnose").iterdir() if (p / "__init__.py").is_file())
    assert packages, "diagnose/ has subpackages"
    absent = [p for p in packages if f"`diagnose/{p}/`" not in text]
    assert absent == [], f"diagnose packages without their row in docs/architecture.md: {absent}"


@pytest.mark.parametrize("written, base, exists", [
    ("diagnose/request/claims.py", PKG, True),
    ("diagnose/claims.py", PKG, False),            # a module that moved: the page is stale
    ("tierdiag/diagnose/read/", ROOT, True),
    ("engine/no_such_module.py", PKG, False),
    ("tests/test_architecture.py", ROOT, True),
])
def test_the_check_tells_a_stale_path(written, base, exists):
    assert _exists(written, base) is exists


def test_the_pattern_reads_the_forms_the_page_uses():
    sample = ("hook diagnose/run/close.py: run evidence; `tests/test_architecture.py`, (config/names.py)\n"
              "diagnose/* and `diagnose/advice/rules/<name>.py` are not paths\n"
              "| `engine` | `tree.py` (residency), `routing/` (routers) | touch the store |\n"
              "| `diagnose/run/` | the run's story | `facts.py` (the one reader) |\n"
              "| `config/names.py` `Cause` | `engine/rules.py` |\n")
    got = [(p, b.relative_to(ROOT).as_posix()) for p, b in named_paths(sample)]
    assert ("diagnose/run/close.py", "tierdiag") in got
    assert ("tests/test_architecture.py", ".") in got
    assert ("config/names.py", "tierdiag") in got
    assert ("tree.py", "tierdiag/engine") in got and ("routing/", "tierdiag/engine") in got
    assert ("facts.py", "tierdiag/diagnose/run") in got
    assert ("engine/rules.py", "tierdiag") in got
    assert not any("<" in p or p.endswith("*") or p == "diagnose/" for p, _ in got)
