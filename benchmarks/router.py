"""The cache-aware router alone over a trace (issue 41, the `--dp 8` row): `Gateway.route` of
every request as the deployment builds it (RequestView of its page keys, one tick a request),
each finished at once (loads 0: the cache-aware branch every time), with the approximate tree
of runs (`ApproxTree`, what the router uses) and the tree of a tick a key (`ApproxTreeByKey`, its
reference), interleaved. CPU seconds (`time.process_time`), min and median of the repeats; the
decisions of the two trees are compared (they must be the same).

    .venv/bin/python benchmarks/router.py [--trace FILE] [--requests N] [--dp 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def views(trace: Path, requests: int | None):
    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.routing import RequestView
    from tierdiag.trace.pages import page_keys_array
    from tierdiag.trace.reader import ReadReport, read_trace

    cfg = EngineConfig()
    reqs = list(read_trace(trace, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
    reqs = reqs[:requests] if requests else reqs
    ps = cfg.page_size
    out = []
    for t in reqs:
        keys = page_keys_array(t, page_size=ps, block_size=cfg.block_size).tolist()
        out.append((RequestView(t.req_id, keys, t.input_len, ps, t.session), t.arrival_ns))
    return out


def run(reqs, dp: int, tree_cls) -> tuple[float, list]:
    from tierdiag.engine.routing import Gateway, RouterConfig

    gw = Gateway(RouterConfig(router="cache_aware"), dp)
    gw.router.tree = tree_cls(dp)
    gc.collect()
    decisions = []
    t0 = time.process_time()
    for view, now in reqs:
        d = gw.route(view, now)
        gw.finish(d.rank, view, now)
        decisions.append((d.rank, d.branch, d.score))
    return time.process_time() - t0, decisions


def main() -> None:
    from tierdiag.engine.routing.approx_tree import ApproxTree, ApproxTreeByKey

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    reqs = views(a.trace, a.requests)
    trees = {"runs (ApproxTree)": ApproxTree, "a tick a key (ApproxTreeByKey)": ApproxTreeByKey}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    seen = []
    for i in range(a.repeats):
        order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
        for name, cls in order:
            s, decisions = run(reqs, a.dp, cls)
            cpu[name].append(s)
            seen.append(decisions)
    same = all(d == seen[0] for d in seen)
    print(f"{a.trace.name}: {len(reqs)} requests, --dp {a.dp}, cache_aware, {a.repeats} interleaved rounds; "
          f"decisions identical: {same}")
    print("| tree | CPU s min | median |\n|---|---|---|")
    for name, v in cpu.items():
        v = sorted(v)
        print(f"| {name} | {v[0]:.3f} | {v[len(v) // 2]:.3f} |")
    if not same:
        raise SystemExit("the two trees decided differently")


if __name__ == "__main__":
    main()
