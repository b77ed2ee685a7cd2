"""The engine process of a replay, exec to exit, by phase: wall and CPU of each, probed against
`--no-probes` (issue 41's floor and probe-overhead rows, the engine process's side).

    .venv/bin/python benchmarks/probe_cpu_timeline.py TRACE [--rounds N] [-- REPLAY OPTIONS...]

Each round runs `tierdiag replay TRACE --json` twice, with probes (TIERDIAG_WRITER=process, a
fresh store) and with `--no-probes`, the order flipped every round, under probe_timeline.py's
launcher (its import hook: nothing is imported earlier than the command would), whose marks here
also carry the process's CPU (all its threads, `time.process_time`) and the main thread's
(`time.thread_time`) at each mark. Phases of the engine's process, from its marks:

    start   the interpreter's start to `Engine.run` (imports, the first line read, the writer's
            spawn, the run's row handed to the writer, the engine built)
    run     `Engine.run` (the requests; with probes their rows and the hand-overs)
    close   `Engine.run`'s end to the replay's return (the last hand-over, the wait for the
            writer's close: its last write, the run evidence, the closing numbers)
    exit    the replay's return to the process's exit (the result printed; with probes the
            writer's let-go of the file and its exit, reaped at this exit)

Printed: per mode and phase the medians of wall and of process CPU, then probed minus unprobed;
the writer process's own CPU beside. On a loaded machine the CPU columns are the measure (a wall
there is mostly other work's); the ratio of each round's pair is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_timeline as pt  # noqa: E402  (benchmarks/probe_timeline.py: the launcher and its hooks)

_MARK_OLD = "def mark(name): _marks.append((name, time.monotonic()))"
_MARK_NEW = "def mark(name): _marks.append((name, time.monotonic(), time.process_time(), time.thread_time()))"
_START_OLD = '_marks = [("start", _T)]'
_START_NEW = '_marks = [("start", _T, time.process_time(), time.thread_time())]'

PHASES = (("start", "start", "engine_run>"), ("run", "engine_run>", "engine_run<"),
          ("close", "engine_run<", "replay<"), ("exit", "replay<", "exit"))


def hook_code() -> str:
    code = pt._HOOK
    for old in (_MARK_OLD, _START_OLD):
        if code.count(old) != 1:
            raise SystemExit(f"probe_timeline's hook changed: {old!r} not found once")
    return code.replace(_MARK_OLD, _MARK_NEW).replace(_START_OLD, _START_NEW)


def run_once(trace: Path, tmp: Path, tag: str, probes: bool, extra: list[str]) -> dict:
    db = tmp / f"{tag}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(pt.ROOT), "TL_ROLE": "main", "TL_OUT": str(tmp / f"{tag}-main.json"),
           "TL_PROF": "", "TL_HOOK_CODE": hook_code(), "TL_HOOKS_MAIN": json.dumps(pt.HOOKS_MAIN),
           "TL_HOOKS_WRITER": json.dumps(pt.HOOKS_WRITER), "TL_WRITER_ENTRY": pt._writer_entry(tmp, tag, False),
           "TL_REAL_ENTRY": "from tierdiag.app.writer_child import main; main()", "TIERDIAG_WRITER": "process"}
    args = ["replay", str(trace), "--json", *extra] + (["--db", str(db)] if probes else ["--no-probes"])
    _, wall, cpu_all, _, main, writer = pt.launch(pt.ROOT, args, env, tmp, tag)
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    first: dict[str, tuple[float, float, float]] = {}
    last: dict[str, tuple[float, float, float]] = {}
    for name, t, cpu, thread in main["marks"]:
        first.setdefault(name, (t, cpu, thread))
        last[name] = (t, cpu, thread)
    phases = {}
    for phase, a, b in PHASES:
        if a in first and b in last:
            phases[phase] = (last[b][0] - first[a][0], last[b][1] - first[a][1], last[b][2] - first[a][2])
    return {"wall_s": wall, "cpu_all_s": cpu_all, "cpu_main_s": main["cpu_s"],
            "cpu_writer_s": writer["cpu_s"] if writer else 0.0, "phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="more replay options (after --)")
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {"probes": [], "none": []}
    with tempfile.TemporaryDirectory(prefix="tierdiag-cpu-timeline-") as td:
        tmp = Path(td)
        for rnd in range(a.rounds):
            order = ("probes", "none") if rnd % 2 == 0 else ("none", "probes")
            for mode in order:
                r = run_once(a.trace, tmp, f"{mode}{rnd}", mode == "probes", a.extra)
                runs[mode].append(r)
                ph = " ".join(f"{k} {w:.3f}/{c:.3f}" for k, (w, c, _) in r["phases"].items())
                print(f"round {rnd + 1} {mode:>6}: wall {r['wall_s']:.3f} s, CPU main {r['cpu_main_s']:.3f} "
                      f"writer {r['cpu_writer_s']:.3f} s; phases wall/CPU: {ph}", file=sys.stderr, flush=True)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    print(f"\nload average at the end: {load}; medians of {a.rounds} interleaved rounds (s)\n")
    print(f"{'phase':>8} {'probes wall':>12} {'CPU':>7} {'none wall':>10} {'CPU':>7} {'extra wall':>11} {'CPU':>7}")
    for phase, _, _ in PHASES:
        cols = []
        for mode in ("probes", "none"):
            got = [r["phases"][phase] for r in runs[mode] if phase in r["phases"]]
            cols.append((statistics.median(g[0] for g in got), statistics.median(g[1] for g in got))
                        if got else (0.0, 0.0))
        (pw, pc), (nw, nc) = cols
        print(f"{phase:>8} {pw:12.3f} {pc:7.3f} {nw:10.3f} {nc:7.3f} {pw - nw:+11.3f} {pc - nc:+7.3f}")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_main_s", "cpu_writer_s")}
           for m, rs in runs.items()}
    print(f"{'process':>8} {med['probes']['wall_s']:12.3f} {med['probes']['cpu_main_s']:7.3f} "
          f"{med['none']['wall_s']:10.3f} {med['none']['cpu_main_s']:7.3f} "
          f"{med['probes']['wall_s'] - med['none']['wall_s']:+11.3f} "
          f"{med['probes']['cpu_main_s'] - med['none']['cpu_main_s']:+7.3f}")
    print(f"writer process CPU (probes): {med['probes']['cpu_writer_s']:.3f} s")
    pairs = [p["cpu_main_s"] / n["cpu_main_s"] for p, n in zip(runs["probes"], runs["none"])]
    print("engine process CPU, probes / none, each round's pair: " + " ".join(f"{x:.3f}" for x in pairs)
          + f" (median {statistics.median(pairs):.3f})")


if __name__ == "__main__":
    main()
