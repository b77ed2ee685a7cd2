"""Errors raised inside the compiled engine core reach the user as one line and their exit code,
on the compiled build and on its Python twin alike (h41safe item 1).

What was found: a helper saw a segfault when an EngineError was raised from a compiled deployment
function ("a garbage __cause__"); the lead could not reproduce it standalone. The cause was the
class, not the raise: EngineError was defined in engine/schedule_common.py (compiled) over
TierdiagError, which mypyc does not follow (setup.py: imports outside the compiled modules are
Any), and mypyc built it as a native class laid out as a bare object: `EngineError.__basicsize__`
24, where BaseException's is 72. Making one wrote its fields past the object, and reading its
`__context__` (what any traceback, `raise ... from`, or the CLI's error path does) read garbage
(0x1) and segfaulted; merely `EngineError("x").__context__` crashed the interpreter. Marking it
`@mypyc_attr(native_class=False)` was no fix either: mypyc then made it with no base at all
("EngineError() takes no arguments"). EngineError now lives in tierdiag/errors.py (interpreted),
re-exported by schedule_common, so every module that raises it raises a real exception.

| input | before (compiled) | after |
|---|---|---|
| `EngineError("x").__context__` | segfault | None |
| a request that waits for device memory no event frees, `--dp 1` (Scheduler.run) | segfault | EngineError "no progress possible", exit 1 one line |
| the same at `--dp 2` (Deployment.run) | segfault | the same |
| the storage tier's `raise _output_error(...) from None` (4 sites, and `_storage_errors`) | OutputError, exit 6; but its OSError chained as its context (no `from None`) | context suppressed, as in the twin |

Found beside it: mypyc compiles `raise X from Y` as `raise X` (mypyc/irbuild/statement.py
`transform_raise_stmt` never reads the `from`): on the compiled build neither `__cause__` nor
`__suppress_context__` is set, so a `--debug` traceback showed the storage tier's OSError under
its OutputError where the twin hides it. `_output_error` now sets `__suppress_context__` itself;
a `raise ... from <an exception>` in a compiled module would lose its cause the same way, and the
test below lists every `raise ... from` there so that a new one is seen.

The "no progress possible" state cannot be reached from a valid trace any more (the engine admits
what fits and rejects what does not); the tests reach it by taking the device pool's free pages
away behind the engine's back (a leak nothing will free), which is what a bug would do. Every case
runs in a subprocess, so that a crash fails the test instead of killing the test run.

The other `raise ... from ...` in the compiled modules: storage.py's four `_output_error(...) from
None` and `_storage_errors` (a storage tier that is a file, a full disk in either write, a truncated
page file) are below; controller.py's verify AssertionError (device pages differ after a load-back)
is a bug only a broken copy kernel reaches, not a user's input; pagepool.py and routing/registry.py
are not compiled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.reliability.harness import ROOMY, good_lines, tierdiag, write_trace
from tests.support.cli import cli_env, one_line_error
from tierdiag.engine import compiled

REPO = Path(__file__).resolve().parents[2]
MODES = ["compiled", "pure"]

# Run in a subprocess per engine mode: builds the case, raises it, and prints what came out.
PROBE = r'''
import errno, json, os, sys, tempfile, traceback
from pathlib import Path
import numpy as np
from tierdiag.engine import compiled

case = sys.argv[1]


def leak_device(engine, keep=2):
    """Every rank's device pool left with `keep` free pages that no event will ever free."""
    for rank in engine.ranks:
        dev = rank.scheduler.ctrl.device
        rank._leaked = dev.alloc(dev.free_pages - keep)


def stuck(dp):
    from tests.engine.helpers import PS, Collect, small_config
    from tierdiag.engine.engine import Engine
    from tierdiag.trace.reader import TraceRequest

    engine = Engine(small_config(dp=dp, device_tokens=16 * PS, host_tokens=32 * PS), probe=Collect())
    leak_device(engine)
    reqs = [TraceRequest(req_id=f"r{i}", seq=i, line=i + 1, arrival_ns=i * 1000, input_len=8 * PS + 1, output_len=4,
                         hash_ids=tuple(range(i * 10, i * 10 + 8)) + (10**9 + i,), tokens=None) for i in range(2)]
    engine.run(reqs)


def storage(kind, tmp):
    from tierdiag.engine import storage as st
    from tierdiag.engine.storage import StorageTier

    if kind == "not_a_folder":
        blocker = tmp / "afile"
        blocker.write_text("x")
        StorageTier(blocker / "below", 4)
    tier = StorageTier(tmp / "st", 30)
    buf = np.ones((2, 8, 4), dtype=np.int64)
    if kind in ("full_disk_rows", "full_disk_bytes"):
        # These raise sites are the caller's-thread writes: without the tier's page-writer thread
        # (its own failures, reported at the fence, are tests/engine/test_page_writer.py's).
        tier._writer = None
    if kind == "full_disk_rows":
        def full(fd, offset, rows, pages):
            raise OSError(errno.ENOSPC, "No space left on device")
        st._pwrite_rows = full
        tier.write_from(buf, [0, 1], [10, 11])
    if kind == "full_disk_bytes":
        st._pwrite_rows = lambda fd, offset, rows, pages: -1  # the numpy gather and pwrite loop
        def pwrite(fd, data, offset):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.pwrite = pwrite
        tier.write_from(buf, [0, 1], [10, 11])
    if kind == "truncated":
        tier.write_from(buf, [0, 1], [1, 2])
        tier.flush()  # the pwrite lands (the tier's thread) before the file is cut behind its back
        seg = next((tmp / "st").glob("*.kvseg"))
        with open(seg, "r+b") as fh:
            fh.truncate(tier.page_bytes + 8)
        tier.read_into([1, 2], np.zeros_like(buf), [3, 4])
    if kind == "read_fails":
        tier.write_from(buf, [0, 1], [1, 2])
        def eio(*args):
            raise OSError(errno.EIO, "Input/output error")
        st._pread_rows = eio
        tier.read_into([1, 2], np.zeros_like(buf), [3, 4])
    raise SystemExit("no error raised")


try:
    with tempfile.TemporaryDirectory() as tmp:
        if case == "bare":
            from tierdiag.engine.schedule_common import EngineError
            raise EngineError("made and raised directly")
        elif case.startswith("stuck_dp"):
            stuck(int(case[len("stuck_dp"):]))
        else:
            storage(case, Path(tmp))
    raise SystemExit("no error raised")
except SystemExit:
    raise
except BaseException as exc:
    from tierdiag.errors import TierdiagError
    print(json.dumps({
        "mode": compiled.describe()["mode"], "type": type(exc).__name__,
        "module": type(exc).__module__, "tierdiag_error": isinstance(exc, TierdiagError),
        "exit_code": int(getattr(exc, "exit_code", -1)),
        "line": exc.one_line() if isinstance(exc, TierdiagError) else str(exc),
        "cause": repr(exc.__cause__), "context": repr(exc.__context__),
        "suppress_context": exc.__suppress_context__,
        "traceback_lines": len(traceback.format_exception(exc)),
    }))
'''


def probe(case: str, mode: str) -> dict:
    env = cli_env(**({compiled.ENV: "1"} if mode == "pure" else {}))
    proc = subprocess.run([sys.executable, "-c", PROBE, case], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"{case} ({mode}): exit {proc.returncode} (-11: a segfault)\n{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["mode"] == mode, f"the {mode} engine did not run: {got['mode']}"
    return got


def needs(mode: str) -> None:
    if mode == "compiled" and not compiled.is_compiled():
        pytest.skip(f"the engine core is not compiled here: {compiled.describe()['why']}")


def test_engine_error_is_a_real_exception_on_every_build():
    """The class itself: an Exception subclass laid out as one (the bug: basicsize 24 < 72)."""
    from tierdiag.engine.schedule_common import EngineError
    from tierdiag.errors import EngineError as Defined, TierdiagError

    assert EngineError is Defined and issubclass(EngineError, TierdiagError)
    assert EngineError.__basicsize__ >= Exception.__basicsize__
    assert EngineError("x").__context__ is None and EngineError("x").one_line() == "x"


def test_no_class_in_the_compiled_modules_is_smaller_than_its_bases():
    """The general form of the bug, for any class a compiled module defines (mypyc lays out a
    class over a base it cannot see as a bare object): each is at least as large as every class
    above it."""
    import importlib

    for name in json.loads((REPO / "tierdiag/engine/_compiled.json").read_text())["sources"]:
        module = importlib.import_module(f"tierdiag.engine.{name}")
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                for base in cls.__mro__[1:]:
                    assert cls.__basicsize__ >= base.__basicsize__, f"{name}.{cls.__name__} < {base.__name__}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["bare", "stuck_dp1", "stuck_dp2"])
def test_engine_errors_raised_by_the_compiled_core(case, mode):
    """EngineError made directly, and the two "no progress possible" paths (Scheduler.run at
    --dp 1, Deployment.run at --dp 2): a clean exception, no cause, no garbage context."""
    needs(mode)
    got = probe(case, mode)
    assert got["type"] == "EngineError" and got["module"] == "tierdiag.errors" and got["tierdiag_error"]
    assert got["cause"] == "None" and got["context"] == "None"
    assert got["exit_code"] == 1 and "\n" not in got["line"]
    if case != "bare":
        rank = " on rank 0" if case == "stuck_dp2" else ""
        assert got["line"].startswith(f"no progress possible: request r0 waits{rank} for device memory")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["not_a_folder", "full_disk_rows", "full_disk_bytes", "truncated", "read_fails"])
def test_the_storage_tiers_raise_from_none_sites(case, mode):
    """storage.py's `raise _output_error(exc, path) from None` (a write through the C rows, the
    byte loop, a read, the tier's folder) and `_storage_errors`: an OutputError (exit 6) naming
    the tier, its cause None and its context suppressed (or none: the truncated read's own raise)."""
    needs(mode)
    got = probe(case, mode)
    assert got["type"] == "OutputError" and got["exit_code"] == 6, got
    assert got["cause"] == "None" and (got["suppress_context"] or got["context"] == "None"), got
    assert got["line"].startswith("cannot use the storage tier at "), got


LEAK = r'''
import sys
from tierdiag.engine import pagepool
init = pagepool.PagePool.__init__


def leaky(self, name, num_pages, plane, *, on_device):
    """A device pool whose pages, but 2, are taken by nobody the engine knows: the bug "no
    progress possible" guards against."""
    init(self, name, num_pages, plane, on_device=on_device)
    if on_device:
        self._leaked = self.alloc(self.free_pages - 2)


pagepool.PagePool.__init__ = leaky
from tierdiag.cli.main import main
main()
'''


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp", [1, 2])
def test_no_progress_through_the_cli_is_one_line_exit_1_and_keeps_the_stores_runs(tmp_path, mode, dp):
    """`tierdiag replay` whose engine can make no progress: exit 1 (a bug in tierdiag, section
    7), one line naming it, no traceback, no crash; the run recorded before it in the same store
    is still there, whole."""
    needs(mode)
    trace = write_trace(tmp_path / "t.jsonl", good_lines(6))
    db = tmp_path / "s.duckdb"
    env = cli_env(**({compiled.ENV: "1"} if mode == "pure" else {}))
    assert tierdiag("replay", trace, "--db", db, *ROOMY, "--run-name", "kept", env=env).code == 0
    proc = subprocess.run([sys.executable, "-c", LEAK, "replay", str(trace), "--db", str(db), *ROOMY,
                           "--dp", str(dp), "--run-name", "stuck"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    line = one_line_error(proc.returncode, proc.stderr, 1, "no progress possible", "waits")
    assert "Segmentation" not in proc.stderr, line
    with duckdb.connect(str(db), read_only=True) as con:
        runs = dict(con.execute("SELECT name, status FROM runs").fetchall())
        kept = con.execute("SELECT count(*) FROM requests JOIN runs USING (run_id) WHERE name = 'kept'").fetchone()[0]
    assert runs["kept"] == "complete" and kept == 6
    assert runs["stuck"] == "failed", runs  # docs/contract.md: what it recorded before is kept


# Every `raise ... from` in the compiled modules, and the case above that raises it.
RAISE_FROM = {
    ("storage", "_storage_errors"): "not_a_folder",
    ("storage", "_write_all"): "full_disk_bytes",
    ("storage", "_append_rows"): "full_disk_rows",
    ("storage", "_read_into_rows"): "read_fails",
}


def test_every_raise_from_in_the_compiled_modules_is_a_case_here():
    """mypyc drops the `from` of a raise (module doc): every one in a compiled module is listed
    with the case that raises it, `from None` only (a real cause would be lost on the compiled
    build: give the error what it needs instead). controller.py's verify AssertionError and
    pagepool's are not `from` raises of compiled code a user reaches (see the module doc)."""
    import ast

    found = {}
    for name in json.loads((REPO / "tierdiag/engine/_compiled.json").read_text())["sources"]:
        path = REPO / "tierdiag" / "engine" / (name.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Raise) and node.cause is not None:
                        assert isinstance(node.cause, ast.Constant) and node.cause.value is None, \
                            f"{name}.{fn.name}:{node.lineno}: raise ... from an exception (its cause is lost compiled)"
                        found[(name, fn.name)] = found.get((name, fn.name), 0) + 1
    assert set(found) == set(RAISE_FROM), found
