"""Scale and storage benchmarks: how replay grows with the trace, how the readers cope with a
big run, and what the storage tier costs. One invocation, medians, side by side.

    .venv/bin/python benchmarks/scale.py [--quick] [--sizes 5000,20000,...] [--repeats N] [--json F]

scale    `tierdiag synth` traces of each size (5k -> 1M requests; --quick: 2k -> 20k), each
         replayed once through the CLI (default config, --verify off: the data plane still runs):
         wall, CPU and peak RSS per size, with the slope (s and MB per 100k requests, least
         squares). On the largest run: `summary`, `slow`, `explain` (the slowest request) and
         `report` as subprocesses (start-up included), medians of --repeats, and the report's size.
storage  the conversation trace (../shared/traces; --quick: its first 2,000 requests) with and
         without `--storage-tokens 50000000`, interleaved, probes on: wall and CPU, the ratio
         (target <= 2x), and what the storage folder holds at the end.

Peak RSS and CPU are the child's own (os.wait4, in a small launcher process: see _LAUNCH), so
other processes on a shared machine do not count; on a busy machine prefer the CPU columns.

    .venv/bin/python benchmarks/scale.py --readers-db RUN.duckdb [--baseline REF] [--repeats N]

times only the readers, on a run already recorded (a 1M replay costs ~11 min of one core: make it
once and keep it), and with --baseline the code of git ref REF beside this code's, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The console script's entry (`tierdiag`), or main() for a baseline ref older than it.
TIERDIAG = [sys.executable, "-c", "import tierdiag.cli.main as m; getattr(m, 'entry', m.main)()"]
CONVERSATION = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
FULL_SIZES = (5_000, 20_000, 80_000, 1_000_000)
QUICK_SIZES = (2_000, 5_000, 20_000)
STORAGE_TOKENS = 50_000_000
TARGETS = {"summary": 1.0, "slow": 1.0, "explain": 1.0, "report": 10.0}
REPORT_MAX_BYTES = 25_000_000
STORAGE_MAX_RATIO = 2.0


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# Spawns the measured command and reports its rusage: a small process between this one and
# the command, because Linux carries the peak RSS of the process that execs into its successor:
# a child spawned straight from this (by then ~1 GB) process reported this process's peak, not
# its own (every row of the session-10 scale table read 1,110 MB, summary's included). Forked
# from this ~10 MB process instead, the command's peak is its own. Wall and CPU are the
# command's, the launcher's own start-up not counted.
_LAUNCH = """
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
os.write(int(sys.argv[1]), f"{wall} {ru.ru_utime + ru.ru_stime} {ru.ru_maxrss}".encode())
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)  # the command's exit, a signal as a shell says it
"""


def run(args: list[str], *, timeout: float = 3600, root: Path = ROOT) -> dict[str, Any]:
    """One tierdiag subprocess (tierdiag imported from `root`): wall, its own CPU (user + sys,
    with its writer process's) and peak RSS, stdout."""
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCH, str(write_fd)]
                                    + TIERDIAG + [str(a) for a in args], stdout=out, stderr=err, cwd=root, env=env,
                                    pass_fds=(write_fd,), process_group=0)
        finally:
            os.close(write_fd)
        try:
            with os.fdopen(read_fd, "rb") as fh:
                measured = fh.read().decode().split()
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command: their own group
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0 or len(measured) != 3:
        raise RuntimeError(f"tierdiag {' '.join(map(str, args[:3]))} ... exited {proc.returncode}: "
                           f"{stderr.strip().splitlines()[-1] if stderr.strip() else ''}")
    wall, cpu, maxrss = float(measured[0]), float(measured[1]), int(measured[2])
    rss = maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"wall_s": wall, "cpu_s": cpu, "rss_bytes": rss, "stdout": stdout}


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def bench_scale(sizes: tuple[int, ...], repeats: int, tmp: Path) -> dict[str, Any]:
    rows = []
    db = None
    for n in sizes:
        trace = tmp / f"synth-{n}.jsonl"
        _say(f"scale: synth {n:,} requests")
        run(["synth", trace, "--requests", n])
        db = tmp / f"scale-{n}.duckdb"
        _say(f"scale: replay {n:,} requests")
        r = run(["replay", trace, "--db", db, "--verify", "off", "--json"])
        rows.append({"requests": n, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "rss_bytes": r["rss_bytes"]})
    xs = [r["requests"] / 1e5 for r in rows]
    res: dict[str, Any] = {
        "replays": rows,
        "slope_s_per_100k": slope(xs, [r["wall_s"] for r in rows]),
        "slope_cpu_s_per_100k": slope(xs, [r["cpu_s"] for r in rows]),
        "slope_rss_mb_per_100k": slope(xs, [r["rss_bytes"] / 1e6 for r in rows]),
        "largest": sizes[-1],
    }
    res.update(bench_readers(db, repeats, tmp, f"{sizes[-1]:,}-request run"))
    return res


def bench_readers(db: Path, repeats: int, tmp: Path, label: str, baseline: Path | None = None) -> dict[str, Any]:
    """summary, slow, explain (the slowest request) and report on `db`'s newest run; with
    `baseline` (a checkout of other code) each also with that code, interleaved."""
    slowest = run(["slow", "--db", db, "--top", 1, "--ids"])["stdout"].strip().splitlines()
    req = slowest[0] if slowest else "1"
    report = tmp / "scale-report.html"
    commands = {"summary": ["summary", "--db", db], "slow": ["slow", "--db", db],
                "explain": ["explain", req, "--db", db], "report": ["report", "--db", db, "-o", report]}
    readers: dict[str, Any] = {}
    for name, args in commands.items():
        _say(f"scale: {name} on the {label}")
        runs_, before = [], []
        for _ in range(repeats):
            if baseline is not None:
                before.append(run(args, root=baseline))
            runs_.append(run(args))
        readers[name] = {"wall_s": statistics.median(r["wall_s"] for r in runs_),
                         "cpu_s": statistics.median(r["cpu_s"] for r in runs_),
                         "rss_bytes": max(r["rss_bytes"] for r in runs_)}
        if before:
            readers[name]["before"] = {"wall_s": statistics.median(r["wall_s"] for r in before),
                                       "cpu_s": statistics.median(r["cpu_s"] for r in before)}
        if name == "report":
            readers[name]["html_bytes"] = report.stat().st_size
    return {"readers": readers, "explained": req}


def bench_storage(repeats: int, quick: bool, tmp: Path) -> dict[str, Any]:
    if not CONVERSATION.is_file():
        return {"available": False, "why": f"{CONVERSATION} not found"}
    trace = CONVERSATION
    if quick:
        trace = tmp / "conversation-2000.jsonl"
        with open(CONVERSATION) as src, open(trace, "w") as dst:
            for i, line in zip(range(2000), src):
                dst.write(line)
    res: dict[str, list] = {"none": [], "storage": []}
    storage_bytes = storage_dir = None
    for i in range(repeats):
        for mode in ("none", "storage"):  # interleaved: the machine's load hits both alike
            db = tmp / f"storage-{mode}-{i}.duckdb"
            _say(f"storage: replay ({mode}, {i + 1}/{repeats})")
            extra = ["--storage-tokens", STORAGE_TOKENS] if mode == "storage" else []
            r = run(["replay", trace, "--db", db, "--json", *extra])
            res[mode].append(r)
            if mode == "storage":
                try:
                    d = json.loads(r["stdout"])
                except ValueError as exc:
                    raise RuntimeError(f"replay --json printed what is not JSON ({exc}): {r['stdout'][:200]!r}") from None
                storage_bytes, storage_dir = d.get("storage_bytes"), d.get("storage_dir")
                shutil.rmtree(db.with_suffix(".storage"), ignore_errors=True)
    med = {m: {"wall_s": statistics.median(r["wall_s"] for r in rs), "cpu_s": statistics.median(r["cpu_s"] for r in rs)}
           for m, rs in res.items()}
    return {"available": True, "trace": str(trace), "requests": sum(1 for _ in open(trace)), **med,
            "ratio_wall": med["storage"]["wall_s"] / med["none"]["wall_s"],
            "ratio_cpu": med["storage"]["cpu_s"] / med["none"]["cpu_s"],
            "storage_bytes": storage_bytes, "storage_dir_shown": storage_dir is not None}


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for benchmarks/run.py's targets table: metric, value, target, ok, unit, note."""
    out = []
    sc = res.get("scale") or {}
    for name, limit in TARGETS.items():
        r = sc.get("readers", {}).get(name)
        run = f"the {sc['largest']:,}-request run" if sc.get("largest") else "the largest run"
        out.append({"metric": f"{name} on {run}", "value": r and r["wall_s"],
                    "target": f"<= {limit:g} s", "ok": r and r["wall_s"] <= limit, "unit": "s",
                    "note": "" if r else sc.get("why", "not run")})
    rp = sc.get("readers", {}).get("report")
    out.append({"metric": "report size (largest run)", "value": rp and rp["html_bytes"] / 1e6,
                "target": f"<= {REPORT_MAX_BYTES / 1e6:g} MB", "ok": rp and rp["html_bytes"] <= REPORT_MAX_BYTES,
                "unit": "MB", "note": ""})
    st = res.get("storage") or {}
    ok = st.get("available")
    out.append({"metric": "storage tier wall / no storage (conversation)", "value": st.get("ratio_wall") if ok else None,
                "target": f"<= {STORAGE_MAX_RATIO:g}x", "ok": ok and st["ratio_wall"] <= STORAGE_MAX_RATIO,
                "unit": "x", "note": "" if ok else st.get("why", "not run")})
    return out


def render(res: dict[str, Any], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or (Console() if sys.stdout.isatty() else Console(width=150))
    sc = res.get("scale")
    if sc and "replays" in sc:
        t = Table(title="scale: replay of `tierdiag synth` traces (default config, --verify off, one run each)")
        for col in ("requests", "wall s", "CPU s", "req/s", "peak RSS MB"):
            t.add_column(col, justify="right")
        for r in sc["replays"]:
            t.add_row(f"{r['requests']:,}", f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
                      f"{r['requests'] / r['wall_s']:,.0f}", f"{r['rss_bytes'] / 1e6:,.0f}")
        fmt = lambda v, u: "-" if v is None else f"{v:,.2f} {u}"  # noqa: E731
        t.caption = (f"slope per 100k requests: wall {fmt(sc['slope_s_per_100k'], 's')}, CPU "
                     f"{fmt(sc['slope_cpu_s_per_100k'], 's')}, peak RSS {fmt(sc['slope_rss_mb_per_100k'], 'MB')}")
        con.print(t)
    if sc and "readers" in sc:
        _render_readers(con, sc)
    elif sc and "replays" not in sc:
        con.print(f"scale: not available: {sc.get('why', '')}")
    st = res.get("storage")
    if st and st.get("available"):
        t = Table(title=f"storage tier: {st['requests']:,} conversation requests, --storage-tokens {STORAGE_TOKENS:,} "
                        "vs none (interleaved, medians)")
        for col in ("", "no storage", "storage", "ratio"):
            t.add_column(col, justify="right")
        t.add_row("wall s", f"{st['none']['wall_s']:.1f}", f"{st['storage']['wall_s']:.1f}", f"{st['ratio_wall']:.2f}x")
        t.add_row("CPU s", f"{st['none']['cpu_s']:.1f}", f"{st['storage']['cpu_s']:.1f}", f"{st['ratio_cpu']:.2f}x")
        t.caption = (f"page files at the end: {(st['storage_bytes'] or 0) / 2**30:.2f} GiB"
                     + (" (announced by replay)" if st["storage_dir_shown"] else ""))
        con.print(t)
    elif st:
        con.print(f"storage: not available: {st.get('why', '')}")


def _render_readers(con, sc: dict[str, Any]) -> None:
    from rich.table import Table

    what = f"{sc['largest']:,}-request run" if "largest" in sc else sc.get("label", "run")
    rt = Table(title=f"readers on the {what} (subprocess incl. start-up, medians)")
    cols = ["command", "wall s", "CPU s", "peak RSS MB", "target", "detail"]
    based = any("before" in r for r in sc["readers"].values())
    if based:
        cols[3:3] = ["before wall s", "before CPU s", "CPU after/before"]
    for col in cols:
        rt.add_column(col, justify="right" if col not in ("command", "detail") else "left")
    for name, r in sc["readers"].items():
        detail = f"{r['html_bytes'] / 1e6:.1f} MB of HTML (<= 25 MB)" if name == "report" else (
            f"request {sc['explained']}" if name == "explain" else "")
        row = [name, f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}"]
        if based:
            b = r.get("before") or {}
            row += [f"{b['wall_s']:.2f}" if b else "-", f"{b['cpu_s']:.2f}" if b else "-",
                    f"{r['cpu_s'] / b['cpu_s']:.2f}" if b else "-"]
        row += [f"{r['rss_bytes'] / 1e6:,.0f}", f"<= {TARGETS[name]:g} s", detail]
        rt.add_row(*row)
    if based:
        rt.caption = f"before: the code of {sc.get('baseline')}, each run interleaved with this code's"
    con.print(rt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, a 2,000-request storage slice")
    ap.add_argument("--sizes", default=None, help="comma-separated request counts (default 5000,20000,80000,1000000)")
    ap.add_argument("--repeats", type=int, default=None, help="reader and storage repeats (default 3, quick 2)")
    ap.add_argument("--only", default="scale,storage", help="scale, storage or both")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--readers-db", type=Path, default=None,
                    help="time only the readers, on this recorded run store (no replays)")
    ap.add_argument("--baseline", default=None, metavar="REF",
                    help="with --readers-db: also the code of this git ref, interleaved")
    args = ap.parse_args(argv)
    if args.readers_db is not None:
        return _readers_only(args)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    repeats = args.repeats or (2 if args.quick else 3)
    tmp = Path(tempfile.mkdtemp(prefix="tierdiag-scale-"))
    try:
        res = collect(sizes, repeats, args.quick, set(args.only.split(",")), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    render(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str) + "\n")
    return 0


def _readers_only(args) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tierdiag-scale-"))
    base = None
    try:
        if args.baseline:
            base = tmp / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.baseline],
                           check=True, capture_output=True, text=True)
        import compileall  # as an installed package is (PYTHONDONTWRITEBYTECODE would recompile each start-up)

        for root in (ROOT, base) if base is not None else (ROOT,):
            compileall.compile_dir(str(root / "tierdiag"), quiet=1)
        label = f"run in {args.readers_db}"
        sc = {"label": label, "baseline": args.baseline, "load_before": os.getloadavg()[0],
              **bench_readers(args.readers_db, args.repeats or 3, tmp, label, base)}
        sc["load_after"] = os.getloadavg()[0]
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    render({"scale": sc})
    print(f"load average {sc['load_before']:.1f} before, {sc['load_after']:.1f} after, on {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps({"scale": sc}, indent=2, default=str) + "\n")
    return 0


def collect(sizes: tuple[int, ...], repeats: int, quick: bool, only: set[str], tmp: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    if "scale" in only:
        try:
            res["scale"] = bench_scale(sizes, repeats, tmp)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            res["scale"] = {"why": str(exc)}
    if "storage" in only:
        try:
            res["storage"] = bench_storage(repeats, quick, tmp)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            res["storage"] = {"available": False, "why": str(exc)}
    res["load_after"] = os.getloadavg()[0]
    return res


if __name__ == "__main__":
    sys.exit(main())
