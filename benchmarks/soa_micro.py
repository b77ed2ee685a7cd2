"""A node's slot run, four ways, under mypyc (issue 41, session 21, h41soa): the operations the
engine does on a TreeNode's `device` / `host` slots (engine/tree.py, controller.py), timed per
run of L slots, compiled by mypyc in a temporary folder the way setup.py compiles the engine.

    .venv/bin/python benchmarks/soa_micro.py [--lengths 8,64,256] [--runs 4000] [--repeats 7]

Representations:
  list   list[int] of the pool's lent ints (today: SlotCore._alloc_c hands out the pool's own
         int objects; a slice increfs each, a free decrefs each, ints_load reads each)
  array  array('q') (8 bytes a slot; a slice is a memcpy; C reads it as a buffer)
  vec    librt.vecs.vec[i64] (mypyc 2.4's unboxed vector; a native struct in compiled code,
         boxed to an object where it leaves compiled code; C reads the box's buffer)
  bytes  8 bytes a slot in a bytes object (a slice is a memcpy; no item access without a cast)

Operations (each over `--runs` runs of L slots drawn at random from a 200,000-slot pool, so
the list's items are scattered int objects as a long replay's are):
  split    x[:L//2] and x[L//2:] made and dropped (TreeNode split; the halves' frees included)
  concat   x + y of two halves (a request's slots put together)
  to_c     one call into the C data plane reading the run (`_cplane.blame` with maps of one key
           set: its ints_load then one map read a slot; the same work after the load for all)
  iterate  a compiled loop over the slots (sum)
  free     the run dropped (the last reference: the list decrefs every item)
Medians of `--repeats` (ns per run), each representation interleaved with the others.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The operations per representation: one template each, its run type and index type filled in
# (mypyc compiles each to that type's own code); vec and bytes differ where noted.
_TEMPLATES = {
    "split": """
def split_{name}(runs: list[{T}], k: {K}) -> int:
    t = 0
    for x in runs:
        a = x[:k * {W}]
        b = x[k * {W}:]
        t += len(a) + len(b)
    return t
""",
    "concat": """
def concat_{name}(runs: list[{T}], k: {K}) -> int:
    t = 0
    for x in runs:
        y = x + x
        t += len(y)
    return t
""",
    "to_c": """
def to_c_{name}(runs: list[{T}], f: Callable[..., Any], cached: Any, demoted: Any) -> int:
    t = 0
    for x in runs:
        t += f(cached, demoted, {VIEW}, None, 64)
    return t
""",
    "iterate": """
def iterate_{name}(runs: list[{T}], k: {K}) -> {SUM}:
    t: {SUM} = 0
    for x in runs:
        for s in {ITEMS}:
            t += s
    return t
""",
}
_KINDS = {  # name: run type, index type, bytes an item in a slice, what C is handed, the items, the sum's type
    "list": dict(T="list[int]", K="int", W=1, VIEW="x", ITEMS="x", SUM="int"),
    "array": dict(T="Any", K="int", W=1, VIEW="x", ITEMS="x", SUM="int"),
    "vec": dict(T="vec[i64]", K="i64", W=1, VIEW="x", ITEMS="x", SUM="i64"),
    "bytes": dict(T="bytes", K="int", W=8, VIEW='memoryview(x).cast("q")', ITEMS='memoryview(x).cast("q")', SUM="int"),
}
_HEAD = """
from array import array
from typing import Any, Callable
from librt.vecs import append, vec
from mypy_extensions import i64


def concat_vec(runs: list[vec[i64]], k: i64) -> int:
    # (vec[i64] has no `+`: joined by appends, as compiled code would)
    t = 0
    for x in runs:
        y = vec[i64]()
        for s in x:
            y = append(y, s)
        for s in x:
            y = append(y, s)
        t += len(y)
    return t


def free_any(runs: list[Any]) -> int:
    n = len(runs)
    runs.clear()
    return n
"""
OPS_SOURCE = _HEAD + "".join(
    template.format(name=name, **fields)
    for op, template in _TEMPLATES.items() for name, fields in _KINDS.items()
    if not (op == "concat" and name == "vec"))

KINDS = ("list", "array", "vec", "bytes")
OPS = ("split", "concat", "to_c", "iterate", "free")


def build_ops(tmp: Path):
    """Compile OPS_SOURCE with mypyc (the engine's compiler) in `tmp` and import it."""
    src = tmp / "soa_ops.py"
    src.write_text(OPS_SOURCE)
    mypyc = Path(sys.executable).with_name("mypyc")
    subprocess.run([str(mypyc), "soa_ops.py"], cwd=tmp, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    sys.path.insert(0, str(tmp))
    import soa_ops  # noqa: E402

    assert soa_ops.__file__.endswith(".so"), soa_ops.__file__
    return soa_ops


def make_runs(kind: str, slot_runs: list[list[int]], ints: tuple):
    from array import array

    from librt.vecs import vec
    from mypy_extensions import i64

    if kind == "list":
        return [[ints[s] for s in run] for run in slot_runs]  # the pool's lent ints
    if kind == "array":
        return [array("q", run) for run in slot_runs]
    if kind == "vec":
        return [vec[i64](run) for run in slot_runs]
    return [array("q", run).tobytes() for run in slot_runs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="8,64,256")
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import numpy as np

    from tierdiag.native import cplane

    blame = cplane.compiled("blame")
    assert blame is not None, "the compiled data plane is not built (setup.py build_ext --inplace)"
    pool = 200_000
    ints = tuple(range(pool))
    from tierdiag.engine.pagemap import PageMap

    cached, demoted = PageMap(), PageMap()  # two maps of nothing set, grown over the pool
    for m in (cached, demoted):
        m.set_many([pool - 1], 0)
    rng = random.Random(41)
    with tempfile.TemporaryDirectory() as tmp:
        ops = build_ops(Path(tmp))
        print(f"ns per run of L slots, median of {args.repeats} ({args.runs} runs a repeat; "
              f"load {os.getloadavg()[0]:.2f})")
        print(f"{'L':>5} {'op':<8} " + " ".join(f"{k:>9}" for k in KINDS) + "   array/list  vec/list")
        for length in (int(x) for x in args.lengths.split(",")):
            slot_runs = [rng.sample(range(pool), length) for _ in range(args.runs)]
            k = length // 2
            for op in OPS:
                times: dict[str, list[float]] = {kind: [] for kind in KINDS}
                for _ in range(args.repeats):
                    for kind in KINDS:
                        runs = make_runs(kind, slot_runs, ints)
                        fn = getattr(ops, f"{op}_{kind}", None) if op != "free" else ops.free_any
                        t0 = time.perf_counter_ns()
                        if op == "to_c":
                            fn(runs, blame, cached, demoted)
                        elif op == "free":
                            fn(runs)
                        else:
                            fn(runs, k)
                        times[kind].append((time.perf_counter_ns() - t0) / args.runs)
                        del runs
                med = {kind: statistics.median(v) for kind, v in times.items()}
                print(f"{length:>5} {op:<8} " + " ".join(f"{med[k]:>9.0f}" for k in KINDS)
                      + f"   {med['array'] / med['list']:>9.2f} {med['vec'] / med['list']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
