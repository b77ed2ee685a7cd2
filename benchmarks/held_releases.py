"""Issue 41 (h41held): count the held releases (`held_releases`, prefetch.py `_finish_prefetch`:
a prefetch ended at admission before its read's ack drained, its unread host slots freed by the
drain after the ack's) and the decode run-aheads that start while one is queued, on the Python
twin (TIERDIAG_PURE_ENGINE=1). Usage: held_releases.py TRACE [replay options...]"""
import os
import sys

os.environ["TIERDIAG_PURE_ENGINE"] = "1"

from tierdiag.engine import decode, prefetch  # noqa: E402

counts = {"finish_prefetch": 0, "held_appended": 0, "tail_held": 0, "runahead_with_held": 0,
          "runahead_passes_with_held_due": 0}
_fp = prefetch.StoragePrefetch._finish_prefetch


def finish_prefetch(self, req, now, *, acked=False):
    before = len(self.held_releases)
    tails = len(self.ctrl.prefetch_tails)
    counts["finish_prefetch"] += 1
    _fp(self, req, now, acked=acked)
    counts["held_appended"] += len(self.held_releases) > before
    counts["tail_held"] += len(self.ctrl.prefetch_tails) > tails


_da = decode.DecodeSteps._decode_ahead


def decode_ahead(self, end, limit, wakes):
    held = list(self.held_releases)
    k0 = self.dstep
    nxt = _da(self, end, limit, wakes)
    steps = self.dstep - k0
    if held and steps:
        counts["runahead_with_held"] += 1
        first = min(d for d, _ in held)
        counts["runahead_passes_with_held_due"] += steps
        print(f"run-ahead of {steps} passes with held releases due at passes {[d for d, _ in held]}"
              f" (prefetch_pass {self.prefetch_pass}, first due {first})", file=sys.stderr)
    return nxt


prefetch.StoragePrefetch._finish_prefetch = finish_prefetch
decode.DecodeSteps._decode_ahead = decode_ahead

from tierdiag.cli import exits  # noqa: E402
from tierdiag.cli.main import _app_for_argv  # noqa: E402

sys.argv = ["tierdiag", "replay", *sys.argv[1:]]
try:
    exits.run(_app_for_argv)
except SystemExit as exc:
    print("exit", exc.code, file=sys.stderr)
print(counts, file=sys.stderr)
