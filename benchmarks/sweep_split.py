"""A `tierdiag sweep --jobs 2` split by process and step: its timeline and CPU (h47sweep).

    .venv/bin/python benchmarks/sweep_split.py [--roots A,B] [--repeats 3] [--singles] [--lines 1000]

The sweep is targets41.py's row: the conversation trace's first --lines requests, host_tokens
2M,8M x write_policy write_through,write_back, `--jobs 2`, a fresh --db each time, through the
same launcher (benchmarks/scale.py: the command's own wall). Every Python process of it (the
driver, the fork server, the workers it forks; with --singles the four `tierdiag replay`s and
their writer processes) loads benchmarks/sweep_split/sitecustomize.py, which logs named steps
with wall time, process and thread CPU. Roots are run interleaved (A B, then B A), each tree's
own code (PYTHONPATH). Prints, per root, medians over the repeats of: each step's wall from the
driver's start; each process's CPU; the workers' replay phases.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale  # noqa: E402
import targets41  # noqa: E402

SITE = HERE / "sweep_split"


def run_one(root: Path, args: list, log: Path) -> dict:
    env_before = dict(os.environ)
    os.environ["SWEEP_SPLIT_LOG"] = str(log)
    os.environ["PYTHONPATH"] = str(SITE)
    try:
        r = scale.run(args, root=root)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return r


def read_log(log: Path, wait_for_forkserver: bool) -> list[dict]:
    # The fork server outlives the driver by a moment (it sees its pipe close): wait for its exit.
    for _ in range(50):
        events = [json.loads(line) for line in log.read_text().splitlines()]
        if not wait_for_forkserver or any(e["role"] == "forkserver" and e["step"] == "process:exit" for e in events):
            return events
        time.sleep(0.1)
    return events


def split_sweep(events: list[dict]) -> dict[str, float]:
    """Named numbers of one sweep: walls from the driver's start, CPU seconds by process."""
    driver = [e for e in events if e["role"] == "driver"]
    t0 = next(e for e in driver if e["step"] == "process:start")["started"]
    out: dict[str, float] = {}

    def at(name: str, e: dict) -> None:
        out[f"wall {name}"] = e["t"] - t0

    first_warm = next((e for e in driver if e["step"].endswith("warm_up_workers:begin")), None)
    if first_warm is not None:
        at("driver first warm_up_workers", first_warm)
        out["cpu driver to first warm_up_workers"] = first_warm["cpu"]
    for e in driver:
        step = e["step"]
        if step in ("process:start",):
            at("driver site", e)
        elif step in ("warm_up_workers:begin", "warm_up_workers:end", "_check_trace:end", "open_destination:end",
                      "_run_processes:begin", "compare_sweep:begin", "compare_sweep:end", "run_configs:end",
                      "process:exit"):
            at("driver " + step, e)
    merges = [e for e in driver if e["step"].startswith("_merge:")]
    for i, (b, end) in enumerate(zip(merges[::2], merges[1::2])):
        at(f"driver merge {i} begin", b)
        out[f"cpu driver merge {i}"] = end["thread_cpu"] - b["thread_cpu"]
        out[f"wall driver merge {i}"] = end["t"] - b["t"]
    exit_ = next(e for e in driver if e["step"] == "process:exit")
    out["cpu driver"] = exit_["cpu"]
    rc = next((e for e in driver if e["step"] == "run_configs:begin"), None)
    if rc is not None:
        out["cpu driver to run_configs"] = rc["cpu"]
    fs = [e for e in events if e["role"] == "forkserver"]
    for e in fs:
        if e["step"] in ("process:start", "preload:begin", "preload:end"):
            at("forkserver " + e["step"], e)
        if e["step"] == "preload:end":
            out["cpu forkserver preload"] = e["cpu"]
            out["n forkserver page faults at fork"] = e["minflt"]
    fs_exit = next((e for e in fs if e["step"] == "process:exit"), None)
    if fs_exit is not None:
        out["cpu forkserver own"] = fs_exit["cpu"]
    workers = defaultdict(list)
    for e in events:
        if e["role"] == "worker":
            workers[e["pid"]].append(e)
    for i, (pid, evs) in enumerate(sorted(workers.items(), key=lambda kv: kv[1][0]["t"])):
        fork = next(e for e in evs if e["step"] == "worker:fork")
        at(f"worker {i} fork", fork)
        runs = [e for e in evs if e["step"].startswith("replay_one:")]
        for j, (b, end) in enumerate(zip(runs[::2], runs[1::2])):
            at(f"worker {i} replay {j} begin", b)
            at(f"worker {i} replay {j} end", end)
            out[f"cpu worker {i} replay {j}"] = end["cpu"] - b["cpu"]
        writes = [e for e in evs if e["step"].startswith("RunWriter.write:")]
        out[f"cpu worker {i} writes"] = sum(end["thread_cpu"] - b["thread_cpu"] for b, end in zip(writes[::2], writes[1::2]))
        out[f"n worker {i} writes"] = len(writes) // 2
        opens = [e for e in evs if e["step"].startswith("RunWriter.__init__:")]
        out[f"cpu worker {i} opens"] = sum(end["thread_cpu"] - b["thread_cpu"] for b, end in zip(opens[::2], opens[1::2]))
        fins = [e for e in evs if e["step"].startswith("RunWriter.finish:")]
        out[f"cpu worker {i} finishes"] = sum(end["thread_cpu"] - b["thread_cpu"] for b, end in zip(fins[::2], fins[1::2]))
        first = runs[0] if runs else fork
        out[f"cpu worker {i} fork to first replay"] = first["cpu"] - fork["cpu"]
        ex = next((e for e in evs if e["step"] == "worker:exit"), None)
        if ex is not None:
            at(f"worker {i} exit", ex)
            out[f"cpu worker {i}"] = ex["cpu"]
            out[f"cpu worker {i} sys"] = ex["sys"]
            out[f"n worker {i} page faults"] = ex["minflt"]
            last = runs[-1] if runs else fork
            out[f"cpu worker {i} after last replay"] = ex["cpu"] - last["cpu"]
        for ph in (e for e in evs if e["step"] == "replay:phases"):
            for k in ("start_s", "engine_s", "close_s"):
                out[f"wall worker phases {k}"] = out.get(f"wall worker phases {k}", 0.0) + ph.get(k, 0.0)
    out["cpu workers"] = sum(v for k, v in out.items() if k.startswith("cpu worker ") and k.count(" ") == 2)
    out["cpu all"] = out["cpu driver"] + out.get("cpu forkserver own", 0.0) + out["cpu workers"]
    return out


def split_singles(events: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    by_pid = defaultdict(list)
    for e in events:
        by_pid[e["pid"]].append(e)
    for role in ("single", "writer"):
        procs = [evs for evs in by_pid.values() if evs[0]["role"] == role]
        out[f"cpu {role}s"] = sum(next((e["cpu"] for e in evs if e["step"] == "process:exit"), 0.0) for evs in procs)
        out[f"n {role}s"] = len(procs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", default=str(HERE.parent), help="comma-separated trees to run, interleaved")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--singles", action="store_true", help="also the four single replays, interleaved")
    ap.add_argument("--lines", type=int, default=targets41.SWEEP_LINES)
    ap.add_argument("--json", type=Path, help="write every round's numbers here")
    ap.add_argument("--keep", type=Path, help="a folder to keep every process's log in")
    a = ap.parse_args()
    roots = [Path(r).resolve() for r in a.roots.split(",")]
    results: dict[str, list[dict]] = defaultdict(list)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sweep-split-") as tmp:
        tmp = Path(tmp)
        trace = targets41._head(targets41.CONVERSATION, a.lines, tmp)
        for i in range(a.repeats):
            order = roots if i % 2 == 0 else roots[::-1]
            for root in order:
                log = tmp / f"log-{root.name}-{i}.jsonl"
                r = run_one(root, ["sweep", trace, *targets41.SWEEP_SETS, "--jobs", 2,
                                   "--db", tmp / f"sweep-{root.name}-{i}.duckdb"], log)
                s = split_sweep(read_log(log, True))
                s["wall sweep"] = r["wall_s"]
                s["cpu sweep (launcher: driver)"] = r["cpu_s"]
                if a.singles:
                    slog = tmp / f"slog-{root.name}-{i}.jsonl"
                    walls = [run_one(root, ["replay", trace, "--db", tmp / f"single-{root.name}-{i}.duckdb", *opts], slog)
                             ["wall_s"] for opts in targets41.SWEEP_SINGLES]
                    s["wall singles"] = sum(walls)
                    s.update(split_singles(read_log(slog, False)))
                    s["ratio"] = s["wall singles"] / s["wall sweep"]
                results[str(root)].append(s)
                if a.keep:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    for f in tmp.glob(f"*log-{root.name}-{i}.jsonl"):
                        (a.keep / f.name).write_bytes(f.read_bytes())
                print(f"{root.name} #{i + 1}: sweep {s['wall sweep']:.2f} s"
                      + (f", singles {s['wall singles']:.2f} s, {s['ratio']:.2f}x" if a.singles else "")
                      + f", CPU all {s['cpu all']:.2f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    keys = list(dict.fromkeys(k for rs in results.values() for s in rs for k in s))
    keys.sort(key=lambda k: (not k.startswith("wall"), k.startswith("n "), min(
        (s.get(k, 1e9) for rs in results.values() for s in rs), default=0) if k.startswith("wall") else 0))
    names = [Path(r).name for r in results]
    print(f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; medians of {a.repeats} (min..max)")
    print("| step | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for k in keys:
        cells = []
        for rs in results.values():
            vals = [s[k] for s in rs if k in s]
            cells.append(f"{statistics.median(vals):.3f} ({min(vals):.3f}..{max(vals):.3f})" if vals else "-")
        print(f"| {k} | " + " | ".join(cells) + " |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
