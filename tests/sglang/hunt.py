"""A hunt for divergences (issue 43): many short workloads CI does not have, each run through
SGLang 0.5.23's own Scheduler on the virtual clock and through the engine (the drive's path:
`drive.prepare` for trace workloads, `scheduler_harness.run_both`), each verdict a row.

    python -m tests.sglang.hunt [--seed S] [--only REGEX] [--limit N] [--out DIR] [--list] [--table]

The campaign is a fixed function of `--seed` (default 0): the same seed lists the same workloads
with the same options and writes the same traces. Families:
- `synth-*`: `tierdiag synth` traces (agent / multi-turn / system-prompt / mixed), at rates 0.5x-8x
  of 2 requests/s, pages 1/16/64, device pools from tiny to huge, every schedule, write, eviction
  and prefetch policy, a storage tier on and off, mixed chunk, budgets off a page boundary, gzip;
  the agent and multi-turn traces in closed loop (their sessions);
- `slice-*`: the three real traces (../shared/traces) cut at several offsets, at 0.5x-8x;
- `decode-*`: seeded requests with long outputs (64-600 tokens) into a device pool their decode
  overflows: decode allocation step by step, retraction, re-admission;
- `shape-*`: the harness's seeded shapes (burst, chunk, pressure, tiered) with what their CI cases
  do not vary: long outputs, page 16, priority eviction with priorities, mixed chunk + hrrn.
Every row: exit as the driver's (0 agree, 1 differ, 5 SGLang's Scheduler raised, 2 not runnable on a CPU), steps and requests
that differ, the first diverging step's one-line digest. Results go to OUT/results.jsonl (a run
resumes: rows already there are skipped), the table to stdout with `--table`.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.sglang import drive
from tests.sglang import scheduler_harness as H

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
REAL = ("conversation_trace.jsonl", "synthetic_trace.jsonl", "arxiv_slice.jsonl")
SCHEDULES = ("fcfs", "lpm", "hrrn", "shortest-prefill-first")
WRITES = ("write_through", "write_back", "write_through_selective")
EVICTIONS = ("lru", "lfu", "fifo", "mru", "filo", "slru", "tlru", "priority")
PREFETCH = ("timeout", "best_effort", "wait_complete")


@dataclass
class Case:
    cid: str
    family: str
    argv: list = field(default_factory=list)  # drive's options (trace first), or
    make: object = None  # a Workload factory
    core: str = "rust"
    prep: object = None  # writes the trace the argv names


# --- traces the campaign writes ------------------------------------------------------------------
def _synth(path: Path, kind: str, n: int, seed: int, rate: float) -> None:
    """A `tierdiag synth` trace (gzip'd when the name ends in .gz)."""
    from tierdiag.trace.synth import SynthConfig, synth_to_file

    synth_to_file(path, SynthConfig(kind=kind, num_requests=n, seed=seed, rate_per_s=rate))


def _slice(path: Path, name: str, offset: int, n: int) -> None:
    with (TRACES / name).open() as f:
        lines = [ln for i, ln in enumerate(f) if offset <= i < offset + n]
    text = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def _fits(name: str, offset: int, n: int) -> int:
    """The least power-of-two device pool the slice's longest request (input + output) fits."""
    with (TRACES / name).open() as f:
        longest = max(d["input_length"] + d["output_length"]
                      for d in (json.loads(ln) for i, ln in enumerate(f) if offset <= i < offset + n))
    return 1 << (longest + 64).bit_length()


# --- workloads the campaign builds ---------------------------------------------------------------
def shape(seed: int, *, shape_: str, page_size: int, schedule_policy: str, write_policy: str, eviction_policy: str,
          outputs: tuple[int, int], mixed_chunk: bool) -> H.Workload:
    return H.seeded(seed, page_size=page_size, shape=shape_, schedule_policy=schedule_policy,
                    write_policy=write_policy, eviction_policy=eviction_policy, outputs=outputs,
                    mixed_chunk=mixed_chunk)


_SHORT = {"--page-size": "p", "--device-tokens": "d", "--host-tokens": "h", "--max-prefill-tokens": "b",
          "--storage-tokens": "st", "--speedup": "x", "--arrivals": "", "--enable-mixed-chunk": "mixed",
          "--prefetch-policy": "", "--schedule-policy": "", "--write-policy": "", "--eviction-policy": ""}


def _compact(o: list) -> str:
    """Drive's options as a short id: `--page-size 16` -> p16, a policy by its name."""
    parts, i = [], 0
    while i < len(o):
        key = _SHORT[o[i]]
        if o[i] == "--enable-mixed-chunk":
            parts.append(key)
            i += 1
            continue
        parts.append(f"{key}{o[i + 1]}")
        i += 2
    return "-".join(parts)


def campaign(seed: int, out: Path) -> list[Case]:
    """The campaign's workloads: a fixed function of the seed."""
    rnd = random.Random(f"hunt/{seed}")
    tr = out / "traces"
    cases: list[Case] = []

    def opts(*, pages=(16, 64), sched=SCHEDULES, storage=0.25, mixed=0.25):
        o = ["--page-size", str(rnd.choice(pages)), "--schedule-policy", rnd.choice(sched),
             "--write-policy", rnd.choice(WRITES), "--eviction-policy", rnd.choice(EVICTIONS)]
        if rnd.random() < mixed:
            o.append("--enable-mixed-chunk")
        if rnd.random() < 0.3:
            o += ["--max-prefill-tokens", str(rnd.choice((1000, 2048, 3000, 4096, 16384)))]
        if rnd.random() < storage:
            o += ["--storage-tokens", "4000000", "--prefetch-policy", rnd.choice(PREFETCH)]
        return o

    # synth traces: every kind, rates 0.5x-8x of 2/s, pools tiny to huge
    for i in range(40):
        kind = ("agent", "multi-turn", "system-prompt", "mixed")[i % 4]
        s = rnd.randrange(1000)
        rate = 2.0 * rnd.choice((0.5, 1, 2, 4, 8))
        n = rnd.choice((100, 150, 200))
        gz = rnd.random() < 0.2
        path = tr / f"synth-{kind}-s{s}-r{rate:g}-n{n}.jsonl{'.gz' if gz else ''}"
        dev = rnd.choice((24576, 32768, 65536, 131072, 1 << 20))
        host = rnd.choice((None, dev, dev // 2 + 4096))
        if host is not None and host < dev:  # HiCache needs host >= device (hicache_ratio >= 1)
            host = 2 * dev
        o = opts() + ["--device-tokens", str(dev)] + ([] if host is None else ["--host-tokens", str(host)])
        if kind in ("agent", "multi-turn") and rnd.random() < 0.3:
            o += ["--arrivals", "trace"]
        cid = f"synth-{kind}-s{s}-r{rate:g}-n{n}{'-gz' if gz else ''}-{_compact(o)}"
        cases.append(Case(cid, "synth", [str(path), "--requests", str(n)] + o,
                          prep=(_synth, path, kind, n, s, rate)))
    # real traces cut at offsets
    for i in range(24):
        name = REAL[i % 3]
        total = {"conversation_trace.jsonl": 12031, "synthetic_trace.jsonl": 3993, "arxiv_slice.jsonl": 999}[name]
        n = rnd.choice((60, 100, 150))
        off = rnd.randrange(0, total - n)
        gz = rnd.random() < 0.2
        path = tr / f"{name.split('_')[0]}-o{off}-n{n}.jsonl{'.gz' if gz else ''}"
        speed = rnd.choice((0.5, 1, 2, 4, 8))
        dev = rnd.choice((65536, 131072, 262144))
        dev = max(dev, _fits(name, off, n))  # SGLang waits forever for a request past the pool
        o = opts() + ["--device-tokens", str(dev), "--speedup", str(speed)]
        cid = f"slice-{path.name}-{_compact(o)}"
        cases.append(Case(cid, "slice", [str(path), "--requests", str(n)] + o, prep=(_slice, path, name, off, n)))
    # decode pressure (long outputs, retraction)
    for i in range(24):
        s = rnd.randrange(1000)
        ps = rnd.choice((1, 16, 64))
        dev = rnd.choice((3072, 4096, 6144, 8192))
        outputs = rnd.choice(((32, 128), (64, 256), (100, 600)))
        sp, wp, ep = rnd.choice(SCHEDULES), rnd.choice(WRITES), rnd.choice(EVICTIONS)
        mixed = rnd.random() < 0.3
        n = rnd.choice((40, 60, 100))
        gap = rnd.choice((2, 8, 20))
        budget = rnd.choice((512, 1000, 1024, 2048))
        cid = f"decode-s{s}-p{ps}-d{dev}-o{outputs[0]}_{outputs[1]}-n{n}-g{gap}-b{budget}-{sp}-{wp}-{ep}" + \
              ("-mixed" if mixed else "")
        cases.append(Case(cid, "decode", make=(H.decode_pressure, s, dict(
            page_size=ps, n=n, device_tokens=dev, outputs=outputs, schedule_policy=sp, write_policy=wp,
            eviction_policy=ep, mixed_chunk=mixed, gap_ms=gap, budget=budget)),
                          core="python" if rnd.random() < 0.15 else "rust"))
    # the harness's seeded shapes with what CI does not vary
    for i in range(24):
        s = rnd.randrange(10, 1000)
        shp = rnd.choice(("burst", "chunk", "pressure", "tiered"))
        ps = rnd.choice((1, 16, 64))
        sp, wp, ep = rnd.choice(SCHEDULES), rnd.choice(WRITES), rnd.choice(EVICTIONS)
        outputs = rnd.choice(((1, 9), (16, 64), (64, 200)))
        mixed = rnd.random() < 0.3
        cid = f"shape-{shp}-s{s}-p{ps}-o{outputs[0]}_{outputs[1]}-{sp}-{wp}-{ep}" + ("-mixed" if mixed else "")
        cases.append(Case(cid, "shape", make=(shape, s, dict(shape_=shp, page_size=ps, schedule_policy=sp,
                                                             write_policy=wp, eviction_policy=ep, outputs=outputs,
                                                             mixed_chunk=mixed))))
    # interleaved (synth, slice, decode, shape, synth, ...): a run cut short has seen every family
    fams: dict[str, list[Case]] = {}
    for c in cases:
        fams.setdefault(c.family, []).append(c)
    return [c for group in itertools.zip_longest(*fams.values()) for c in group if c is not None]


# --- running -------------------------------------------------------------------------------------
def _digest(rep: H.Report) -> str:
    if rep.error:
        return "SGLang raised: " + rep.error.splitlines()[0][:200]
    if not rep.first_step:
        return (rep.first_request or "").splitlines()[0][:200] if rep.first_request else ""
    lines = rep.first_step.splitlines()
    fields = [ln.strip().split(":")[0] for ln in lines[1:] if re.match(r"\s+\w+: sglang=", ln)]
    return f"{lines[0].split(': ')[1]}: {', '.join(fields)}"


def run_case(worker, c: Case) -> dict:
    row = {"id": c.cid, "family": c.family, "core": c.core}
    t0 = time.time()
    try:
        if c.make is not None:
            fn, s, kw = c.make
            w = fn(s, **kw)
        else:
            if c.prep is not None and not Path(c.prep[1]).exists():
                c.prep[1].parent.mkdir(parents=True, exist_ok=True)
                c.prep[0](*c.prep[1:])
            _, w = drive.prepare(c.argv)
    except drive.DriveError as exc:
        row.update(exit=exc.code, note=str(exc)[:200], wall_s=round(time.time() - t0, 1))
        return row
    rep = H.run_both(worker, w, (), c.core)
    row.update(exit=drive.SGLANG_FAILED if rep.sglang_raised else drive.AGREE if rep.clean else drive.DIFFER, name=w.name, requests=rep.requests,
               steps=rep.steps, differing_steps=rep.differing_steps, differing_requests=rep.differing_requests,
               differing_splits=rep.differing_splits, differing_ttft=rep.differing_ttft,
               ttft_p50=rep.ttft_ratio_p50, ttft_p90=rep.ttft_ratio_p90, note=_digest(rep),
               summary=None if rep.clean else rep.summary()[:6000], wall_s=round(time.time() - t0, 1))
    return row


def _verdict(r: dict | None) -> str:
    if r is None:
        return "-"
    if r["exit"] in (0, 1) and "steps" in r:
        v = "agree" if r["exit"] == 0 else (f"differ: {r['differing_steps']} of {r['steps']} steps, "
                                            f"{r['differing_requests']} of {r['requests']} requests")
        return v if r["exit"] == 0 or not r.get("note") else f"{v} ({r['note']})"
    return f"exit {r['exit']}: {r.get('note', '')}"


def table(rows: list[dict], final: dict | None = None) -> str:
    """One row a workload: its verdict, and (`final`: the same workloads run again on a later
    engine, by id) what it is now."""
    final = final or {}
    head = ["| workload | verdict | now |", "|---|---|---|"]
    for r in rows:
        now = final.get(r["id"])
        head.append(f"| `{r['id']}` | {_verdict(r)} | {_verdict(now) if now else 'same'} |")
    return "\n".join(head)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} must be 0 to 2^63 - 1")
    return value


def _limit(text: str) -> int:
    value = _seed(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.sglang.hunt", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--only", type=_pattern, help="run the workloads whose id matches this regular expression")
    p.add_argument("--limit", type=_limit, help="at most this many workloads")
    p.add_argument("--out", type=Path, default=Path("/tmp/tierdiag-hunt"))
    p.add_argument("--list", action="store_true", help="list the workloads and stop")
    p.add_argument("--table", action="store_true", help="print the results' table and stop")
    p.add_argument("--rerun", action="store_true", help="run rows already in the results again")
    p.add_argument("--final", type=Path, help="with --table: a later run's results folder (the 'now' column)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    out = a.out / f"seed{a.seed}"
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    cases = campaign(a.seed, out)
    if a.only:
        cases = [c for c in cases if re.search(a.only, c.cid)]
    if a.limit:
        cases = cases[:a.limit]
    done = {}
    if results.exists():
        for line in results.read_text().splitlines():
            r = json.loads(line)
            done[r["id"]] = r
    if a.list:
        print("\n".join(c.cid for c in cases))
        return 0
    if a.table:
        final = {}
        if a.final is not None and (a.final / f"seed{a.seed}" / "results.jsonl").exists():
            for line in (a.final / f"seed{a.seed}" / "results.jsonl").read_text().splitlines():
                r = json.loads(line)
                final[r["id"]] = r
        print(table([done[c.cid] for c in cases if c.cid in done], final))
        return 0
    from tests.sglang.differential import Worker
    from tests.support.sglang_wheels import wheel_root

    worker = Worker(drive.VERSION, wheel_root(drive.VERSION))
    try:
        for c in cases:
            if c.cid in done and not a.rerun:
                continue
            try:
                row = run_case(worker, c)
            except (RuntimeError, ValueError) as exc:  # the worker died or answered garbage: a fresh one
                row = {"id": c.cid, "family": c.family, "exit": 1, "note": f"worker: {type(exc).__name__}: {exc}"}
                worker.close()
                worker = Worker(drive.VERSION, wheel_root(drive.VERSION))
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['exit']} {row.get('wall_s', '-')}s {c.cid} {row.get('note', '')}", flush=True)
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
