"""The writer process's close at an engine's pace (issue 41's probe overhead: the close is on the
path the replay waits for; session 39 h49close): a replay's hand-overs, captured once, handed to
a fresh writer process of each code at a chosen pace, so that "the engine faster than the writer"
(a quiet machine) is had on any machine.

    .venv/bin/python benchmarks/writer_pace.py capture TRACE OUT.pkl [-- REPLAY OPTIONS...]
    .venv/bin/python benchmarks/writer_pace.py run OUT.pkl [--baseline DIR] [--rounds N]
        [--span 0,0.5,1,2] [--set NAME=VALUE ...] [--json FILE]

`capture`: `tierdiag replay TRACE --db FRESH --json` (TIERDIAG_WRITER=process) with the writer's
entry (app/writer_child.ENTRY) swapped for one that records every frame its reader thread reads
(writer_serve.read_raw: its bytes and time) and saves them at the close.

`run`: per round, per span, per code (interleaved, the order flipping every round): the replay's
writer process (app/writer_child's entry, its close hook: the run evidence) started from the
code's folder, handed the captured frames (the open's store swapped for a fresh one) with their
captured gaps scaled so that the last (the engine's close) comes `span` seconds after the spawn
(0: as fast as the pipe takes them, an engine far ahead of the writer), after `--head-start` s
(a writer spawned that much sooner than the replay spawns it). Printed: the close's wall
as the engine waits for it (the finish frame written -> the "finished" answer read), the rows
(every table) the close found pending and the writes before it (the writer's `_Serve.write` and
`_Serve.finish` wrapped: their times from the finish frame, the request share taken, the rows
pending, the inbox), the writer's CPU (wait4 at its exit), the inbox's most; medians (min..max).
`--set writer_serve.NAME=VALUE` sets a module constant in this tree's writer only (e.g. LATE_FROM:
the base runs as it is, so `--baseline` with the same code is an A/B of the setting).
The writer's own speed still moves with the machine's load: say the load beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CAPTURE_ENTRY = r"""
import os, pickle, time
from tierdiag.store import writer_serve as _ws
_log = [("spawn", time.monotonic(), None)]
_rr = _ws.read_raw
def _read_raw(fd):
    b = _rr(fd)
    _log.append(("frame", time.monotonic(), None if b is None else bytes(b)))
    return b
_ws.read_raw = _read_raw
_fin = _ws._Serve.finish
def _finish(self, arg):
    with open(os.environ["H49_CAPTURE"], "wb") as fh:
        pickle.dump(_log, fh, protocol=5)
    return _fin(self, arg)
_ws._Serve.finish = _finish
from tierdiag.app.writer_child import main; main()
"""

# The writer under `run`: the replay's own entry, its serve loop's writes and close recorded.
_RUN_ENTRY = r"""
import json, os, time
from tierdiag.store import writer_serve as _ws
for _k, _v in json.loads(os.environ.get("H49_SET", "{}")).items():
    setattr(_ws, _k, _v)
_sched = []
def _state(self, kind):
    ib = self.inbox
    return {"kind": kind, "at": time.monotonic(), "taken": getattr(self, "taken", None),
            "expected": getattr(self, "expected", None), "rows": getattr(self, "rows_pending", None),
            "inbox_b": ib.held(), "inbox_n": len(ib._items)}
def _wrap(name, kind):
    fn = getattr(_ws._Serve, name)
    def w(self, *a, **k):
        ev = _state(self, kind); c = time.thread_time()
        try:
            return fn(self, *a, **k)
        finally:
            ev["wall"] = time.monotonic() - ev["at"]; ev["cpu"] = time.thread_time() - c; _sched.append(ev)
            if kind == "close":
                with open(os.environ["H49_SCHED"], "w") as fh:
                    json.dump({"sched": _sched, "inbox_most": self.inbox.most}, fh)
    setattr(_ws._Serve, name, w)
_wrap("write", "write")
_wrap("finish", "close")
from tierdiag.app.writer_child import main; main()
"""


def capture(trace: Path, out: Path, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="tierdiag-pace-") as td:
        db = Path(td) / "cap.duckdb"
        code = ("import sys; import tierdiag.app.writer_child as wc; wc.ENTRY = " + repr(_CAPTURE_ENTRY)
                + "; from tierdiag.cli.main import entry; sys.argv = ['tierdiag'] + sys.argv[1:]; entry()")
        env = {**os.environ, "TIERDIAG_WRITER": "process", "H49_CAPTURE": str(out), "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", code, "replay", str(trace), "--db", str(db), "--json", *extra],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    log = pickle.loads(out.read_bytes())
    frames = [e for e in log if e[0] == "frame"]
    print(f"captured {len(frames)} frames, {sum(len(b or b'') for _, _, b in frames) / 2**20:.1f} MB, "
          f"{frames[-1][1] - log[0][1]:.2f} s from the writer's start to the close")


def _frames(path: Path, db: Path) -> tuple[list[tuple[float, bytes]], float]:
    """The captured frames (time from the writer's start, body), the open's store swapped."""
    from tierdiag.store.frames import encode, loads

    log = pickle.loads(path.read_bytes())
    t0 = log[0][1]
    out = []
    for _, t, body in log[1:]:
        if body is None:
            continue
        if len(body) < 65536:
            kind, arg = loads(body)
            if kind == "open":
                arg["writer"]["db_path"] = str(db)
                prefix, data, *views = encode((kind, arg))
                body = bytes(prefix[8:] + data) + b"".join(bytes(v) for v in views)  # the length header is ours
        out.append((t - t0, body))
    return out, out[-1][0]


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _cpu_ns(pid: int) -> tuple[int, int]:
    """The CPU a process has had, ns: all its threads' (/proc's stat, ended threads included: in
    clock ticks), and its main thread's (schedstat)."""
    with open(f"/proc/{pid}/stat") as fh:
        raw = fh.read()
    f = raw[raw.rindex(")") + 2:].split()
    total = (int(f[11]) + int(f[12])) * 10**9 // os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/task/{pid}/schedstat") as fh:
        main = int(fh.read().split()[0])
    return total, main


def _feed(out: int, frames: list, t_start: float, scale: float) -> None:
    for t, body in frames:
        wait = t_start + t * scale - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        _write_all(out, struct.pack("<Q", len(body)))
        _write_all(out, body)


def run_once(root: Path, frames: list[tuple[float, bytes]], last: float, span: float, tmp: Path,
             settings: dict, head: float = 0.0) -> dict:
    from tierdiag.store.frames import EOF, read_frame

    sched = tmp / "sched.json"
    sched.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "H49_SCHED": str(sched), "H49_SET": json.dumps(settings)}
    err = open(tmp / "writer.err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", _RUN_ENTRY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, bufsize=0, cwd=root, env=env, close_fds=True)
    t_spawn = time.monotonic()
    out, inp = proc.stdin.fileno(), proc.stdout.fileno()
    try:
        import fcntl

        fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass
    answers: list = []
    cpu: list = []  # the writer's CPU (all threads, its main thread) at the engine's close, at the answer

    def read() -> None:
        while True:
            msg = read_frame(inp)
            answers.append((time.monotonic(), msg))
            if isinstance(msg, tuple) and msg[0] == "finished":
                cpu.append(_cpu_ns(proc.pid))
            if msg is EOF:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    scale = span / last if last > 0 else 0.0
    try:
        _feed(out, frames, t_spawn + head, scale)
    except BrokenPipeError:
        err.seek(0)
        raise RuntimeError("the writer died: " + err.read()[-3000:]) from None
    t_finish = time.monotonic()
    cpu.insert(0, _cpu_ns(proc.pid))
    reader.join()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.stdin.close()
    proc.stdout.close()
    finished = [t for t, m in answers if isinstance(m, tuple) and m[0] == "finished"]
    errors = [m for _, m in answers if isinstance(m, tuple) and m[0] in ("error", "open_failed")]
    if not finished or errors or status != 0:
        raise RuntimeError(f"the writer did not finish: {errors or status}")
    s = json.loads(sched.read_text())
    evs = s["sched"]
    for ev in evs:
        ev["at"] -= t_finish
    close = [e for e in evs if e["kind"] == "close"][-1]
    (all0, main0), (all1, main1) = cpu[0], cpu[1]
    return {"close_wall": finished[0] - t_finish, "close_rows": close["rows"],
            "close_cpu": (all1 - all0) / 1e9, "close_main_cpu": (main1 - main0) / 1e9,
            "writes": sum(e["kind"] == "write" for e in evs), "writer_cpu": ru.ru_utime + ru.ru_stime,
            "inbox_most_mb": s["inbox_most"] / 2**20,
            "engine_span": t_finish - t_spawn - head, "sched": evs}


def _sched_line(evs: list) -> str:
    out = []
    for ev in evs:
        share = f"{ev['taken'] / ev['expected']:.0%}" if ev.get("expected") else f"{ev.get('taken')}"
        out.append(f"{ev['kind']} {ev['at']:+.2f} s @{share} {ev['rows']} rows inbox "
                   f"{ev['inbox_b'] / 2**20:.1f} MB {ev['wall'] * 1e3:.0f}/{ev['cpu'] * 1e3:.0f} ms")
    return "; ".join(out)


KEYS = ("close_wall", "close_cpu", "close_main_cpu", "close_rows", "writes", "writer_cpu", "inbox_most_mb",
        "engine_span")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("trace", type=Path)
    c.add_argument("out", type=Path)
    r = sub.add_parser("run")
    r.add_argument("capture", type=Path)
    r.add_argument("--baseline", type=Path, default=None, help="a built checkout, run in the same rounds")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--span", default="0,1", help="seconds from the writer's spawn to the engine's close, several")
    r.add_argument("--head-start", default="0", help="seconds the writer is spawned before the captured "
                   "timeline begins (a writer spawned sooner), several: each a run")
    r.add_argument("--set", action="append", default=[], help="writer_serve.NAME=VALUE (JSON value), this tree's writer only")
    r.add_argument("--quiet", action="store_true", help="no line per run")
    r.add_argument("--json", type=Path, default=None)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if a.cmd == "capture":
        capture(a.trace, a.out, extra)
        return
    settings = {}
    for s in a.set:
        name, value = s.split("=", 1)
        settings[name.removeprefix("writer_serve.")] = json.loads(value)
    spans = [float(x) for x in a.span.split(",")]
    roots = [("this", ROOT)] + ([("base", a.baseline)] if a.baseline else [])
    heads = [float(x) for x in a.head_start.split(",")]
    got: dict[tuple[str, float, float], list] = {(n, s, h): [] for s in spans for h in heads for n, _ in roots}
    with tempfile.TemporaryDirectory(prefix="tierdiag-pace-") as td:
        tmp = Path(td)
        for rnd in range(a.rounds):
            for span, head in [(s, h) for s in spans for h in heads]:
                for name, root in (roots if rnd % 2 == 0 else roots[::-1]):
                    db = tmp / f"{name}.duckdb"
                    for p in (db, Path(str(db) + ".wal")):
                        p.unlink(missing_ok=True)
                    frames, last = _frames(a.capture, db)
                    res = run_once(root, frames, last, span, tmp, settings if name == "this" else {}, head)
                    got[(name, span, head)].append(res)
                    if not a.quiet:
                        print(f"round {rnd + 1} span {span} head {head} {name}: close {res['close_wall'] * 1e3:.0f} ms "
                              f"(CPU {res['close_cpu'] * 1e3:.0f} ms, main thread {res['close_main_cpu'] * 1e3:.0f}), "
                              f"{res['close_rows']} rows at the close, {res['writes']} writes, writer CPU "
                              f"{res['writer_cpu']:.2f} s, inbox most {res['inbox_most_mb']:.1f} MB, fed in "
                              f"{res['engine_span']:.2f} s\n   " + _sched_line(res["sched"]), flush=True)
    with open("/proc/loadavg") as fh:
        print("load average at the end:", " ".join(fh.read().split()[:3]))
    for (name, span, head), rs in got.items():
        def rng(k: str) -> str:
            v = [r[k] for r in rs]
            return f"{statistics.median(v):.3f} ({min(v):.3f}..{max(v):.3f})"
        print(f"span {span} head {head} {name}: " + ", ".join(f"{k} {rng(k)}" for k in KEYS))
    if a.json:
        a.json.write_text(json.dumps({f"{n}@{s}+{h}": rs for (n, s, h), rs in got.items()}, indent=1))


if __name__ == "__main__":
    main()
