"""Where a sweep's local worker processes come from (app/sweep.py's back end 1): a fork server
that has imported the replay, started as early as the caller can (`warm_up_workers`).

Kept apart from sweep.py, which imports the merge's store code (duckdb, pyarrow, numpy: ~0.2 s
of CPU): `tierdiag sweep` starts the fork server from here before any of that is imported, so
the server's boot and its preload run beside the driver's own start instead of after part of it
(issue 41's 4-run sweep: the fork server's preload was the longer of the two).
"""

from __future__ import annotations

# What the fork server imports once for every worker it forks: sweep_forkserver, which readies
# the server (the collector held off through the imports, their objects frozen once made, the
# dataclass methods from the sweep's table, one BLAS thread) around the replay's import chain
# (PRELOAD_MODULES), the parts `replay` imports lazily included (the engine, the recorder, the close's evidence:
# most of the ~0.26 s of imports in a worker's first replay, against ~0.21 s of CPU for
# replaying a 50-request trace). Not the store's writer: it imports pyarrow, which starts a
# thread at import (jemalloc's background thread), and a fork server should not fork with
# threads of unknown state (numpy's OpenBLAS thread, which the engine brings, is stopped and
# restarted around a fork by OpenBLAS itself; DuckDB starts threads with a connection, not at
# import).
PRELOAD_MODULES = ("tierdiag.app.sweep_worker", "tierdiag.app.replay", "tierdiag.engine.engine",
                   "tierdiag.probes.recorder", "tierdiag.diagnose.run.close")
# sweep_forkserver first: it imports PRELOAD_MODULES itself, readied; named after it, they are
# imported anyway by a fork server where it could not tell it was in one (each a no-op after it).
WORKER_PRELOAD = ["tierdiag.app.sweep_forkserver", *PRELOAD_MODULES]


def worker_context():
    """Where worker processes come from: a fork server (a fresh interpreter, started once per
    process, that has imported the replay: `WORKER_PRELOAD`) where the platform has one, so a
    worker starts warm in a few milliseconds and the replay's imports are paid once for all the
    workers, not once each (~0.5 s of CPU a worker, the other workers' core on a 2-core
    machine: issue 41's 4-run sweep); else spawn, a fresh interpreter a worker. Either way no
    worker inherits the driver's state (no forked torch/CUDA/DuckDB threads). As with any
    spawn pool, a script calling run_configs must guard its top level with
    `if __name__ == "__main__":`."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


def warm_up_workers() -> None:
    """Start the fork server now (it boots and imports the replay while the caller is still
    planning its sweep); harmless to call twice, or where there is no fork server."""
    from multiprocessing import forkserver

    if worker_context().get_start_method() == "forkserver":
        forkserver.ensure_running()
