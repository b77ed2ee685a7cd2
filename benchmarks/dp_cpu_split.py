"""The `--dp 8` row's whole-process CPU split against `--dp 1` (issue 41's dp row: targets41's
`replay TRACE --dp 8 --router cache_aware` / the probed `--dp 1` replay, whole processes).

    .venv/bin/python benchmarks/dp_cpu_split.py [--trace FILE] [--rounds N] [--code DIR ...]

Each round runs the probed replay (TIERDIAG_WRITER=process, a fresh store) at `--dp 1` and at
`--dp 8 --router cache_aware` for every checkout of `--code` (default: this one), the order
flipped every round, under probe_cpu_timeline.py's launcher (probe_timeline.py's hook, its marks
carrying the process's CPU). For each run, in CPU seconds (user + sys):

    whole    the replay process and every child it reaped (what `/usr/bin/time` reports)
    start    the engine process's interpreter start to `Engine.run` (imports, the writer's spawn,
             the ranks built)
    run      `Engine.run`
    close    `Engine.run`'s end to the replay's return (the wait for the writer's close)
    exit     the return to the engine process's exit
    writer   the writer process, its start to its exit hook
    rest     whole - engine process - writer: what neither process's hook saw (the writer's own
             teardown after its hook, the launcher's `python -c`)
    sys      the whole tree's system CPU; faults_k its minor page faults (thousands); each also
             for the engine process and the writer (at their exit hooks); rss_mb_engine the
             engine process's peak RSS (MiB)

then medians by code and dp, and dp 8 - dp 1 per column. On a loaded machine the CPU columns are
the measure, the walls are not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_cpu_timeline as pct  # noqa: E402
import probe_timeline as pt  # noqa: E402

DEFAULT_TRACE = pt.ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
COLUMNS = ("whole", "start", "run", "close", "exit", "writer", "rest", "sys", "sys_engine", "sys_writer", "faults_k",
           "faults_k_engine", "faults_k_writer", "rss_mb_engine", "wall")
DP = {"dp1": [], "dp8": ["--dp", "8", "--router", "cache_aware"]}


_DUMP_OLD = '"maxrss_kb": ru.ru_maxrss}'
_DUMP_NEW = '"maxrss_kb": ru.ru_maxrss, "sys_s": ru.ru_stime, "minflt": ru.ru_minflt}'


def hook_code() -> str:
    """probe_cpu_timeline's hook, each process's exit record with its system CPU and minor faults."""
    code = pct.hook_code()
    if code.count(_DUMP_OLD) != 1:
        raise SystemExit(f"probe_timeline's hook changed: {_DUMP_OLD!r} not found once")
    return code.replace(_DUMP_OLD, _DUMP_NEW)


def run_once(code: Path, trace: Path, tmp: Path, tag: str, extra: list[str]) -> dict:
    db = tmp / f"{tag}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code), "TL_ROLE": "main", "TL_OUT": str(tmp / f"{tag}-main.json"),
           "TL_PROF": "", "TL_HOOK_CODE": hook_code(), "TL_HOOKS_MAIN": json.dumps(pt.HOOKS_MAIN),
           "TL_HOOKS_WRITER": json.dumps(pt.HOOKS_WRITER), "TL_WRITER_ENTRY": pt._writer_entry(tmp, tag, False),
           "TL_REAL_ENTRY": "from tierdiag.app.writer_child import main; main()", "TIERDIAG_WRITER": "process"}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    _, wall, cpu_all, _, main, writer = pt.launch(code, ["replay", str(trace), "--json", "--db", str(db), *extra],
                                                  env, tmp, tag)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for name, _t, cpu, _thread in main["marks"]:
        first.setdefault(name, cpu)
        last[name] = cpu
    out = {"whole": cpu_all, "writer": writer["cpu_s"] if writer else 0.0, "wall": wall,
           "sys": r1.ru_stime - r0.ru_stime, "faults_k": (r1.ru_minflt - r0.ru_minflt) / 1000}
    for phase, a, b in pct.PHASES:
        out[phase] = last[b] - first[a] if a in first and b in last else float("nan")
    out["rest"] = cpu_all - main["cpu_s"] - out["writer"]
    out["sys_engine"], out["faults_k_engine"] = main["sys_s"], main["minflt"] / 1000
    out["sys_writer"], out["faults_k_writer"] = (writer["sys_s"], writer["minflt"] / 1000) if writer else (0.0, 0.0)
    out["rss_mb_engine"] = main["maxrss_kb"] / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--code", type=Path, action="append", help="a built checkout (repeatable; default: this one)")
    a = ap.parse_args()
    codes = [c.resolve() for c in (a.code or [pt.ROOT])]
    runs: dict[tuple[str, str], list[dict]] = {(str(c), d): [] for c in codes for d in DP}
    with tempfile.TemporaryDirectory(prefix="tierdiag-dp-split-") as td:
        tmp = Path(td)
        for rnd in range(a.rounds):
            order = [(c, d) for c in codes for d in DP]
            if rnd % 2:
                order.reverse()
            for code, dp in order:
                r = run_once(code, a.trace.resolve(), tmp, f"{dp}{rnd}", DP[dp])
                runs[(str(code), dp)].append(r)
                print(f"round {rnd + 1} {code} {dp}: " + " ".join(f"{k} {r[k]:.3f}" for k in COLUMNS),
                      file=sys.stderr, flush=True)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    print(f"load average at the end: {load}; medians of {a.rounds} interleaved rounds (CPU s; faults in thousands)\n")
    print("| code | dp | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for code in codes:
        med = {d: {k: statistics.median(r[k] for r in runs[(str(code), d)]) for k in COLUMNS} for d in DP}
        for d in DP:
            print(f"| {code} | {d} | " + " | ".join(f"{med[d][k]:.3f}" for k in COLUMNS) + " |")
        print(f"| {code} | dp8 - dp1 | " + " | ".join(f"{med['dp8'][k] - med['dp1'][k]:+.3f}" for k in COLUMNS) + " |")
        pairs = [b["whole"] / x["whole"] for b, x in zip(runs[(str(code), "dp8")], runs[(str(code), "dp1")])]
        print(f"| {code} | dp8 / dp1 whole CPU, each round | " + " ".join(f"{p:.3f}" for p in pairs) + " |")


if __name__ == "__main__":
    main()
