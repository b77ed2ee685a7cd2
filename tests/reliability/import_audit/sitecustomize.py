"""Loaded by every Python process a test of tests/reliability/test_thread_imports.py starts (this
folder first on PYTHONPATH; the writer process and other children inherit it): records each
module a thread other than the main one names in an import (a Python `import`, or C code's
PyImport_Import, as DuckDB's for `datetime`) that was not yet imported when the thread was
started, one line `thread<TAB>module<TAB>where` to TIERDIAG_IMPORT_AUDIT.PID. Such an import takes
the import lock from the thread while the main thread may hold it (CPython 3.11's module locks:
seen hanging a replay, session 24)."""

from __future__ import annotations

import builtins
import os
import sys
import threading
import traceback

_LOG = os.environ.get("TIERDIAG_IMPORT_AUDIT")

if _LOG:
    _path = f"{_LOG}.{os.getpid()}"
    open(_path, "a").close()  # this process ran the audit (the test checks every process did)
    _started: dict[int, frozenset] = {}  # thread ident -> sys.modules' names when it was started
    _real_import = builtins.__import__
    _real_start = threading.Thread.start
    _real_bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def _start(self, *args, **kwargs):
        self._tierdiag_loaded = frozenset(sys.modules)  # on the caller's thread, before it runs
        return _real_start(self, *args, **kwargs)

    def _bootstrap_inner(self):
        _started[threading.get_ident()] = getattr(self, "_tierdiag_loaded", frozenset())
        try:
            _real_bootstrap(self)
        finally:
            _started.pop(threading.get_ident(), None)

    def _absolute(name, globals_, level):
        if not level:
            return name
        package = (globals_ or {}).get("__package__") or ""
        base = package.rsplit(".", level - 1)[0] if level > 1 else package
        return f"{base}.{name}" if name else base

    def _audited_import(name, globals=None, locals=None, fromlist=(), level=0):
        loaded = _started.get(threading.get_ident())
        module = _real_import(name, globals, locals, fromlist, level)
        if loaded is not None:
            absolute = _absolute(name, globals, level)
            named = [absolute] + [f"{absolute}.{item}" for item in fromlist or () if f"{absolute}.{item}" in sys.modules]
            late = [n for n in named if n not in loaded]
            if late:
                where = "".join(traceback.format_stack(limit=3)[:-1]).replace("\n", " | ")
                with open(_path, "a") as log:
                    for n in late:
                        log.write(f"{threading.current_thread().name}\t{n}\t{where}\n")
        return module

    threading.Thread.start = _start
    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
    builtins.__import__ = _audited_import
