# h47sweep: a sweep's timeline and CPU by process and step (benchmarks/sweep_split.py reads it).
# Loaded by every Python process started with this folder on PYTHONPATH and SWEEP_SPLIT_LOG set:
# the driver (`tierdiag sweep`), its fork server, the workers it forks, and a single `tierdiag
# replay` with its writer process. Each wraps a few named functions after their module is
# imported (an import hook: no module is imported earlier than the code itself does) and appends
# one JSON line per event to SWEEP_SPLIT_LOG: pid, role, the step, wall time, process and thread
# CPU. A forked worker's CPU counts from its fork (Linux resets a child's times).
import os
import sys

_LOG = os.environ.get("SWEEP_SPLIT_LOG")


def _install() -> None:
    import functools
    import importlib.abc
    import json
    import threading
    import time

    with open("/proc/self/cmdline", "rb") as fh:
        cmd = fh.read().decode(errors="replace")
    if "multiprocessing.forkserver" in cmd:
        role = ["forkserver"]
    elif "writer_child" in cmd or "writer_serve" in cmd:
        role = ["writer"]
    elif "\0sweep\0" in cmd:
        role = ["driver"]
    elif "\0replay\0" in cmd:
        role = ["single"]
    else:
        return

    def start_time() -> float:
        """The process's start (from /proc: 10 ms steps, since boot), as wall time."""
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age

    def task_cpu() -> dict:
        """CPU seconds of each of this process's threads (by kernel thread name)."""
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as fh:
                    head, rest = fh.read().rsplit(")", 1)
            except OSError:
                continue
            f = rest.split()
            name = head.split("(", 1)[1] + ":" + tid
            out[name] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        return out

    import resource

    def log(step: str, **extra) -> None:
        ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        line = {"pid": os.getpid(), "ppid": os.getppid(), "role": role[0], "step": step, "t": time.time(),
                "cpu": ru.ru_utime + ru.ru_stime, "sys": ru.ru_stime, "minflt": ru.ru_minflt,
                "thread_cpu": time.thread_time(), "children_cpu": rc.ru_utime + rc.ru_stime,
                "thread": threading.current_thread().name, **extra}
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)

    def timed(name: str, fn, after=None):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            log(name + ":begin")
            try:
                out = fn(*a, **k)
            finally:
                log(name + ":end", **({"threads": task_cpu()} if name in THREADS_AT_END else {}))
            if after is not None:
                after(out)
            return out
        return wrapper

    THREADS_AT_END = {"replay_one", "replay", "InlineWriter.close", "RunWriter.finish"}

    def wrap(mod, dotted: str, after=None) -> None:
        owner, _, attr = dotted.rpartition(".")
        target = getattr(mod, owner) if owner else mod
        setattr(target, attr, timed(dotted, getattr(target, attr), after))

    def phases(result) -> None:
        log("replay:phases", **getattr(result, "wall_phases", {}) or {})

    patches = {
        "tierdiag.app.sweep": ["run_configs", "warm_up_workers", "_check_trace", "_merge", "_run_processes",
                               "_sweep_workdir", "_leave_workdir"],
        "tierdiag.app.sweep_kept": ["Keeper.last_try"],
        "tierdiag.app.sweep_fork": ["warm_up_workers"],
        "tierdiag.app.sweep_view": ["compare_sweep"],
        "tierdiag.store.copy_run": ["open_destination", "RunFileCopier.__init__", "RunFileCopier.source",
                                    "RunFileCopier.copy", "RunFileCopier.close"],
        "tierdiag.app.sweep_worker": ["replay_one"],
        "tierdiag.app.replay_writers": ["InlineWriter.open", "InlineWriter.close", "WriterInProcess.start",
                                        "WriterInProcess.open", "WriterInProcess.close", "WriterInProcess.finished"],
        "tierdiag.store.writer": ["RunWriter.__init__", "RunWriter.write", "RunWriter.finish"],
        "tierdiag.store.writer_serve": ["_Serve.open", "_Serve.write", "_Serve.finish"],
        "multiprocessing.forkserver": ["_serve_one"],
    }
    if role[0] == "forkserver":
        patches["multiprocessing.forkserver"].append("main")

    def patch_module(mod) -> None:
        name = mod.__name__
        for dotted in patches.get(name, ()):
            if name == "multiprocessing.forkserver" and dotted == "main":
                orig = mod.main

                @functools.wraps(orig)
                def main(*a, **k):
                    # The preload is main's own (its imports' frames are main's); it ends where main
                    # closes stdin, right after it.
                    import gc
                    import multiprocessing.util as util
                    log("preload:begin", gc=[s["collections"] for s in gc.get_stats()], gc_enabled=gc.isenabled())
                    close_stdin = util._close_stdin

                    def _close_stdin():
                        log("preload:end", gc=[s["collections"] for s in gc.get_stats()], modules=len(sys.modules),
                            threads=task_cpu(), frozen=gc.get_freeze_count())
                        close_stdin()
                    util._close_stdin = _close_stdin
                    return orig(*a, **k)
                mod.main = main
            elif name == "multiprocessing.forkserver" and dotted == "_serve_one":
                orig_serve = mod._serve_one

                @functools.wraps(orig_serve)
                def _serve_one(*a, **k):
                    import gc
                    role[0] = "worker"
                    log("worker:fork", gc=[s["collections"] for s in gc.get_stats()])
                    try:
                        return orig_serve(*a, **k)
                    finally:
                        log("worker:exit", gc=[s["collections"] for s in gc.get_stats()], threads=task_cpu())
                mod._serve_one = _serve_one
            else:
                wrap(mod, dotted)
        if name == "tierdiag.app.replay":
            wrap(mod, "replay", after=phases)

    patches.setdefault("tierdiag.app.replay", [])

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in patches:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            orig_exec = loader.exec_module

            def exec_module(module):
                orig_exec(module)
                patch_module(module)
            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook())
    orig_run = threading.Thread.run

    def run(self):
        try:
            orig_run(self)
        finally:
            log("thread:end", target=getattr(getattr(self, "_target", None), "__qualname__", type(self).__qualname__))
    threading.Thread.run = run
    log("process:start", started=start_time())
    import atexit

    atexit.register(lambda: log("process:exit", threads=task_cpu()))


if _LOG:
    _install()
