"""The methods `dataclasses` writes for every dataclass, compiled once and kept beside the bytecode
(start-up of the read commands: issue 41).

Python 3.11's `@dataclass` writes each class's `__init__`, `__repr__`, `__eq__`, `__hash__`,
`__setattr__` / `__delattr__` (frozen) as source text and compiles it with `exec` every time the
class is created, that is at every import of its module: the .pyc of the module holds the class
statement, not these methods. `explain` creates ~60 dataclasses (~350 methods) before it answers,
and parsing and compiling their text was ~15 % of its instructions (valgrind, a 1M-request run),
~20 % of `summary`'s.

`install()` gives `dataclasses` an `exec` (a module global, found before the builtin) that looks
the text up in a table of code objects loaded from one file, compiles what is not there exactly
as the builtin would (filename "<string>", no inherited future flags: dataclasses.py has none),
and runs the code object with the same globals and locals. The methods are the same functions:
the same code objects (equal, field by field), the same globals, defaults and closures; only the
compile is skipped. `collections` gets an `eval` the same way, for the one expression namedtuple
compiles per class (its `__new__`; typing.NamedTuple goes through it). What the process compiled
anew is written back when it exits, atomically,
unless bytecode is not written (`PYTHONDONTWRITEBYTECODE`, `-B`), as for the .pyc files.

The file is `__pycache__/dataclass_code.<cache tag>.marshal` beside tierdiag's own .pyc files
(where `sys.pycache_prefix` puts them, if set); a replay's is
`dataclass_code_replay.<cache tag>.marshal` beside it (TABLES: each command family reads only the
methods it makes). A table is keyed by the text itself, so a changed class compiles its new text
and an old entry is never used for it; the file starts with the interpreter's bytecode magic. A
file that is not there, unreadable, from another Python, cut short or not a table of code objects
is ignored (compiled as ever) and replaced at exit. Past MAX_ENTRIES the entries this process did
not use are dropped, so the file does not grow without bound across edits.

cli/main.py installs it for the plain forms of `summary` and `explain`, and for every `replay`
(its own table: ~200 methods, ~14 % of a replay's instructions before `Engine.run`), before
their modules are imported; app/writer_child.py for a replay's writer process (a table of its
own: ~530 methods and ~70 namedtuples, ~25 % of its instructions before its first take), which
ends by `os._exit` and so writes back (`write_back`) once its close hook has run;
app/sweep_forkserver.py for a sweep's fork server (its table: the replay's and the inline close's
modules), which every worker it forks inherits installed; cli/main.py for `sweep`'s own process
(its table: the command, the merge's store code, the comparison). Only a Python
whose `dataclasses` calls `exec` with text goes through it; on any other the table is simply
never consulted. It lives at the bottom of the layers (it imports nothing of tierdiag) so that
both processes' entries can install it; `tierdiag.cli.dataclass_code` is the same module.

`python -m tierdiag.cli.dataclass_code` writes the tables of the read commands', the replay's and
the writer process's modules at once, as compileall writes .pyc files (also where PYTHONDONTWRITEBYTECODE is set): for
a checkout or an install whose commands run without writing bytecode (benchmarks/readers_ab.py
and targets41.py run it beside compileall). Each table it writes is what a fresh build writes: the
entries its imports used and the ones they compiled, none left from an earlier source (the cap
above prunes only at a write-back, which PYTHONDONTWRITEBYTECODE skips: main's replay table had
grown to 633 entries where a fresh build has 375); a file it finds that is not a table is said in
one line on stderr and rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import CodeType

MAX_ENTRIES = 4000  # ~1.5 KB each; the read commands use ~450
_FORMAT = b"tierdiag-dataclass-code-1\n"

_state: dict = {}

# Each command family's table, by the file name it is kept under (module doc).
TABLES = {"read": "dataclass_code", "replay": "dataclass_code_replay", "writer": "dataclass_code_writer",
          "sweep": "dataclass_code_sweep", "sweep_driver": "dataclass_code_sweep_driver"}


def cache_path(table: str = "read") -> str:
    """Where the table `table` (a key of TABLES) is kept (module doc)."""
    from importlib.util import cache_from_source

    pycache = os.path.dirname(cache_from_source(os.path.join(os.path.dirname(__file__), "__init__.py")))
    return os.path.join(pycache, f"{TABLES[table]}.{sys.implementation.cache_tag}.marshal")


def _header() -> bytes:
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER + _FORMAT + str(sys.flags.optimize).encode() + b"\n"


def load(path: str) -> dict[str, CodeType]:
    """The table in `path`; empty where there is none or it is not one (module doc)."""
    return read(path)[0]


def read(path: str) -> tuple[dict[str, CodeType], str | None]:
    """The table in `path` (as `load`) and, where the file is there but is not a whole table of
    this Python's, why not (None where it is one or there is no file: nothing to say)."""
    import marshal

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"unreadable ({exc.strerror or type(exc).__name__})"
    head = _header()
    if not data.startswith(head):
        if not data:
            return {}, "empty"
        if b"tierdiag-dataclass-code-" in data[:64]:  # the magic, the format line, the flags line
            return {}, "another Python's, another -O level's or an older format's table"
        return {}, "not a table (no table's header)"
    try:
        table = marshal.loads(memoryview(data)[len(head):])
    except (EOFError, ValueError, TypeError):
        return {}, "cut short or not marshal data"
    if type(table) is not dict:
        return {}, f"not a table (a {type(table).__name__})"
    kept = {k: v for k, v in table.items() if type(k) is str and type(v) is CodeType}
    dropped = len(table) - len(kept)
    return kept, (f"{dropped} of its {len(table)} entries not text to code" if dropped else None)


def save(path: str, table: dict[str, CodeType]) -> str | None:
    """Write `table` to `path` atomically; nothing where it cannot be written (then why not)."""
    import marshal

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(_header() + marshal.dumps(table))
        os.replace(tmp, path)
    except OSError as exc:  # a cache, like a .pyc: where it cannot be written, the next start compiles again
        with contextlib.suppress(OSError):  # never made, or its folder not ours to write: nothing to remove
            os.unlink(tmp)
        return exc.strerror or type(exc).__name__
    return None


def _exec(source, globals=None, locals=None, /, **kwargs):
    """`exec` for dataclasses.py: text compiled once (module doc), anything else as the builtin."""
    import builtins

    if type(source) is not str or globals is None or kwargs:
        if globals is None:  # exec's own default: the caller's globals (and then its locals)
            frame = sys._getframe(1)
            globals = frame.f_globals
            if locals is None:
                locals = frame.f_locals
        return builtins.exec(source, globals, locals, **kwargs)
    code = _state["table"].get(source)
    if code is None:
        # As exec(text) compiles it from dataclasses.py: "<string>", its (no) future flags.
        code = compile(source, "<string>", "exec", dont_inherit=True)
        _state["new"][source] = code
    else:
        _state["used"].add(source)
    return builtins.exec(code, globals, locals)


_EVAL = "eval\0"  # the key prefix of namedtuple's expressions (compiled in "eval" mode)


def _eval(source, globals=None, locals=None, /):
    """`eval` for collections' namedtuple (its `__new__` is a lambda compiled from text at every
    class creation: ~40 NamedTuples in these commands), through the same table."""
    import builtins

    if type(source) is not str or globals is None:
        if globals is None:
            frame = sys._getframe(1)
            globals = frame.f_globals
            if locals is None:
                locals = frame.f_locals
        return builtins.eval(source, globals, locals)
    key = _EVAL + source
    code = _state["table"].get(key)
    if code is None:
        code = compile(source, "<string>", "eval", dont_inherit=True)  # collections has no future flags either
        _state["new"][key] = code
    else:
        _state["used"].add(key)
    return builtins.eval(code, globals, locals)


def _write_back() -> None:
    new = _state["new"]
    if not new or sys.dont_write_bytecode:
        return
    table = _state["table"]
    if len(table) + len(new) > MAX_ENTRIES:
        table = {k: v for k, v in table.items() if k in _state["used"]}
    save(_state["path"], {**table, **new})
    new.clear()


def write_back() -> None:
    """Write what this process compiled anew now (as at its exit, `install`), for a process that
    ends by `os._exit` (the writer process: store/writer_serve.py)."""
    if _state:
        _write_back()


def install(path: str | None = None, table: str = "read") -> bool:
    """Route `dataclasses`' exec through the table (module doc): the file `path`, else the table
    `table`'s (TABLES); whether it did (once a process)."""
    import atexit
    import collections
    import dataclasses

    if _state:
        return False
    path = path or cache_path(table)
    loaded, problem = read(path)
    _state.update(path=path, table=loaded, new={}, used=set(), problem=problem)
    setattr(dataclasses, "exec", _exec)  # a global of dataclasses.py, found before the builtin
    setattr(collections, "eval", _eval)  # namedtuple's, likewise
    atexit.register(_write_back)
    return True


# What `summary` and `explain` import on a run of any kind (`build`): the table holds what they
# use, not every dataclass of the package (a bigger table is a longer read at every start). Past
# a plain replay's modules, each kind's lazy import (diagnose/views.py, app/views.py,
# diagnose/request/explain.py): a data-parallel run's ranks and routing step (24-36 methods), a
# sweep's run its upgrade step (54), an imported (observed) run its twin (108). Without them each
# such command compiled those cold, at every start where bytecode is not written (~3.8 ms of CPU
# for the upgrade step's); all 198 add ~0.45 ms to each start's read of the table (628 -> 826).
READ_MODULES = ("tierdiag.app.views", "tierdiag.cli.explain", "tierdiag.cli.summary", "tierdiag.diagnose.views",
                "tierdiag.diagnose.request.explain", "tierdiag.diagnose.run.summary", "tierdiag.diagnose.run.numbers",
                "tierdiag.diagnose.run.kv_memory", "tierdiag.diagnose.session.sessions", "tierdiag.report.views",
                "tierdiag.report.terminal", "tierdiag.report.run_lines", "tierdiag.diagnose.dp.ranks",
                "tierdiag.diagnose.dp.routing", "tierdiag.diagnose.comparison.upgrade_step",
                "tierdiag.diagnose.twin.observed")


# What a replay imports (cli/replay.py's command, the engine, the writer's side in the engine's
# process, its closing view), with and without probes.
REPLAY_MODULES = ("tierdiag.cli.replay", "tierdiag.app.replay", "tierdiag.app.replay_writers",
                  "tierdiag.store.writer_process", "tierdiag.engine.engine", "tierdiag.probes.recorder",
                  "tierdiag.diagnose.request.tokens", "tierdiag.cli.progress", "tierdiag.report.terminal",
                  "tierdiag.cli.hints", "tierdiag.store.reader", "tierdiag.diagnose.read.ids")

# What a replay's writer process imports (app/writer_child.py: the store's writer, the close hook
# and what it preloads, the read-ahead and the live passes it starts while recording, and what they
# import on first use): ~530 dataclass methods and ~70 namedtuples at every start of the writer,
# ~25 % of its instructions before its first take (issue 41, session 25).
WRITER_MODULES = ("tierdiag.app.writer_child", "tierdiag.diagnose.run.close", "tierdiag.store.writer_serve",
                  "tierdiag.store.writer", "tierdiag.diagnose.run.evidence", "tierdiag.engine.rules",
                  "tierdiag.diagnose.run.run_claims", "tierdiag.store.lookup", "tierdiag.diagnose.run.story_rows",
                  "tierdiag.diagnose.run.size_curves", "tierdiag.diagnose.run.live_curves",
                  "tierdiag.config.engine", "tierdiag.trace.reader", "tierdiag.probes.recorder",
                  # imported by a run's end, its namedtuples with it (pyarrow.compute no longer is:
                  # the taken rows' columns are read from their Arrow buffers, store/columns.py)
                  "traceback")
# What a sweep's worker imports (app/sweep_forkserver.py installs this table in the fork server
# before its preload, and every worker it forks inherits it): the replay's modules as the fork
# server preloads them, and what the first replay of each worker imports on top, the inline
# writer's store code and its close.
SWEEP_MODULES = ("tierdiag.app.sweep_worker", "tierdiag.app.replay", "tierdiag.engine.engine",
                 "tierdiag.probes.recorder", "tierdiag.diagnose.run.close", "tierdiag.app.replay_writers",
                 "tierdiag.store.writer", "tierdiag.store.writer_process", "tierdiag.diagnose.run.run_claims",
                 "tierdiag.diagnose.run.live_curves", "tierdiag.diagnose.request.claims")
# What `tierdiag sweep`'s own process imports (cli/main.py installs this table for it as it starts):
# the command and the runner, the merge's store code, the comparison and its text view (~690
# methods: ~16 % of its imports' CPU before the workers start, ~40 % of the comparison's).
SWEEP_DRIVER_MODULES = ("tierdiag.cli.main", "tierdiag.cli.exits", "tierdiag.cli.params", "tierdiag.cli.sweep",
                        "tierdiag.config.sweep_spec", "tierdiag.engine.rules", "tierdiag.app.sweep",
                        "tierdiag.store.copy_run", "tierdiag.trace.reader", "tierdiag.cli.progress",
                        "tierdiag.app.sweep_view", "tierdiag.diagnose.comparison.compare",
                        "tierdiag.report.compare_terminal")
MODULES = {"read": READ_MODULES, "replay": REPLAY_MODULES, "writer": WRITER_MODULES, "sweep": SWEEP_MODULES,
           "sweep_driver": SWEEP_DRIVER_MODULES}


def build(path: str | None = None, table: str = "read") -> int:
    """Install, import the modules of `table` (MODULES), write the table whatever
    PYTHONDONTWRITEBYTECODE says (as compileall does); the number of entries written. The table
    written is what these imports used, kept as read, and what they compiled anew: a fresh
    table's content, whatever the file held (entries of classes since changed are dropped). A file
    that was not a table, or a table that cannot be written, is said in one line on stderr. The
    modules are imported in a process of their own (a module imported already makes no class)."""
    import importlib

    install(path, table)
    for name in MODULES[table]:
        importlib.import_module(name)
    used, new = _state["used"], _state["new"]
    # In the texts' order: the file is then the same bytes whatever it held before (a fresh build's).
    made = {k: new[k] if k in new else _state["table"][k] for k in sorted(used.union(new))}
    path, problem = _state["path"], _state["problem"]
    error = save(path, made)
    uninstall()
    if problem:
        print(f"tierdiag.dataclass_code: {path}: {problem}; rebuilt", file=sys.stderr)
    if error:
        print(f"tierdiag.dataclass_code: {path}: not written ({error}); commands compile their methods as "
              "without the table", file=sys.stderr)
    return len(made)


def uninstall() -> None:
    """Undo `install` (tests): dataclasses' exec is the builtin again; nothing is written."""
    import atexit
    import collections
    import dataclasses

    if not _state:
        return
    atexit.unregister(_write_back)
    if dataclasses.__dict__.get("exec") is _exec:
        delattr(dataclasses, "exec")
    if collections.__dict__.get("eval") is _eval:
        delattr(collections, "eval")
    _state.clear()


def build_all() -> list[str]:
    """Every table of TABLES, each built in a process of its own (`build`); a line for each."""
    import subprocess

    lines = []
    for table in TABLES:
        code = f"from tierdiag.cli.dataclass_code import build; print(build(table={table!r}))"
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        sys.stderr.write(done.stderr)  # build's own line, where the file was not a table or not written
        lines.append(f"{done.stdout.strip()} dataclass methods in {cache_path(table)}")
    return lines


if __name__ == "__main__":
    print("\n".join(build_all()))
