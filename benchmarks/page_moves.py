"""The data plane's page moves and content writes of a replay, alone, by two checkouts' compiled
data planes side by side (issue 41, session 23: the per-byte cost of `_cplane.move` and
`_cplane.write_content`, which were ~20 % of `Engine.run`'s CPU on the conversation trace).

    .venv/bin/python benchmarks/page_moves.py BASE_CHECKOUT [--trace FILE] [--requests N]
                                              [--rounds 4] [--repeats 3]

First this checkout's engine replays the trace (no probe; its Python twin, whose controller's
methods can be wrapped: the same calls as the compiled one's, tests/engine/test_compiled_engine.py)
and every backup, load-back and prefill write it hands the data plane is logged (the slot lists and
page keys, in order). Then each
round runs the log, in a fresh process a checkout (interleaved, the order flipped every round),
against fresh pools of the replay's geometry: `time.process_time()` around the moves and around
the content writes, `--repeats` passes a process (the smallest kept). The two sides must leave
the same bytes in both pools (an md5 of each, printed); BASE_CHECKOUT is a checkout with its
extensions built in place (setup.py build_ext --inplace).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

_LOG = """
import array, pickle, sys, tempfile
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.engine import compiled
from tierdiag.engine.controller import CacheController
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
assert compiled.describe()["mode"] != "compiled", "the log is taken from the Python twin (its methods wrap)"
cfg = EngineConfig()
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
log = []
def q(xs):
    return array.array("q", list(xs)).tobytes()
to_host, to_device, write_computed = CacheController._to_host, CacheController._to_device, CacheController.write_computed
def log_to_host(self, s, d):
    log.append(("m", True, q(s), q(d)))
    return to_host(self, s, d)
def log_to_device(self, s, d):
    log.append(("m", False, q(s), q(d)))
    return to_device(self, s, d)
def log_write(self, s, k):
    log.append(("w", True, q(s), q(k)))
    return write_computed(self, s, k)
CacheController._to_host, CacheController._to_device, CacheController.write_computed = log_to_host, log_to_device, log_write
with tempfile.TemporaryDirectory() as storage:
    engine = Engine(cfg, probe=None, storage_dir=storage)
    dev, host = engine.ctrl.device, engine.ctrl.host
    geometry = (dev.num_layers, dev.page_elems, dev.rows.shape, host.rows.shape)
    engine.run(reqs)
pickle.dump({{"geometry": geometry, "log": log}}, open({out!r}, "wb"))
print(len(log))
"""

_RUN = """
import array, hashlib, json, pickle, sys, time
sys.path.insert(0, {code!r})
import numpy as np
from tierdiag.native import cplane
got = pickle.load(open({log!r}, "rb"))
layers, elems, dshape, hshape = got["geometry"]
ops = []
for kind, dev, a, b in got["log"]:
    s, d = array.array("q"), array.array("q")
    s.frombytes(a)
    d.frombytes(b)
    ops.append((kind, dev, s, d))
row = np.dtype((np.void, layers * elems * 8))
move, write = cplane.compiled("move"), cplane.compiled("write_content")
best = None
for _ in range({repeats!r}):
    devb = np.zeros((dshape[1], layers * elems), np.int64)
    hostb = np.zeros((hshape[1], layers * elems), np.int64)
    dev, host = devb.view(row).reshape(1, -1), hostb.view(row).reshape(1, -1)
    tm = tw = 0.0
    for kind, on_dev, s, d in ops:
        t = time.process_time()
        if kind == "m":
            assert (move(dev, s, host, d) if on_dev else move(host, s, dev, d)) >= 0
            tm += time.process_time() - t
        else:
            assert write(dev if on_dev else host, s, d, layers, elems) >= 0
            tw += time.process_time() - t
    if best is None or tm + tw < best[0] + best[1]:
        best = (tm, tw)
print(json.dumps({{"move": best[0], "write": best[1],
                  "md5": hashlib.md5(devb.tobytes()).hexdigest()[:12] + "/" + hashlib.md5(hostb.tobytes()).hexdigest()[:12]}}))
"""


def _python(code: Path, script: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=code,
                          env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", **env})
    if proc.returncode:
        raise SystemExit(f"{code}: failed: {proc.stderr.strip().splitlines()[-3:]}")
    return proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the checkout to compare with (built in place)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None, help="the first N requests (default: all)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="passes over the log a process (the best kept)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or (args.requests is not None and args.requests < 1):
        raise SystemExit("--rounds, --repeats and --requests must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "ops.pkl")
        n = _python(ROOT, _LOG.format(code=str(ROOT), trace=str(args.trace.resolve()), requests=args.requests, out=log),
                    TIERDIAG_PURE_ENGINE="1")
        print(f"{n} moves and writes logged from this checkout's replay of {args.trace.name}")
        sides = {"before": args.base.resolve(), "after": ROOT}
        got: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for side in order:
                got[side].append(json.loads(_python(sides[side], _RUN.format(code=str(sides[side]), log=log,
                                                                             repeats=args.repeats))))
            print(f"round {r + 1}: " + ", ".join(f"{s} move {got[s][-1]['move']:.3f} s write {got[s][-1]['write']:.3f} s"
                                                for s in ("before", "after")))
    for part in ("move", "write"):
        b = statistics.median(x[part] for x in got["before"])
        a = statistics.median(x[part] for x in got["after"])
        print(f"{part}: before {b:.3f} s, after {a:.3f} s (CPU, medians of {args.rounds}): {b / a:.2f}x")
    sums = {s: {x["md5"] for x in got[s]} for s in got}
    same = sums["before"] == sums["after"] and len(sums["before"]) == 1
    print(f"pool bytes: {'identical' if same else 'DIFFER'} ({', '.join(sorted(sums['before'] | sums['after']))})")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
