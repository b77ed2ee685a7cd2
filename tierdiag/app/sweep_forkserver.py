"""Imported by a sweep's fork server only (app/sweep_fork.py `WORKER_PRELOAD`), once, before it
forks any worker: its import readies the server and imports what every worker's replay needs.

- The collector is held off through the imports and what they made is frozen after them
  (`gc.freeze`): those objects (modules, classes, the config's types) live as long as the server
  and its workers, and at the default thresholds the collector walked them again and again as
  they came; frozen, no worker's pass walks them either (a worker's replay runs under its own
  thresholds, app/replay.py `_fewer_gc_passes`).
- The dataclass methods come from the sweep's table (tierdiag/dataclass_code.py): the replay's
  modules and the inline writer's close, which every worker runs; the workers inherit it.
- OpenBLAS to one thread before numpy loads (app/replay.py `single_threaded_blas`, which each
  worker's replay calls too, after the server imported numpy: too late for the server's own).

Nothing here runs in a process that imports it otherwise (a test, a tool listing modules): the
work is `boot()`'s, called at the bottom only where the import comes from the fork server's own
`main` (multiprocessing/forkserver.py, which imports each preloaded name in turn)."""

from __future__ import annotations

import sys

from tierdiag.app.sweep_fork import PRELOAD_MODULES


def boot(modules=PRELOAD_MODULES, *, table: str = "sweep") -> None:
    """Import `modules` with the collector off, the dataclass table `table` installed and one
    BLAS thread; freeze what they made and turn the collector back on as it was."""
    import gc
    import importlib

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from tierdiag import dataclass_code
        from tierdiag.app.replay import single_threaded_blas  # numpy is not imported by it

        single_threaded_blas()
        dataclass_code.install(table=table)
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def _imported_by_fork_server() -> bool:
    """Whether this import was made by multiprocessing's fork server `main` (its preload)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if _imported_by_fork_server():
    boot()
