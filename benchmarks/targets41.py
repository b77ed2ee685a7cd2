"""Issue 41's table, every row a ratio measured in this one run: a fast or a slow phase of a
shared machine moves both sides of a ratio alike. `benchmarks/run.py --only targets` runs it (it
is in run.py's default sections); alone:

    .venv/bin/python benchmarks/targets41.py [--quick] [--repeats N] [--only ROWS] [--json FILE]
                                             [--sessions N [--gap S]]

--sessions N (1-20, default 1): the chosen rows measured N times, --gap S seconds apart (end to
start, 0-3600, default 60); each row's verdict is made from the median over sessions of each
session's ratio, min .. max beside it, and a table of the sessions: the load average at each
one's start, its floor wall (one busy process: which sessions met a slow phase), its own ratios.
--json is written after every session (each session's results and table kept, a failed row named
with its replay mode and round). A bad option value: one line on stderr, exit 2.

Rows (ROWS: comma-separated keys in brackets):
  [replay]   the conversation trace with probes, whole process (start-up and close included),
             against the floor: a ~20-line plain-Python prefix LRU over the same trace's hash ids
             (`LRU_FLOOR` below), also a whole process, timed in the same rounds. Target <= 10x.
             Same rounds: probe overhead (probes / --no-probes, <= 5 %), the storage tier
             (--storage-tokens 50000000 / none, <= 1.3x), `--dp 8 --router cache_aware` /
             `--dp 1` (<= 1.5x); every mode once a round, interleaved, medians.
  [scale]    1M `tierdiag synth` requests replayed: wall and peak RSS (<= 100 s, <= 1 GB).
             --quick: 20k requests, and the verdict says it was not the 1M run.
  [readers]  `summary` and `explain` (its slowest request) as subprocesses, start-up included,
             on that run (a synth trace: sessions included), <= 0.3 s each. Where that run is
             under 1M requests (--quick), also on a 1M-request stand-in built from it by copying
             its rows (benchmarks/big_store.py: it measures the readers, not the engine; ~1-3 min
             to build); --readers-db: on that store alone.
  [kernels]  CPU load-back with pages scattered on both sides / one contiguous copy of the same
             bytes (`tierdiag calibrate --json`'s headline, its two largest sizes), >= 0.6x.
  [sweep]    `tierdiag sweep --jobs 2` of 4 small runs (the conversation trace's first 1,000
             requests, host_tokens x write_policy) against the same 4 `tierdiag replay`s one by
             one: sum of the singles / the sweep's wall, >= 1.6x; interleaved, medians.

Wall, CPU and peak RSS are each command's own (benchmarks/scale.py's launcher). Each replay row
shows its ratio in CPU-seconds too (user + sys, children included), information beside the wall
ratio's verdict; a sweep's CPU leaves out its workers (children of the fork server, which
outlives the command), so the sweep row compares walls only. Nothing here asserts on a time; the
tests never do either.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale  # noqa: E402  (benchmarks/scale.py: the launcher that measures a command's own wall, CPU, RSS)
import targets41_sessions as ts  # noqa: E402  (benchmarks/targets41_sessions.py: sessions spread over time)

ROOT = HERE.parent
CONVERSATION = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
ROWS = ("replay", "scale", "readers", "kernels", "sweep")
STORAGE_TOKENS = 50_000_000
QUICK_LINES = 2_000  # --quick: the conversation trace's first lines for the replay rows
SWEEP_LINES = 1_000
SWEEP_SETS = ("--set", "host_tokens=2M,8M", "--set", "write_policy=write_through,write_back")
SWEEP_SINGLES = [["--host-tokens", str(h), "--write-policy", w]
                 for h in (2 * 2**20, 8 * 2**20) for w in ("write_through", "write_back")]

# The floor: a prefix LRU over the trace's hash ids in plain Python, as a whole process (the
# interpreter's start-up included, as the replay's is). Each request walks its hash ids: the
# cached prefix counts as hits; every id is then touched or inserted, and the least recently
# used ids beyond the capacity (2,000 blocks: 1M tokens at 512 a block) go.
LRU_FLOOR = r"""
import json, sys, time
from collections import OrderedDict
t0 = time.perf_counter()
cache, capacity, hits, blocks = OrderedDict(), int(sys.argv[2]), 0, 0
with open(sys.argv[1]) as f:
    for line in f:
        ids = json.loads(line)["hash_ids"]
        blocks += len(ids)
        for h in ids:
            if h not in cache:
                break
            hits += 1
        for h in ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
print(json.dumps({"hits": hits, "blocks": blocks, "loop_s": time.perf_counter() - t0}))
"""
LRU_CAPACITY_BLOCKS = 2_000


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _head(trace: Path, lines: int, tmp: Path) -> Path:
    out = tmp / f"{trace.stem}-{lines}.jsonl"
    if not out.exists():
        with open(trace) as src, open(out, "w") as dst:
            for _, line in zip(range(lines), src):
                dst.write(line)
    return out


def _lru(trace: Path) -> dict[str, Any]:
    """The floor as a process of its own: wall from outside, like every command here."""
    import resource

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    proc = subprocess.run([sys.executable, "-S", "-c", LRU_FLOOR, str(trace), str(LRU_CAPACITY_BLOCKS)],
                          capture_output=True, text=True, check=True)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu() - c0, **json.loads(proc.stdout)}


def _replay(trace: Path, db: Path, *extra: object) -> dict[str, Any]:
    r = scale.run(["replay", trace, "--db", db, "--json", *extra])
    r["json"] = json.loads(r.pop("stdout"))
    return r


def _median(rs: list[dict], key: str = "wall_s") -> float:
    return statistics.median(r[key] for r in rs)


# --- the rows -----------------------------------------------------------------------------------
def bench_replay(repeats: int, quick: bool, tmp: Path) -> dict[str, Any]:
    if not CONVERSATION.is_file():
        return {"available": False, "why": f"{CONVERSATION} is absent"}
    trace = _head(CONVERSATION, QUICK_LINES, tmp) if quick else CONVERSATION
    modes = {"lru": None, "probes": (), "no_probes": ("--no-probes",),
             "storage": ("--storage-tokens", STORAGE_TOKENS), "dp8": ("--dp", 8, "--router", "cache_aware")}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(repeats):
        order = list(modes) if i % 2 == 0 else list(reversed(modes))  # the order flips every round
        for mode in order:
            try:
                if mode == "lru":
                    runs[mode].append(_lru(trace))
                else:
                    db = tmp / f"replay-{mode}-{i}.duckdb"
                    runs[mode].append(_replay(trace, db, *modes[mode]))
                    if mode == "storage":
                        shutil.rmtree(db.with_suffix(".storage"), ignore_errors=True)
            except (subprocess.SubprocessError, RuntimeError, ValueError, KeyError) as exc:  # which one failed
                raise RuntimeError(f"mode {mode}, round {i + 1} of {repeats}: {_last_line(exc)}") from exc
            _say(f"targets: replay {mode} #{i + 1}: {runs[mode][-1]['wall_s']:.2f}s")
    med = {m: _median(rs) for m, rs in runs.items()}
    n = runs["probes"][0]["json"]["num_requests"]
    return {"available": True, "trace": str(trace), "requests": n, "repeats": repeats, "wall_s": med,
            "cpu_s": {m: _median(rs, "cpu_s") for m, rs in runs.items()},
            "all_wall_s": {m: [r["wall_s"] for r in rs] for m, rs in runs.items()},
            "lru_loop_s": _median(runs["lru"], "loop_s"), "lru_hits": runs["lru"][0]["hits"],
            "lru_blocks": runs["lru"][0]["blocks"],
            "requests_per_s": n / med["probes"],
            "vs_floor": med["probes"] / med["lru"],
            "probe_overhead": med["probes"] / med["no_probes"] - 1.0,
            "storage_ratio": med["storage"] / med["probes"],
            "dp_ratio": med["dp8"] / med["probes"]}


def bench_scale(quick: bool, tmp: Path) -> dict[str, Any]:
    n = 20_000 if quick else 1_000_000
    trace, db = tmp / f"synth-{n}.jsonl", tmp / f"synth-{n}.duckdb"
    _say(f"targets: synth {n:,} requests")
    scale.run(["synth", trace, "--requests", n])
    _say(f"targets: replay {n:,} requests")
    r = scale.run(["replay", trace, "--db", db, "--verify", "off", "--json"])
    return {"available": True, "requests": n, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "rss_bytes": r["rss_bytes"],
            "db": str(db), "quick": quick}


def bench_readers(db: str | None, repeats: int, label: str) -> dict[str, Any]:
    if db is None:
        return {"available": False, "why": "no scale run (its row did not run)"}
    slowest = scale.run(["slow", "--db", db, "--top", 1, "--ids"])["stdout"].strip().splitlines()
    req = slowest[0] if slowest else "1"
    out: dict[str, Any] = {"available": True, "run": label, "explained": req}
    commands = {"summary": ["summary", "--db", db], "explain": ["explain", req, "--db", db]}
    walls: dict[str, list[dict]] = {c: [] for c in commands}
    for c, args in commands.items():
        scale.run(args)  # the OS file cache warmed, as for any reader after the replay
    for _ in range(repeats):
        for c, args in commands.items():
            walls[c].append(scale.run(args))
    for c, rs in walls.items():
        out[c] = {"wall_s": _median(rs), "cpu_s": _median(rs, "cpu_s"), "rss_bytes": max(r["rss_bytes"] for r in rs)}
        _say(f"targets: {c} on the {label}: {out[c]['wall_s']:.3f}s")
    return out


BIG_REQUESTS = 1_000_000


def bench_readers_big(sc: dict[str, Any], repeats: int, tmp: Path) -> dict[str, Any]:
    """The readers on a 1M-request stand-in copied from the scale row's run (big_store.py), where
    that run is smaller: the readers' target is on 1M requests, and a real 1M replay is minutes."""
    if not sc.get("db"):
        return {"available": False, "why": "no scale run (its row did not run)"}
    n = int(sc.get("requests") or 0)
    if n >= BIG_REQUESTS:
        return {"available": False, "why": f"the scale run has {n:,} requests already"}
    import big_store  # benchmarks/big_store.py

    copies = -(-BIG_REQUESTS // max(n, 1))
    _say(f"targets: building a {n * copies:,}-request stand-in ({copies} copies of the scale run's rows)")
    built = big_store.build(Path(sc["db"]), tmp / "big-store.duckdb", copies)
    out = bench_readers(built["db"], repeats, f"{built['requests']:,}-request stand-in ({n:,} x {copies}, copied rows)")
    return {**out, "requests": built["requests"], "copies": copies, "build_s": built["copy_s"] + (built["evidence_s"] or 0)}


def bench_kernels(quick: bool, tmp: Path) -> dict[str, Any]:
    args = ["calibrate", "--json", "--out", tmp / "profile.json"] + (["--quick"] if quick else [])
    r = scale.run(args)
    cal = json.loads(r["stdout"])
    bulk = cal["table"][-2:]
    _say(f"targets: calibrate: load-back / contiguous {cal['load_back_vs_contiguous']:.2f}")
    # load_back_plan names the path: "compiled" (the C data plane's move, no plan: every CPU
    # transfer past 1 MiB where it is built), "direct" (numpy, no plan), or a planner's kind; a
    # gather, scatter or two_pass plan on the CPU still runs by the compiled move where it is
    # built (kernels._execute_cpu: pages given as a tensor), so say which.
    built = any((Path(__file__).resolve().parents[1] / "tierdiag" / "native").glob("_cplane*"))
    mover = " (compiled move)" if built and str(cal.get("device", "")).startswith("cpu") else ""
    paths = [f"{row.get('load_back_plan')}{mover if row.get('load_back_plan') in ('gather', 'scatter', 'two_pass') else ''}"
             for row in bulk]
    return {"available": True, "ratio": cal["load_back_vs_contiguous"],
            "bulk_mib": [row["bytes"] / 2**20 for row in bulk], "paths": paths,
            "device": cal.get("device"), "quick": quick}


def bench_sweep(repeats: int, tmp: Path) -> dict[str, Any]:
    if not CONVERSATION.is_file():
        return {"available": False, "why": f"{CONVERSATION} is absent"}
    trace = _head(CONVERSATION, SWEEP_LINES, tmp)
    sweeps, singles = [], []
    for i in range(repeats):
        for what in (("sweep", "singles") if i % 2 == 0 else ("singles", "sweep")):
            if what == "sweep":
                sweeps.append(scale.run(["sweep", trace, *SWEEP_SETS, "--jobs", 2, "--db", tmp / f"sweep-{i}.duckdb"]))
                _say(f"targets: sweep --jobs 2 #{i + 1}: {sweeps[-1]['wall_s']:.2f}s")
            else:
                rs = [scale.run(["replay", trace, "--db", tmp / f"singles-{i}.duckdb", *opts]) for opts in SWEEP_SINGLES]
                singles.append({"wall_s": sum(r["wall_s"] for r in rs), "cpu_s": sum(r["cpu_s"] for r in rs)})
                _say(f"targets: 4 single replays #{i + 1}: {singles[-1]['wall_s']:.2f}s")
    sweep_s, singles_s = _median(sweeps), _median(singles)
    return {"available": True, "lines": SWEEP_LINES, "repeats": repeats, "sweep_wall_s": sweep_s,
            "singles_wall_s": singles_s, "sweep_cpu_s": _median(sweeps, "cpu_s"), "singles_cpu_s": _median(singles, "cpu_s"),
            "speedup": singles_s / sweep_s,
            "all": {"sweep": [r["wall_s"] for r in sweeps], "singles": [r["wall_s"] for r in singles]}}


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _guard(name: str, fn, *args) -> dict[str, Any]:
    try:
        return fn(*args)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        _say(f"targets: {name}: not available: {exc}")
        return {"available": False, "why": f"{name} failed: {_last_line(exc)}"}


def _requests_in(db: Path) -> int:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT num_requests FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]


def collect(quick: bool, repeats: int, only: set[str], tmp: Path, readers_db: Path | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"quick": quick, "load_before": os.getloadavg()[0]}
    skipped = {"available": False, "why": "not selected"}
    res["replay"] = _guard("replay", bench_replay, repeats, quick, tmp) if "replay" in only else skipped
    res["sweep"] = _guard("sweep", bench_sweep, repeats, tmp) if "sweep" in only else skipped
    res["kernels"] = _guard("kernels", bench_kernels, quick, tmp) if "kernels" in only else skipped
    if readers_db is not None:
        res["scale"] = {"available": False, "why": f"not run: readers on {readers_db}",
                        "db": str(readers_db), "requests": _requests_in(readers_db)}
    else:
        res["scale"] = _guard("scale", bench_scale, quick, tmp) if only & {"scale", "readers"} else skipped
    sc = res["scale"]
    res["readers"] = (_guard("readers", bench_readers, sc.get("db"), max(3, repeats), f"{sc.get('requests', 0):,}-request run")
                      if "readers" in only else skipped)
    res["readers_big"] = (_guard("readers_big", bench_readers_big, sc, max(3, repeats), tmp)
                          if "readers" in only and readers_db is None else skipped)
    res["floor_wall_s"] = _floor_wall(res["replay"], quick, tmp)
    res["load_after"] = os.getloadavg()[0]
    return res


def _floor_wall(rp: dict[str, Any], quick: bool, tmp: Path) -> float | None:
    """The phase the VM was in: the floor's wall (one busy process), the replay row's median, else
    one floor run of its own (~0.2-0.4 s)."""
    if rp.get("available"):
        return rp["wall_s"]["lru"]
    if not CONVERSATION.is_file():
        return None
    try:
        return _lru(_head(CONVERSATION, QUICK_LINES, tmp) if quick else CONVERSATION)["wall_s"]
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        _say(f"targets: the floor's phase run failed: {exc}")
        return None


# --- the table ----------------------------------------------------------------------------------
def table(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target of the issue: what was measured, the target, met or not (None: not
    measured, `note` says why). `key` names the row across sessions; `checks` are the numbers the
    verdict compares (the median over sessions is taken of each); `cpu` the same ratio in
    CPU-seconds (user + sys, children included), information beside the wall ratio's verdict."""
    rows: list[dict[str, Any]] = []

    def row(key: str, what: str, value: str | None, target: str, checks: list[dict[str, Any]] | None = None,
            note: str = "", cpu: dict[str, Any] | None = None, measured_only: bool = False, **numbers) -> None:
        ok = None if value is None or measured_only else ts.passes(checks or [])
        rows.append({"key": key, "row": what, "measured": value, "target": target, "ok": ok, "note": note,
                     "checks": [] if measured_only else checks or [], "cpu": cpu, **numbers})

    rp = res.get("replay", {})
    if rp.get("available"):
        w, c = rp["wall_s"], rp["cpu_s"]

        def cpu(a: str, b: str, op: str, limit: float, unit: str = "x") -> dict[str, Any] | None:
            return ts.check("cpu", c[a] / c[b], op, limit, unit) if c.get(a) and c.get(b) else None

        def cpu_s(a: str, b: str) -> str:
            return f"; CPU {c[a]:.2f} / {c[b]:.2f} s" if c.get(a) and c.get(b) else ""
        tr = "conversation" + (f" (first {rp['requests']:,})" if res.get("quick") else f" ({rp['requests']:,} requests)")
        ratios = (("floor", f"{tr}, probes, vs the LRU floor", "probes", "lru", "<= 10x the floor", 10.0, "x"),
                  ("probe_overhead", "probe overhead", "probes", "no_probes", "<= 5 %", 1.05, "overhead"),
                  ("storage", "storage tier on vs off", "storage", "probes", "<= 1.3x", 1.3, "x"),
                  ("dp", "--dp 8 --router cache_aware vs --dp 1", "dp8", "probes", "<= 1.5x", 1.5, "x"))
        for key, what, a, b, target, limit, unit in ratios:
            ratio = w[a] / w[b]
            head = (f"{w['probes']:.2f} s = {rp['requests_per_s']:,.0f} req/s; floor {w['lru']:.3f} s; {ratio:.1f}x"
                    if key == "floor" else f"{ts.fmt(ratio, unit)} ({w[a]:.2f} / {w[b]:.2f} s)")
            row(key, what, head + cpu_s(a, b), target, [ts.check("ratio", ratio, "<=", limit, unit)],
                cpu=cpu(a, b, "<=", limit, unit), ratio=ratio)
    else:
        for key, what, target in (("floor", "conversation, probes, vs the LRU floor", "<= 10x the floor"),
                                  ("probe_overhead", "probe overhead", "<= 5 %"), ("storage", "storage tier on vs off", "<= 1.3x"),
                                  ("dp", "--dp 8 --router cache_aware vs --dp 1", "<= 1.5x")):
            row(key, what, None, target, note=rp.get("why", ""))
    sc = res.get("scale", {})
    if sc.get("available"):
        full = sc["requests"] >= 1_000_000
        mb = sc["rss_bytes"] / 1e6
        value = f"{sc['wall_s']:.1f} s, {mb:,.0f} MB peak RSS ({sc['requests'] / sc['wall_s']:,.0f} req/s)"
        checks = [ts.check("wall", sc["wall_s"], "<=", 100, "s"), ts.check("rss", mb, "<=", 1000, "MB")]
        if full:
            row("1m", "1M requests", value, "<= 100 s, <= 1 GB", checks)
        else:
            row("1m", f"1M requests (quick: {sc['requests']:,})",
                value + f"; at this rate 1M ~{sc['wall_s'] * 1e6 / sc['requests']:.0f} s",
                "<= 100 s, <= 1 GB", note="quick: not the 1M run", measured_only=True)
    else:
        row("1m", "1M requests", None, "<= 100 s, <= 1 GB", note=sc.get("why", ""))
    kn = res.get("kernels", {})
    what = "CPU scattered load-back copy vs contiguous"
    if kn.get("available"):
        row("kernels", what,
            f"{kn['ratio']:.2f}x ({', '.join(f'{m:g}' for m in kn['bulk_mib'])} MiB; {'/'.join(map(str, kn['paths']))})",
            ">= 0.6x", [ts.check("ratio", kn["ratio"], ">=", 0.6, "x")], ratio=kn["ratio"])
    else:
        row("kernels", what, None, ">= 0.6x", note=kn.get("why", ""))
    sw = res.get("sweep", {})
    if sw.get("available"):
        row("sweep", f"sweep of 4 small runs ({sw['lines']:,} requests), --jobs 2 vs one by one",
            f"{sw['speedup']:.2f}x ({sw['singles_wall_s']:.2f} / {sw['sweep_wall_s']:.2f} s)", ">= 1.6x",
            [ts.check("ratio", sw["speedup"], ">=", 1.6, "x")], ratio=sw["speedup"])
    else:
        row("sweep", "sweep of 4 small runs, --jobs 2 vs one by one", None, ">= 1.6x", note=sw.get("why", ""))
    rd, big = res.get("readers", {}), res.get("readers_big", {})
    target = "<= 0.3 s on 1M, sessions included"
    if rd.get("available"):
        full = (sc.get("requests") or 0) >= 1_000_000
        for c in ("summary", "explain"):
            row(c, f"`{c}` with start-up on the {rd['run']}", _reader_value(rd[c]), target,
                [ts.check("wall", rd[c]["wall_s"], "<=", 0.3, "s")], measured_only=not full,
                note="" if full else "not the 1M run" + ("; the stand-in's row below is" if big.get("available") else ""))
    else:
        for c in ("summary", "explain"):
            row(c, f"`{c}` with start-up", None, target, note=rd.get("why", ""))
    if big.get("available"):
        for c in ("summary", "explain"):
            row(f"{c}_big", f"`{c}` with start-up on the {big['run']}", _reader_value(big[c]), target,
                [ts.check("wall", big[c]["wall_s"], "<=", 0.3, "s")], note="rows copied by benchmarks/big_store.py, not a replay")
    return rows


def _reader_value(r: dict[str, Any]) -> str:
    return f"{r['wall_s']:.3f} s, CPU {r['cpu_s']:.3f} s ({r['rss_bytes'] / 1e6:,.0f} MB)"


def render(res: dict[str, Any], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or (Console() if sys.stdout.isatty() else Console(width=160))
    t = Table(title="issue 41: every target side by side in one run (medians, interleaved; whole processes)")
    for col in ("target row", "measured", "target", "verdict", "CPU ratio (information)"):
        t.add_column(col, overflow="fold")
    for r in table(res):
        t.add_row(r["row"], r["measured"] if r["measured"] is not None else "-", r["target"], ts.verdict(r),
                  ts.cpu_cell(r["cpu"]))
    rp = res.get("replay", {})
    floor = (f"floor: {rp['lru_blocks']:,} hash ids through a {LRU_CAPACITY_BLOCKS:,}-block OrderedDict LRU "
             f"({rp['lru_hits']:,} prefix hits; its loop alone {rp['lru_loop_s']:.3f} s); " if rp.get("available") else "")
    t.caption = f"{floor}load average {res['load_before']:.1f} -> {res['load_after']:.1f}. {ts.CPU_LEGEND}"
    con.print(t)


def render_doc(doc: dict[str, Any], console=None) -> None:
    """measure()'s result: one session's table, or the median over sessions and each session's."""
    if "sessions" in doc:
        ts.render_sessions(doc, console)
    else:
        render(doc, console)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = ts.OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller traces and runs, 2 repeats (about 1-2 min)")
    ap.add_argument("--repeats", type=ts.count_option("repeats", ts.MAX_REPEATS), default=None,
                    help=f"rounds of the interleaved rows (1-{ts.MAX_REPEATS}; default 3, quick 2)")
    ap.add_argument("--only", default=",".join(ROWS), help=f"comma-separated rows: {', '.join(ROWS)}")
    ap.add_argument("--json", type=Path, default=None,
                    help="write the results here (with --sessions: after every session, each session's table kept)")
    ap.add_argument("--readers-db", type=Path, default=None,
                    help="the readers row on this recorded run store (a 1M replay made before, ~5-10 min, or "
                         "benchmarks/big_store.py's stand-in): the scale row is then not run")
    ts.add_options(ap)
    args = ap.parse_args(argv)
    args.only = set(args.only.split(","))
    if args.only - set(ROWS):
        ap.error(f"--only: unknown rows {sorted(args.only - set(ROWS))}; choose from {', '.join(ROWS)}")
    if args.readers_db is not None and not _a_store(args.readers_db):  # found now, not after the replays
        ap.error(f"--readers-db: {str(args.readers_db)!r} is not a run store (a DuckDB file `replay --db` wrote)")
    if args.json is not None and not args.json.resolve().parent.is_dir():  # found now, not after the sessions
        ap.error(f"--json: no folder {str(args.json.resolve().parent)!r} to write {args.json.name!r} in")
    return args


def _a_store(db: Path) -> bool:
    """Whether `db` opens read-only as a DuckDB file holding a recorded run (what the readers row
    reads, `_requests_in`): a missing path, a folder, another file or a store of no run is refused
    before any row is measured."""
    import duckdb

    try:
        if not db.is_file():
            return False
        with duckdb.connect(str(db), read_only=True) as con:
            return con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except (OSError, ValueError, duckdb.Error):
        return False


def prepare() -> None:
    import compileall  # as an installed package is (PYTHONDONTWRITEBYTECODE would recompile every start-up)

    compileall.compile_dir(str(ROOT / "tierdiag"), quiet=1)
    # The readers' table of dataclass methods (cli/dataclass_code.py), as `make setup` or a first
    # run writes it: the readers row times an installed tool, not its first start.
    subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def measure(quick: bool, repeats: int, only: set[str], tmp: Path, readers_db: Path | None = None,
            sessions: int = 1, gap_s: float = ts.DEFAULT_GAP_S, on_session=lambda doc: None) -> dict[str, Any]:
    """One session: collect()'s results with their table (today's shape). Several: ts.run_sessions's
    document, each session in a folder of its own under `tmp`, removed after it."""
    if sessions == 1:
        res = collect(quick, repeats, only, tmp, readers_db)
        return {**res, "table": table(res)}

    def one(i: int) -> dict[str, Any]:
        folder = tmp / f"session-{i + 1}"
        folder.mkdir()
        try:
            return collect(quick, repeats, only, folder, readers_db)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return ts.run_sessions(sessions, gap_s, one, table, on_session, say=_say)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare()

    def write(doc: dict[str, Any]) -> None:
        if args.json:
            args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    with tempfile.TemporaryDirectory(prefix="tierdiag-targets-") as tmp:
        doc = measure(args.quick, args.repeats or (2 if args.quick else 3), args.only, Path(tmp), args.readers_db,
                      args.sessions, args.gap, write)
    render_doc(doc)
    write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
