"""The storage tier's compiled index on its own (issue 41, the storage row): a whole-trace storage
replay's index traffic, synthesised, timed in CPU seconds; two checkouts side by side.

    .venv/bin/python benchmarks/storage_index_micro.py [--code BASE] [--rounds 5] [--keys 2000000]
        [--capacity 781250] [--batch 70] [--touched 0.26] [--queries 100000]

The whole conversation trace with `--storage-tokens 50000000` admits ~2.0 M page keys in ~28k
writes (~70 a write, about a quarter of them already in the tier: touched), into a tier of
781,250 pages, so ~1.2 M pages are deleted once it is full; ~100k storage queries ask how many
of a request's keys the tier holds (most find none). This replays that shape: fresh random
62-bit int keys a write, a share of them taken from recent writes, `admit(keys, capacity, True)`
as the engine calls it, a `run` query between writes, and the engine's `place` of each write's
new keys (one segment, consecutive slots). Memory stalls are most of the index's time on a full
tier (tens of MB read at random), which valgrind does not count: hence CPU seconds, interleaved
rounds, medians, each checkout in its own process (its own build of `_cplane`).

Exit status: 0; 1 with a one-line message for an option out of range (or a checkout without
the compiled data plane); 2 for an option of the wrong type (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import gc, json, random, resource, sys, time
sys.path.insert(0, sys.argv[1])
from tierdiag.native import cplane
Index = cplane.compiled("StorageIndex")
if Index is None:
    raise SystemExit("the compiled data plane is not built in " + sys.argv[1])
keys_n, capacity, batch, touched, queries, seed = (int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                                   float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
rng = random.Random(seed)
writes = []
made_keys = []  # every new key so far; the touched ones come from the last 20,000
made = 0
while made < keys_n:
    n = rng.randint(1, 2 * batch - 1)
    lo = max(0, len(made_keys) - 20000)
    old = [made_keys[rng.randrange(lo, len(made_keys))] for _ in range(int(n * touched))] if made_keys else []
    new = [rng.getrandbits(62) for _ in range(n - len(old))]
    writes.append((old + new, len(old)))
    made_keys.extend(new)
    made += n
del made_keys
probes = [[rng.getrandbits(62) for _ in range(8)] for _ in range(max(1, queries // max(1, len(writes))))]
gc.disable()
SEGMENT = 262144  # a 64 MiB segment of 256-byte pages, as the replay's
try:
    ix = Index(min(capacity, 1 << 21))  # as StorageTier makes it (session 24: room for its capacity)
except TypeError:
    ix = Index()  # a checkout from before StorageIndex(reserve)
slot = 0
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.process_time()
for keys, _ in writes:
    deleted, fresh, emptied = ix.admit(keys, capacity, True)
    placed = keys if fresh is None else [keys[i] for i in fresh]
    seg, first = 1 + slot // SEGMENT, slot % SEGMENT
    if first + len(placed) > SEGMENT:  # (the engine starts a new segment: one here, whole)
        slot = seg * SEGMENT
        seg, first = 1 + slot // SEGMENT, 0
    ix.place(placed, seg, first)
    slot += len(placed)
    for q in probes:
        ix.run(q, 0)
t1 = time.process_time()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": t1 - t0, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
                  "writes": len(writes), "keys": made, "len": len(ix)}))
"""


def one(code: Path, a) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(code), str(a.keys), str(a.capacity), str(a.batch),
                           str(a.touched), str(a.queries), str(a.seed)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(code)})
    if proc.returncode:
        raise SystemExit(f"{code}: {proc.stderr.strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


LIMITS = {"keys": 100_000_000, "capacity": 2**31 - 2, "batch": 1_000_000, "queries": 100_000_000, "rounds": 1000}


def check(a) -> str | None:
    """The options' problem in one line, None when they are fine (a value of the wrong type is
    argparse's: exit 2; a value out of range: exit 1 with this line)."""
    for name, top in LIMITS.items():
        low = 0 if name == "queries" else 1
        value = getattr(a, name)
        if not low <= value <= top:
            return f"--{name} must be in [{low:,}, {top:,}], not {value!r}"
    if not 0 <= a.touched < 1:  # (NaN fails it too)
        return f"--touched must be in [0, 1), not {a.touched!r}"
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=None, help="another checkout (its _cplane built) to time beside this one")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--capacity", type=int, default=781_250)
    ap.add_argument("--batch", type=int, default=70)
    ap.add_argument("--touched", type=float, default=0.26)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    problem = check(a)
    if problem:
        raise SystemExit(f"storage_index_micro: {problem}")
    codes = {"this": ROOT} if a.code is None else {"base": a.code.resolve(), "this": ROOT}
    got: dict[str, list[dict]] = {k: [] for k in codes}
    for r in range(a.rounds):
        order = list(codes) if r % 2 == 0 else list(reversed(codes))
        for name in order:
            res = one(codes[name], a)
            got[name].append(res)
            print(f"round {r + 1} {name:>5}: CPU {res['cpu']:.3f} s (user {res['user']:.3f}, sys {res['sys']:.3f}); "
                  f"{res['writes']:,} writes, {res['keys']:,} keys, {res['len']:,} held", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; medians of {a.rounds} rounds")
    for name, runs in got.items():
        print(f"{name:>5}: CPU {statistics.median(r['cpu'] for r in runs):.3f} s, "
              f"user {statistics.median(r['user'] for r in runs):.3f} s, sys {statistics.median(r['sys'] for r in runs):.3f} s")


if __name__ == "__main__":
    main()
