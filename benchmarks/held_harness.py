"""h41held: the held releases (prefetch.py `held_releases`) that the decode run-ahead passes, on
the tests/sglang scheduler harness's storage workloads (the engine side only, storage priced at
0 as the harness prices it), on the Python twin. Usage: held_harness.py [OUTPUT_MIN OUTPUT_MAX]"""
import os
import random
import sys

os.environ["TIERDIAG_PURE_ENGINE"] = "1"

from tierdiag.engine import decode  # noqa: E402
from tests.sglang import scheduler_harness as H  # noqa: E402

stats = {"runahead_past_held_due": 0, "held_seen": 0}
_da = decode.DecodeSteps._decode_ahead


def decode_ahead(self, end, limit, wakes):
    held = [d for d, _ in self.held_releases]
    k0, p0 = self.dstep, self.prefetch_pass
    nxt = _da(self, end, limit, wakes)
    if held:
        stats["held_seen"] += 1
    steps = self.dstep - k0
    # the loop's passes p0+1 .. p0+steps ran here: a release due at one of them was not drained
    if held and steps and min(held) <= p0 + steps:
        stats["runahead_past_held_due"] += 1
        print(f"  run-ahead of {steps} passes from pass {p0 + 1}, held due {held}", file=sys.stderr)
    return nxt


decode.DecodeSteps._decode_ahead = decode_ahead
lo, hi = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (0, 0)
for name, make, _core in H.storage_cases():
    w = make()
    if lo:
        rnd = random.Random(5)
        for r in w.requests:
            r["output_len"] = rnd.randint(lo, hi)
    before = dict(stats)
    H.run_engine(w, ())
    print(name, {k: stats[k] - before[k] for k in stats}, flush=True)
