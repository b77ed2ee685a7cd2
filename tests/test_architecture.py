"""The layers of docs/architecture.md, enforced: import-linter's `layers` contract
(pyproject.toml, [tool.importlinter]) and no import circle between any two modules. grimp, which
both use, counts imports inside functions too, so a lazy import is no way around either; nor is
an import under TYPE_CHECKING (annotations only): the contract and the circle test count those
too, so both measure the graph docs/architecture.md draws."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="import-linter is a dev dependency (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    argv = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    proc = subprocess.run([*argv, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_type_checking_imports_count():
    """An annotation that needs a type from a layer above is a layer broken too (the type belongs
    lower, or a Protocol below describes it): the contract must not be set to look away."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert linter.get("exclude_type_checking_imports", False) is False


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_circle_between_modules():
    graph = grimp.build_graph("tierdiag", exclude_type_checking_imports=False)
    # A package's __init__ importing its own submodules is not a circle of responsibilities.
    circles = [c for c in _cycles(graph) if not all(m.startswith(c[0] + ".") or m == c[0] for m in c)]
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_architecture_page_names_every_layer_of_the_contract():
    """docs/architecture.md draws the layers the contract enforces: every package or module in the
    contract is named there, and every top-level package of tierdiag is in the contract."""
    import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    names = [n.strip() for layer in contract["layers"] for n in layer.replace(":", "|").split("|")]
    page = (ROOT / "docs" / "architecture.md").read_text()
    for name in names:
        assert name.removeprefix("tierdiag.") in page, f"docs/architecture.md does not name layer {name}"
    top = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "tierdiag").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert top == {n.removeprefix("tierdiag.") for n in names}, "a top-level package outside the layers contract"
