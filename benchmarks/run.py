"""tierdiag's benchmark suite: one command, one table, the targets beside the numbers.

    .venv/bin/python benchmarks/run.py [--quick] [--repeats N] [--json FILE] [--keep]

Sections (each says "not available" when the command it needs is missing):
  targets    issue 41's table, every row a ratio measured in this run (benchmarks/targets41.py):
             the conversation replay against a plain-Python prefix LRU floor (<= 10x), probe
             overhead, storage on/off, --dp 8 cache_aware / --dp 1, 1M requests (time, peak RSS),
             CPU scattered load-back / contiguous, a 4-run sweep --jobs 2 / one by one, summary
             and explain with start-up on the 1M run. `--quick` alone runs only this section,
             scaled down (~1-2 min). `--sessions N --gap S`: this section N times, S seconds
             apart, each row judged on the median over sessions (targets41.py's options)
  replay     requests/s on both Mooncake traces (../shared/traces), with probes and with
             --no-probes, interleaved; probe overhead (target <= 5 %); conversation wall (<= 10 s)
  ingest     DuckDB ingestion rate of the recorder's writer (RunWriter.append, ~1M request rows)
  explain    `tierdiag explain` wall time including interpreter start-up (target < 0.5 s)
  report     `tierdiag report` wall time on the conversation run
  scale      replay time and peak RSS from 5k to 1M `tierdiag synth` requests with the slope, and
             summary/slow/explain/report on the largest run (benchmarks/scale.py)
  storage    the conversation trace with --storage-tokens 50000000 vs without (<= 2x; scale.py)
  kernels    the copy-kernel table of `tierdiag calibrate` (load-back vs contiguous: scattered both
             sides >= 60 %, into a device run >= 80 %; the path each size used) and the kernel
             paths by page size with the previous algorithm beside them (benchmarks/kernels.py)
Every number is a median of several runs made in this one invocation. No network, no GPU needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACES = ROOT / ".." / "shared" / "traces"
TRACE_FILES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}
# The console script's entry (`tierdiag`), or main() for a baseline ref older than it.
TIERDIAG = [sys.executable, "-c", "import tierdiag.cli.main as m; getattr(m, 'entry', m.main)()"]


@dataclass(frozen=True)
class Target:
    metric: str
    value: float | None  # None: not measured (command missing, trace absent, failed)
    target: str
    ok: bool | None
    unit: str
    note: str = ""


def _have(command: str) -> bool:
    return importlib.util.find_spec(f"tierdiag.cli.{command}") is not None


_ENV: dict[str, str] = dict(os.environ)


def _run(args: list[str], *, timeout: float = 900, root: Path = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    """`tierdiag ARGS` as a subprocess, importing tierdiag from `root` (a baseline checkout too)."""
    env = dict(_ENV, PYTHONPATH=str(root) + os.pathsep + _ENV.get("PYTHONPATH", "")) if root != ROOT else _ENV
    t0 = time.perf_counter()
    proc = subprocess.run(TIERDIAG + args, capture_output=True, text=True, timeout=timeout, cwd=root, env=env)
    return proc, time.perf_counter() - t0


# Where the compiled CPU data plane's source has lived: engine/ (until 61715ef's parent),
# native/ as one file (61715ef), native/csrc/ (since 0860501).
_CPLANE_SOURCES = ("tierdiag/engine/_cplane.c", "tierdiag/native/_cplane.c", "tierdiag/native/csrc")


def _has_extension(where: Path) -> bool:
    """Whether a checkout declares a C extension to build: its setup.py names an Extension, or
    the data plane's source is in any place it has been."""
    setup = where / "setup.py"
    if setup.is_file() and "Extension(" in setup.read_text():
        return True
    return any((where / src).exists() for src in _CPLANE_SOURCES)


def _baseline_checkout(ref: str, tmp: Path) -> Path:
    """A detached worktree of `ref` (the code before a change), for side-by-side replays."""
    where = tmp / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), ref], check=True,
                   capture_output=True, text=True)
    if _has_extension(where):
        # A ref with the compiled CPU data plane replays with it built, as its checkout's `make`
        # builds it: without it the ref would fall back to numpy and look slower than it was.
        built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=where,
                               capture_output=True, text=True)
        if built.returncode:
            _say(f"baseline {ref}: its C data plane did not build, so it replays on numpy "
                 f"({built.stderr.strip().splitlines()[-1] if built.stderr.strip() else 'no output'})")
    return where


def _drop_checkout(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


def _fail_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- replay ---------------------------------------------------------------------------------
def _trace_for(name: str, quick_lines: int | None, tmp: Path) -> Path | None:
    path = TRACES / TRACE_FILES[name]
    if not path.is_file():
        return None
    if quick_lines is None:
        return path
    head = tmp / f"{name}_head{quick_lines}.jsonl"
    with path.open() as src, head.open("w") as dst:
        for i, line in enumerate(src):
            if i >= quick_lines:
                break
            dst.write(line)
    return head


def bench_replay(repeats: int, quick_lines: int | None, tmp: Path, baseline: Path | None = None) -> dict[str, Any]:
    if not _have("replay"):
        return {"available": False, "why": "tierdiag replay is not available"}
    results: dict[str, Any] = {"available": True, "traces": {}}
    for name in TRACE_FILES:
        trace = _trace_for(name, quick_lines, tmp)
        if trace is None:
            results["traces"][name] = {"available": False, "why": f"{TRACES / TRACE_FILES[name]} is absent"}
            _say(f"replay: {name} trace absent, skipped")
            continue
        modes = ("no_probes", "probes") + (("baseline",) if baseline else ())
        walls: dict[str, list[float]] = {m: [] for m in modes}
        proc_walls: dict[str, list[float]] = {m: [] for m in modes}
        phases: dict[str, list[dict]] = {m: [] for m in modes}  # replay --json wall_phases
        writers: set[str] = set()  # how the probed runs' stores were written (replay --json "writer")
        num_requests = 0
        error = None
        for i in range(repeats):
            # interleaved, so every mode sees the same machine conditions
            for mode in modes:
                db = tmp / f"{name}_{mode}_{i}.duckdb"
                args = ["replay", str(trace), "--db", str(db), "--run-name", f"bench-{name}", "--json"]
                if mode == "no_probes":
                    args.append("--no-probes")
                proc, wall = _run(args, root=baseline if mode == "baseline" else ROOT)
                if proc.returncode != 0:
                    error = f"replay {mode} failed: {_fail_line(proc)}"
                    break
                summary = json.loads(proc.stdout)
                num_requests = summary["num_requests"]
                walls[mode].append(float(summary["wall_s"]))
                proc_walls[mode].append(wall)
                if summary.get("wall_phases"):  # a baseline ref older than it has none
                    phases[mode].append(summary["wall_phases"])
                _say(f"replay {name} {mode} #{i + 1}: {summary['wall_s']:.2f}s ({num_requests:,} requests)")
                if mode == "probes":
                    results["traces"][name + "_db"] = str(db)  # the last probed run, for explain/report
                    writers.add(summary.get("writer") or "inline")
            if error:
                break
        if error:
            results["traces"][name] = {"available": False, "why": error}
            _say(error)
            continue
        med = {m: statistics.median(v) for m, v in walls.items()}
        results["traces"][name] = {
            "available": True, "trace": str(trace), "requests": num_requests, "repeats": repeats,
            "wall_s": med, "process_wall_s": {m: statistics.median(v) for m, v in proc_walls.items()},
            "writers": sorted(writers),
            "requests_per_s": {m: num_requests / w for m, w in med.items()},
            "probe_overhead": med["probes"] / med["no_probes"] - 1.0,
            "speedup_vs_baseline": med["baseline"] / med["probes"] if baseline else None,
            "all_wall_s": walls,
            "phases_s": {m: {k: statistics.median(p[k] for p in v) for k in v[0]}
                         for m, v in phases.items() if len(v) == len(walls[m])},
        }
    return results


# --- ingestion ----------------------------------------------------------------------------------
def _synthetic_request_columns(n: int, offset: int) -> dict[str, Any]:
    import numpy as np

    from tierdiag.store.schema import TABLES

    rng = np.random.default_rng(offset)
    cols: dict[str, Any] = {}
    categorical = {"status": ["finished", "finished", "rejected"],
                   "hit_class": ["device_hit", "tiered_hit", "miss"],
                   "loadback_skipped_reason": [None, None, "below_threshold", "device_full"]}
    for col, typ in TABLES["requests"].items():
        if col == "run_id":
            continue
        if col == "req_id":
            cols[col] = np.arange(offset + 1, offset + n + 1).astype(str)
        elif typ == "VARCHAR":
            choices = categorical.get(col, [None])
            cols[col] = [choices[i] for i in rng.integers(0, len(choices), n)]
        elif typ in ("BIGINT", "INTEGER"):
            cols[col] = rng.integers(0, 10**9, n, dtype=np.int64)
        elif typ == "DOUBLE":
            cols[col] = rng.random(n)
        elif typ == "BOOLEAN":
            cols[col] = rng.random(n) < 0.5
        else:
            raise ValueError(f"requests.{col}: no generator for {typ}")
    return cols


def bench_ingest(total_rows: int, tmp: Path, batch_rows: int = 250_000) -> dict[str, Any]:
    try:
        from tierdiag.store.writer import RunWriter
    except ImportError as exc:
        return {"available": False, "why": f"tierdiag.store.writer: {exc}"}
    db = tmp / "ingest.duckdb"
    writer = RunWriter(db, name="bench-ingest", trace_path="synthetic", trace_sha256="0" * 64, config={},
                       hardware={}, data_plane={}, timing="modelled", command_line=["benchmarks/run.py"])
    batches = [_synthetic_request_columns(min(batch_rows, total_rows - a), a)
               for a in range(0, total_rows, batch_rows)]  # generated before the clock starts
    append_s = []
    for cols in batches:
        t0 = time.perf_counter()
        writer.append({"requests": cols})
        append_s.append(time.perf_counter() - t0)
    writer.finish("complete", num_requests=total_rows)
    total_s = sum(append_s)
    _say(f"ingest: {total_rows:,} rows in {total_s:.2f}s")
    return {"available": True, "rows": total_rows, "batch_rows": batch_rows, "seconds": total_s,
            "rows_per_s": total_rows / total_s, "batch_seconds": append_s,
            "db_bytes": db.stat().st_size}


# --- explain / report -----------------------------------------------------------------------
def _pick_request(db: str) -> str | None:
    """A tiered hit if the run has one (explain walks all four steps), else any request."""
    import duckdb

    with duckdb.connect(db, read_only=True) as con:
        row = con.execute("SELECT req_id FROM requests ORDER BY host_hit_tokens DESC, ttft_ns DESC LIMIT 1").fetchone()
    return row[0] if row else None


def bench_explain(db: str | None, repeats: int) -> dict[str, Any]:
    if not _have("explain"):
        return {"available": False, "why": "tierdiag explain is not available"}
    if db is None:
        return {"available": False, "why": "no probed conversation run (replay unavailable or failed)"}
    req = _pick_request(db)
    if req is None:
        return {"available": False, "why": "the run has no requests"}
    walls = []
    for _ in range(repeats + 1):
        proc, wall = _run(["explain", req, "--db", db, "--json"])
        if proc.returncode != 0:
            return {"available": False, "why": f"explain failed: {_fail_line(proc)}"}
        walls.append(wall)
    walls = walls[1:]  # the first run warms the OS file cache
    _say(f"explain {req}: median {statistics.median(walls):.3f}s")
    return {"available": True, "req_id": req, "wall_s": statistics.median(walls), "all_wall_s": walls}


def bench_report(db: str | None, repeats: int, tmp: Path) -> dict[str, Any]:
    if not _have("report"):
        return {"available": False, "why": "tierdiag report is not available"}
    if db is None:
        return {"available": False, "why": "no probed conversation run (replay unavailable or failed)"}
    walls = []
    html = tmp / "bench_report.html"
    for _ in range(repeats):
        proc, wall = _run(["report", "--db", db, "-o", str(html)])
        if proc.returncode != 0:
            return {"available": False, "why": f"report failed: {_fail_line(proc)}"}
        walls.append(wall)
    _say(f"report: median {statistics.median(walls):.2f}s")
    return {"available": True, "wall_s": statistics.median(walls), "all_wall_s": walls,
            "html_bytes": html.stat().st_size}


# --- kernels ------------------------------------------------------------------------------------
def bench_kernels(quick: bool, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _have("calibrate"):
        args = ["calibrate", "--json", "--out", str(tmp / "profile.json")] + (["--quick"] if quick else [])
        proc, wall = _run(args)
        if proc.returncode == 0:
            out["calibrate"] = json.loads(proc.stdout)
            out["calibrate_wall_s"] = wall
            _say(f"calibrate: {wall:.1f}s")
        else:
            out["calibrate"] = {"available": False, "why": f"calibrate failed: {_fail_line(proc)}"}
    else:
        out["calibrate"] = {"available": False, "why": "tierdiag calibrate is not available"}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels as kernel_paths

    out["paths"] = kernel_paths.measure(quick=quick, repeats=3 if quick else 5)
    _say("kernel paths measured")
    return out


# --- rendering ----------------------------------------------------------------------------------
def targets(res: dict[str, Any]) -> list[Target]:
    t: list[Target] = []
    rep = res["replay"]
    for name in TRACE_FILES:
        r = rep.get("traces", {}).get(name, {"available": False, "why": rep.get("why", "")})
        ok = r.get("available", False)
        ov = r["probe_overhead"] if ok else None
        t.append(Target(f"probe overhead ({name})", ov * 100 if ok else None, "<= 5 %",
                        (ov <= 0.05) if ok else None, "%", "" if ok else r.get("why", "")))
    for name in TRACE_FILES:  # issue 15: >= 3,000 requests/s with probes, default config
        r = rep.get("traces", {}).get(name, {})
        rps = r["requests_per_s"]["probes"] if r.get("available") else None
        t.append(Target(f"{name} requests/s (probes)", rps, ">= 3,000",
                        (rps >= 3000) if rps is not None else None, "req/s",
                        "" if rps is not None else r.get("why", rep.get("why", ""))))
    ex = res["explain"]
    t.append(Target("explain wall incl. start-up", ex.get("wall_s"), "< 0.5 s",
                    (ex["wall_s"] < 0.5) if ex.get("available") else None, "s", ex.get("why", "")))
    cal = res["kernels"].get("calibrate", {})
    ratio = cal.get("load_back_vs_contiguous")
    t.append(Target("load-back vs contiguous (scattered both sides)", ratio * 100 if ratio is not None else None,
                    ">= 60 %", (ratio >= 0.6) if ratio is not None else None, "%", cal.get("why", "")))
    run_ratio = cal.get("load_back_to_run_vs_contiguous")
    if run_ratio is not None:
        t.append(Target("load-back vs contiguous (into a device run)", run_ratio * 100, ">= 80 %",
                        run_ratio >= 0.8, "%"))
    # issue 14: scattered->scattered >= 60 % of a flat copy from 1 MiB up (benchmarks/kernels.py rows)
    big = [r for r in res["kernels"].get("paths", []) if r["bytes"] >= 1 << 20]
    if big:
        worst = min(r["scattered_vs_flat"] for r in big)
        t.append(Target("scattered copy vs flat, worst row >= 1 MiB (kernel paths)", worst * 100, ">= 60 %",
                        worst >= 0.6, "%"))
    return t


def _render_probe_split(con, rep: dict[str, Any]) -> None:
    """Where the probes' overhead goes, by the replays' own wall phases (replay --json
    wall_phases, medians of each mode's runs): before the engine (the store created, the writer
    started), in the engine (rows emitted and handed over), and the close (the last rows
    written, the run evidence, the closing numbers), each as probes minus --no-probes."""
    from rich.table import Table

    rows = []
    for name in TRACE_FILES:
        r = rep.get("traces", {}).get(name)
        ph = (r or {}).get("phases_s", {})
        if not r or not r.get("available") or "probes" not in ph or "no_probes" not in ph:
            continue
        base = r["wall_s"]["no_probes"]
        diff = {k: ph["probes"][k] - ph["no_probes"][k] for k in ("start_s", "engine_s", "close_s")}
        rows.append((name, base, diff, ph["probes"]["close_s"]))
    if not rows:
        return
    table = Table(title="probe overhead, by phase (probes minus --no-probes, medians; share of the --no-probes wall)")
    for col in ("trace", "before the engine", "in the engine", "the close", "total", "close of the probed run"):
        table.add_column(col, justify="right" if col != "trace" else "left")
    for name, base, diff, close in rows:
        cells = [f"{v:+.3f}s ({v / base:+.1%})" for v in diff.values()]
        total = sum(diff.values())
        table.add_row(name, *cells, f"{total:+.3f}s ({total / base:+.1%})", f"{close:.3f}s")
    con.print(table)


def render(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # piped into a file or CI log, Rich would wrap at 80 columns; these tables need more
    con = Console() if sys.stdout.isatty() else Console(width=150)
    meta = res["meta"]
    con.print(f"[bold]tierdiag benchmarks[/] — {meta['when']}, {meta['cpu_count']} CPUs, torch threads "
              f"{meta['torch_threads']}, load average {meta['load_before']:.1f} -> {meta['load_after']:.1f}"
              + ("  [yellow](the machine was busy: numbers are noisy)[/]" if meta["load_after"] > meta["cpu_count"] else ""))

    rep = res["replay"]
    used = sorted({w for r in rep.get("traces", {}).values() if isinstance(r, dict) for w in r.get("writers", ())})
    table = Table(title=f"replay throughput (medians of {res['meta']['repeats']}, in-process wall; probed runs "
                        f"written by: {', '.join(used) or '-'} (TIERDIAG_WRITER))")
    base = res["meta"].get("baseline")
    cols = ["trace", "requests", "no-probes s", "probes s", "no-probes req/s", "probes req/s",
            "probe overhead", "process wall (probes)"] + ([f"{base} probes s", "speed-up"] if base else [])
    for col in cols:
        table.add_column(col, justify="right" if col != "trace" else "left")
    for name in TRACE_FILES:
        r = rep.get("traces", {}).get(name)
        if not r or not r.get("available"):
            why = r.get("why") if r else rep.get("why", "not available")
            table.add_row(name, f"not available: {why}", *[""] * (len(cols) - 2))
            continue
        extra = [f"{r['wall_s']['baseline']:.2f}", f"{r['speedup_vs_baseline']:.2f}x"] if base else []
        table.add_row(name, f"{r['requests']:,}", f"{r['wall_s']['no_probes']:.2f}", f"{r['wall_s']['probes']:.2f}",
                      f"{r['requests_per_s']['no_probes']:,.0f}", f"{r['requests_per_s']['probes']:,.0f}",
                      f"{r['probe_overhead']:+.1%}", f"{r['process_wall_s']['probes']:.2f}s", *extra)
    con.print(table)
    _render_probe_split(con, rep)

    ing, ex, rp = res["ingest"], res["explain"], res["report"]
    misc = Table(title="recorder and readers")
    misc.add_column("what")
    misc.add_column("median", justify="right")
    misc.add_column("detail")
    if ing.get("available"):
        misc.add_row("DuckDB ingestion (RunWriter.append)", f"{ing['rows_per_s']:,.0f} rows/s",
                     f"{ing['rows']:,} request rows in batches of {ing['batch_rows']:,}, {ing['seconds']:.2f}s")
    else:
        misc.add_row("DuckDB ingestion", "not available", ing.get("why", ""))
    if ex.get("available"):
        misc.add_row("explain (subprocess, incl. start-up)", f"{ex['wall_s']:.3f} s", f"request {ex['req_id']}")
    else:
        misc.add_row("explain", "not available", ex.get("why", ""))
    if rp.get("available"):
        misc.add_row("report (subprocess)", f"{rp['wall_s']:.2f} s", f"{rp['html_bytes'] / 1e6:.1f} MB of HTML")
    else:
        misc.add_row("report", "not available", rp.get("why", ""))
    con.print(misc)

    cal = res["kernels"].get("calibrate", {})
    if "table" in cal:
        kt = Table(title=f"copy kernels ({cal['device']}, {cal['num_layers']} layers x "
                         f"{cal['page_bytes'] // cal['num_layers'] // 1024} KiB rows; GB/s; from `tierdiag calibrate`)")
        for col in ("pages", "MiB", "contiguous", "load-back", "load-back into a run", "backup", "load-back / contig",
                    "path"):
            kt.add_column(col, justify="right" if col != "path" else "left")
        abbrev = {"runs": "R", "gather": "G", "scatter": "S", "two_pass": "2P"}
        for r in cal["table"]:
            path = ("triton" if r.get("load_back_path") == "triton"
                    else f"torch {abbrev.get(r['load_back_plan'], r['load_back_plan'])}")
            kt.add_row(f"{r['pages']:,}", f"{r['bytes'] / 2**20:.2f}", f"{r['contiguous_bytes_per_s'] / 1e9:.2f}",
                       f"{r['load_back_bytes_per_s'] / 1e9:.2f}",
                       f"{r['bytes'] / r['load_back_to_run_ns']:.2f}",
                       f"{r['backup_bytes_per_s'] / 1e9:.2f}", f"{r['load_back_vs_contiguous']:.0%}", path)
        con.print(kt)
        con.print(f"fit: load-back {cal['h2d_bytes_per_s'] / 1e9:.2f} GB/s + {cal['transfer_overhead_ns'] / 1e3:.1f} us "
                  f"per transfer; backup {cal['d2h_bytes_per_s'] / 1e9:.2f} GB/s")
    else:
        con.print(f"copy kernels (calibrate): not available: {cal.get('why', '')}")
    paths = res["kernels"].get("paths", [])
    if paths:
        import kernels as kernel_paths

        pt = Table(title="kernel paths by page size (GB/s and % of a flat copy of the same bytes; plans: "
                         "R runs, G gather, S scatter, 2P two-pass; scattered before: the previous CPU algorithm, "
                         "same pages, same run)")
        for col in ("row", "pages", "MiB", "flat", "contiguous", "gather", "scatter", "scattered",
                    "scattered before", "plans"):
            pt.add_column(col, justify="right")
        for r in paths:
            cells = [f"{r['row_bytes'] // 1024} KiB", f"{r['pages']:,}", f"{r['bytes'] / 2**20:.2f}",
                     f"{r['flat_bytes_per_s'] / 1e9:.1f}"]
            for name in ("contiguous", "gather", "scatter", "scattered", "before"):
                cells.append(f"{r[f'{name}_bytes_per_s'] / 1e9:.1f} {r[f'{name}_vs_flat']:.0%}")
            cells.append(" ".join(kernel_paths.PLAN_ABBREV[r[f"{n}_plan"]]
                                  for n in ("contiguous", "gather", "scatter", "scattered")))
            pt.add_row(*cells)
        con.print(pt)

    tt = Table(title="targets")
    for col in ("metric", "value", "target", "verdict"):
        tt.add_column(col)
    for t in res["targets"]:
        if t["value"] is None:
            value, verdict = "-", f"[dim]not available[/] {t['note']}"
        else:
            value = f"{t['value']:.1f} {t['unit']}" if t["unit"] == "%" else f"{t['value']:.3f} {t['unit']}"
            verdict = "[green]met[/]" if t["ok"] else "[red]missed[/]"
        tt.add_row(t["metric"], value, t["target"], verdict)
    con.print(tt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="tierdiag benchmark suite")
    ap.add_argument("--quick", action="store_true", help="truncated traces, fewer repeats (about a minute)")
    ap.add_argument("--repeats", type=int, default=None, help="replay repeats per mode (default 3, quick 2)")
    ap.add_argument("--json", type=Path, default=None, help="also write all results to this JSON file")
    ap.add_argument("--keep", action="store_true", help="keep the temporary run stores and print where")
    ap.add_argument("--only", default=None,
                    help="comma-separated sections to run (default: all; with --quick: targets)")
    ap.add_argument("--baseline", default=None, metavar="REF",
                    help="also replay a git ref's code (e.g. main~5) interleaved with this one: before/after")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads here and in every subprocess (OMP_NUM_THREADS); on a "
                         "busy machine 1 avoids multi-millisecond stalls of parallel ops")
    import targets41_sessions  # benchmarks/targets41_sessions.py: the targets section's sessions

    targets41_sessions.add_options(ap, " (the targets section only)")
    args = ap.parse_args(argv)
    if args.threads:
        _ENV["OMP_NUM_THREADS"] = str(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported below
    repeats = args.repeats or (2 if args.quick else 3)
    only = set((args.only or ("targets" if args.quick else
                               "targets,replay,ingest,explain,report,kernels,scale,storage")).split(","))
    tmp = Path(tempfile.mkdtemp(prefix="tierdiag-bench-"))
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    res: dict[str, Any] = {"meta": {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "repeats": repeats,
        "cpu_count": os.cpu_count() or 0, "torch_threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0], "python": sys.version.split()[0], "torch": torch.__version__,
    }}
    skipped = {"available": False, "why": "section not selected (--only)"}
    import targets41  # benchmarks/targets41.py: issue 41's table

    try:
        base = _baseline_checkout(args.baseline, tmp) if args.baseline and "replay" in only else None
        # Byte-compiled first, as an installed package is: where PYTHONDONTWRITEBYTECODE is set
        # (this sandbox sets it), a checkout without .pyc files, or with stale ones, would compile
        # its modules in every timed replay (~0.1 s, the fresh baseline worktree most of all).
        import compileall

        for root in (ROOT, base) if base is not None else (ROOT,):
            compileall.compile_dir(str(root / "tierdiag"), quiet=1)
        if "targets" in only:
            (tmp / "targets").mkdir()
            res["targets41"] = targets41.measure(args.quick, repeats, set(targets41.ROWS), tmp / "targets",
                                                 sessions=args.sessions, gap_s=args.gap)
        else:
            res["targets41"] = skipped
        try:
            res["replay"] = (bench_replay(repeats, 1500 if args.quick else None, tmp, base)
                             if "replay" in only else skipped)
        finally:
            if base is not None:
                _drop_checkout(base)
        res["meta"]["baseline"] = args.baseline
        res["ingest"] = bench_ingest(200_000 if args.quick else 1_000_000, tmp) if "ingest" in only else skipped
        conv_db = res["replay"].get("traces", {}).get("conversation_db")
        res["explain"] = bench_explain(conv_db, 3 if args.quick else 5) if "explain" in only else skipped
        res["report"] = bench_report(conv_db, 1 if args.quick else 3, tmp) if "report" in only else skipped
        res["kernels"] = bench_kernels(args.quick, tmp) if "kernels" in only else {"calibrate": skipped}
        import scale  # benchmarks/scale.py: the scale and storage sections

        sizes = scale.QUICK_SIZES if args.quick else scale.FULL_SIZES
        if "targets" in only and sizes[-1] >= 1_000_000:
            sizes = sizes[:-1]  # the 1M replay (~5 min) is the targets section's: not twice
        res["scale"] = scale.collect(sizes, repeats, args.quick, only & {"scale", "storage"}, tmp)
        res["meta"]["load_after"] = os.getloadavg()[0]
        res["targets"] = [t.__dict__ for t in targets(res)] + [
            Target(**{**t, "ok": bool(t["ok"]) if t["value"] is not None else None}).__dict__
            for t in scale.targets(res["scale"])]
        if only - {"targets"}:
            scale.render(res["scale"])
            render(res)
        if "targets" in only:
            targets41.render_doc(res["targets41"])
        if args.json:
            args.json.write_text(json.dumps(res, indent=2, default=str) + "\n")
            _say(f"results written to {args.json}")
    finally:
        if args.keep:
            _say(f"run stores kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
