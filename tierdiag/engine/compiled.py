"""Which engine core this process runs: the engine's hot modules compiled by mypyc (setup.py), or
the same modules' Python source, the reference twin (issue 41).

The compiled modules are the .py files themselves, compiled: the same source is the Python twin,
so both produce the same rows by construction (tests/engine/test_compiled_engine.py checks it).
setup.py writes `_compiled.json` beside this file when it builds them: the modules and a
SHA-256 of each source. The pure twin runs when

- `TIERDIAG_PURE_ENGINE=1` asks for it ("asked");
- the build did not compile them (no mypyc at build time, mypyc refused the source, no C
  compiler: `_compiled.json` says which, or the extensions are missing);
- a source changed since the build (a stale build would run old code): "stale". A source whose
  size and modification time are those the build recorded (`stats`, as a .pyc is checked) is
  taken as the one compiled without hashing it; any other is hashed and compared with its digest,
  so a touched but unchanged file still runs compiled (~2-3 ms of every replay's start were these
  20 digests and OpenSSL's load, issue 41).

Then an import hook (a finder ahead of the standard ones) loads each of those modules from its
.py file, so an extension left in place is never imported. Decided once, at the first import of
one of those modules (tierdiag.engine's __init__ installs the finder that decides); `describe()` says what was decided and why
(`tierdiag doctor`'s "engine core" line). This module is never compiled itself."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

ENV = "TIERDIAG_PURE_ENGINE"
HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "_compiled.json"
GROUP = "tierdiag.engine._compiled__mypyc"  # mypyc's shared library (setup.py's group_name)
# The modules setup.py compiles: the per-request path (benchmarks/core.py --profile) and what it
# calls into, the storage tier, the data-parallel loop and the clock (CostModel: a decode step's
# time is asked once a step); the rest of the engine stays Python (pagepool, pagemap, rows and
# content are thin wrappers of the C data plane already; routing/ is dict work already in C).
# A dotted name is a subpackage's module (routing.approx_tree: tierdiag/engine/routing/approx_tree.py):
# the arrivals (`due`/`next_ns`, ~70k calls on 3,000 requests from the scheduler) and the
# cache-aware router's approximate tree (issue 41's --dp row, session 18 h41route), the Gateway in
# front of the router (its route, finish and count a request: session 35 h45dp8). The rest of
# routing/ stays Python: its Router base is subclassed by every policy, and a compiled class
# cannot have interpreted subclasses.
# rule_functions: the RuleSet's eviction amount; cached_split: its cached-prefix split (rules.py is
# interpreted); emitters: the engine's handle on its probe (`self.emit.X` a native read).
MODULES = ("emitters", "rule_functions", "cached_split", "tree_node", "tree", "schedule_common", "request", "records",
           "miss", "queue_policy", "prefetch", "decode", "admission", "controller", "scheduler", "storage",
           "deployment", "costmodel", "arrivals", "routing.approx_tree", "routing.gateway")

_STATE: dict = {}


def source_digest(path: Path) -> str:
    import hashlib  # here: a process that imports no compiled module never needs it

    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_stat(path: Path) -> list[int]:
    """What the build records of a source besides its digest: [size, mtime in ns] (module doc)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def source_path(name: str) -> Path:
    """The .py file of a module of MODULES (a dotted name: a subpackage's module)."""
    return HERE.joinpath(*name.split(".")).with_suffix(".py")


def _extension(name: str) -> Path | None:
    *parts, last = name.split(".")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = HERE.joinpath(*parts, f"{last}{suffix}")
        if p.exists():
            return p
    return None


def _decide() -> tuple[str, str, list[str]]:
    """(mode, why, modules): mode "compiled" or "pure"; modules those the build compiled."""
    import json  # here, as hashlib: only a process that decides reads the manifest

    try:
        manifest = json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        manifest = {"compiled": False, "why": "not built by setup.py (no _compiled.json)"}
    except (OSError, ValueError) as exc:
        manifest = {"compiled": False, "why": f"_compiled.json unreadable: {exc}"}
    sources: dict[str, str] = manifest.get("sources") or {}
    stats: dict[str, list[int]] = manifest.get("stats") or {}
    modules = [m for m in MODULES if m in sources]
    if os.environ.get(ENV, "") not in ("", "0"):
        return "pure", f"asked ({ENV}={os.environ[ENV]})", modules
    if not manifest.get("compiled"):
        return "pure", str(manifest.get("why") or "not compiled"), modules
    missing = [m for m in modules if _extension(m) is None]
    if missing or _extension("_compiled__mypyc") is None:
        return "pure", f"compiled extensions missing ({', '.join(missing) or 'the shared library'}): the C build " \
                       "failed (no C compiler?) or was removed", modules
    for m in modules:
        try:
            if stats.get(m) is not None and source_stat(source_path(m)) == stats[m]:
                continue  # as built: its size and time are the build's (module doc)
            digest = source_digest(source_path(m))
        except OSError as exc:
            return "pure", f"{source_path(m).relative_to(HERE)} unreadable: {exc}", modules
        if digest != sources[m]:
            return "pure", f"stale build: {source_path(m).relative_to(HERE)} changed since it was compiled (rebuild: " \
                           "python setup.py build_ext --inplace)", modules
    try:
        importlib.import_module(GROUP)
    except ImportError as exc:
        return "pure", f"the compiled build does not load: {exc}", modules
    return "compiled", f"mypyc {manifest.get('mypy', '?')}, {len(modules)} modules", modules


class _Finder:
    """Ahead of the standard finders: the first import of a module that may be compiled decides
    which core this process runs (`_decided`); for the pure twin it loads each of those modules
    from its .py file, never from an extension module beside it. Importing the package alone (a
    read command reading engine.rules) decides nothing: no manifest read, no source hashed."""

    names = frozenset(f"tierdiag.engine.{m}" for m in MODULES)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or _decided()["mode"] != "pure":
            return None  # not ours, or compiled: the standard finders load the extension
        source = source_path(fullname[len("tierdiag.engine."):])
        return importlib.util.spec_from_file_location(
            fullname, source, loader=importlib.machinery.SourceFileLoader(fullname, str(source)))


def _decided() -> dict:
    """Which core this process runs, decided once (every module that may be compiled, whatever the
    manifest says, comes from its source in a pure process)."""
    if not _STATE:
        mode, why, modules = _decide()
        _STATE.update(mode=mode, why=why, modules=modules)
    return _STATE


def install() -> None:
    """Put the finder in place (once); the decision waits for the first compiled module's import."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def describe() -> dict:
    """{"mode": "compiled" | "pure", "why": ..., "modules": [...]} for this process."""
    state = _decided()
    return {"mode": state["mode"], "why": state["why"], "modules": list(state["modules"])}


def is_compiled() -> bool:
    return describe()["mode"] == "compiled"
