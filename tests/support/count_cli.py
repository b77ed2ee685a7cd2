"""A pytest plugin for a map of the suite's cost, not a test: `-p tests.support.count_cli` with
TIERDIAG_COUNT_CLI=FOLDER logs, one JSON line a event into FOLDER/<worker>.jsonl, every `tierdiag`
CLI subprocess a test starts (`Popen` of `tests/support/cli.py`'s entry, or of the console
script) and every replay run in the test's own process (`tierdiag.app.replay._replay`: a trace,
its options), with the test that did it. `python -m tests.support.count_cli FOLDER` prints the
counts: subprocesses by file, and replays repeated with the same trace and options.

Used by hand to find what to move in process or share (benchmarks/README.md, session 29,
h41tests16); without TIERDIAG_COUNT_CLI it does nothing."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ENV = "TIERDIAG_COUNT_CLI"
# The folder, read once at configure: a CLI run in this process (tests/support/cli.py) swaps the
# whole environment for the call's, which holds no TIERDIAG_* setting.
_current = {"test": None, "folder": None}


def _log(event: dict) -> None:
    folder = _current["folder"]
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(folder) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps({"test": _current["test"], **event}) + "\n")


def _cli_args(args) -> list[str] | None:
    """The CLI's arguments when `args` starts the tierdiag CLI, else None."""
    if isinstance(args, (str, bytes)) or not args:
        return None
    argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    for i, a in enumerate(argv):
        if "tierdiag.cli.main import main" in a:
            return argv[i + 1:]
        if i == 0 and Path(a).name == "tierdiag":
            return argv[1:]
    return None


def _trace_key(trace) -> str:
    try:
        return hashlib.sha256(Path(trace).read_bytes()).hexdigest()[:12]
    except OSError:
        return str(trace)


def pytest_configure(config) -> None:
    if not os.environ.get(ENV):
        return
    _current["folder"] = os.environ[ENV]
    init = subprocess.Popen.__init__

    def counted_init(self, args, *a, **kw):
        cli = _cli_args(args)
        if cli is not None:
            _log({"kind": "subprocess", "args": cli})
        init(self, args, *a, **kw)

    subprocess.Popen.__init__ = counted_init
    from tierdiag.app import replay as app_replay

    inner = app_replay._replay

    def counted_replay(trace, cfg, **kw):
        _log({"kind": "replay", "trace": _trace_key(trace), "config": json.dumps(cfg.to_json(), sort_keys=True,
                                                                                 default=str),
              "probes": kw.get("probes"), "db": kw.get("db") is not None})
        return inner(trace, cfg, **kw)

    app_replay._replay = counted_replay


def pytest_runtest_setup(item) -> None:
    _current["test"] = item.nodeid


def pytest_runtest_teardown(item) -> None:
    _current["test"] = item.nodeid


def main(folder: str) -> None:
    events = [json.loads(line) for f in sorted(Path(folder).glob("*.jsonl")) for line in f.read_text().splitlines()]
    by_file = collections.Counter((e["test"] or "?").split("::")[0] for e in events if e["kind"] == "subprocess")
    print(f"CLI subprocesses: {sum(by_file.values())}")
    for name, n in by_file.most_common():
        print(f"  {n:4d} {name}")
    replays = [e for e in events if e["kind"] == "replay"]
    same = collections.defaultdict(list)
    for e in replays:
        same[(e["trace"], e["config"], e["probes"], e["db"])].append(e["test"] or "?")
    print(f"replays in process: {len(replays)}; repeated keys:")
    for key, tests in sorted(same.items(), key=lambda kv: -len(kv[1])):
        if len(tests) > 1:
            files = collections.Counter(t.split("::")[0] for t in tests)
            print(f"  {len(tests):4d} x trace {key[0]} probes={key[2]} db={key[3]}: {dict(files)}")


if __name__ == "__main__":
    main(sys.argv[1])
