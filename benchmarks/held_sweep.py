"""h41held: `stored` workloads (tests/sglang/scheduler_harness.py) under best_effort, the engine
side run with the decode run-ahead and pass by pass (DecodeSteps.decode_ahead off), Python twin:
the cases where a run-ahead passed a held release due, and whether requests or prefill steps differ."""
import os
import random
import sys

os.environ["TIERDIAG_PURE_ENGINE"] = "1"

from tierdiag.engine import decode  # noqa: E402
from tests.sglang import scheduler_harness as H  # noqa: E402

past = [0]
_da = decode.DecodeSteps._decode_ahead


def decode_ahead(self, end, limit, wakes):
    held = [d for d, _ in self.held_releases]
    k0, p0 = self.dstep, self.prefetch_pass
    nxt = _da(self, end, limit, wakes)
    if held and self.dstep > k0 and min(held) <= p0 + (self.dstep - k0):
        past[0] += 1
    return nxt


decode.DecodeSteps._decode_ahead = decode_ahead
seeds = range(int(sys.argv[1]), int(sys.argv[2]))
OUTS = ((0, 0), (16, 64)) if len(sys.argv) < 4 else ((int(sys.argv[3]), int(sys.argv[4])),)
for seed in seeds:
    for ps in (1, 64):
        for wp in ("write_back", "write_through"):
            for system in (False, True):
                for outs in OUTS:
                    w = H.stored(seed, page_size=ps, write_policy=wp, prefetch_policy="best_effort",
                                 system_prompt=system)
                    if outs[0]:
                        rnd = random.Random(seed)
                        for r in w.requests:
                            r["output_len"] = rnd.randint(*outs)
                    past[0] = 0
                    decode.DecodeSteps.decode_ahead = True
                    a = H.run_engine(w, ())
                    n = past[0]
                    if not n:
                        continue
                    decode.DecodeSteps.decode_ahead = False
                    b = H.run_engine(w, ())
                    reqs = [k for k in a["requests"] if a["requests"][k] != b["requests"][k]]
                    pa = [(s["t"], repr(s["members"]))
                          for s in a["steps"] if s["kind"] == "prefill"]
                    pb = [(s["t"], repr(s["members"]))
                          for s in b["steps"] if s["kind"] == "prefill"]
                    print(f"seed {seed} page {ps} {wp} system {system} outputs {outs}: run-aheads past a held"
                          f" release {n}; requests differing {len(reqs)} {reqs[:3]}; prefill steps same"
                          f" {pa == pb}; evictions same {a['evictions'] == b['evictions']}", flush=True)
