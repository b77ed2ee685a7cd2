"""How long `calibrate --from` takes to fit: reading the rows, the robust fits, the held-out check.

A "server" (the engine as llama3-70b on an A100, tests/calibrate/server.py) replays a workload
of --requests requests; its rows become an SGLang 0.5.23 export, which is imported; then the fit
runs --repeats times under llama3-70b on an H200 and the median wall time is printed, with the
usable counts and the held-out error (a check that the fit being timed is the right one).

    PYTHONPATH=. .venv/bin/python benchmarks/calibrate_fit.py [--requests 600] [--noise 0.03]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.calibrate.server, tierdiag

from tests.calibrate.server import export_server, run_server, workload  # noqa: E402
from tierdiag.diagnose.twin.calibrate import Geometry, calibrate_run  # noqa: E402
from tierdiag.importers.load import import_sglang  # noqa: E402
from tierdiag.store.reader import open_store, resolve_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600, help="requests in the workload (about)")
    ap.add_argument("--noise", type=float, default=0.0, help="relative scatter added to the exported timings")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        per = max(a.requests - 6, 2)
        lines = workload(docs=6, unique=per * 2 // 5, revisits=per - per * 2 // 5)
        t = time.perf_counter()
        db, run_id = run_server(tmp, lines)
        export_server(db, run_id, tmp / "export", lines, noise=a.noise)
        odb = tmp / "obs.duckdb"
        s = import_sglang([tmp / "export"], db=odb)
        setup_s = time.perf_counter() - t
        walls = []
        with open_store(odb) as con:
            run = resolve_run(con, s.run_id)
            for _ in range(a.repeats):
                t = time.perf_counter()
                c = calibrate_run(con, run, Geometry("llama3-70b", "h200"), db_label=str(odb))
                walls.append(time.perf_counter() - t)
    h = c.heldout_prefill
    print(f"calibrate --from: {len(lines):,} requests ({c.usable.prefill_requests:,} usable for prefill in "
          f"{len(c.usable.prefill.observed_ns):,} batches, {len(c.usable.decode_ns):,} for decode), "
          f"noise {a.noise:.0%}: fit median {statistics.median(walls) * 1e3:,.0f} ms over {a.repeats} "
          f"(min {min(walls) * 1e3:,.0f} ms); held-out prefill error median {h.median_rel_error:.2%}; "
          f"kept {', '.join(c.kept)}; set-up (server replay, export, import) {setup_s:.1f} s")


if __name__ == "__main__":
    main()
