"""targets41's storage and `--dp 8` rows for two checkouts side by side (issue 41): the probed
replay, `--storage-tokens 50000000` and `--dp 8 --router cache_aware` of the same trace, whole
processes (scale.py's launcher: wall, CPU with the writer process's), each checkout's engine
imported from its own root, interleaved (the order flips every round), medians. The ratios are
targets41's: storage / probed, dp 8 / probed, each within its checkout.

    .venv/bin/python benchmarks/storage_dp.py --code BASE [--trace FILE] [--repeats 3] [--modes probes,dp8]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402

DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
MODES = {"probes": (), "storage": ("--storage-tokens", 50_000_000), "dp8": ("--dp", 8, "--router", "cache_aware")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, required=True, help="the checkout to compare with (built)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="which of probes, storage, dp8 (probes always)")
    a = ap.parse_args()
    unknown = set(a.modes.split(",")) - set(MODES)
    if unknown:
        ap.error(f"--modes: unknown {', '.join(sorted(unknown))} (of {', '.join(MODES)})")
    modes = {m: MODES[m] for m in MODES if m in a.modes.split(",") or m == "probes"}
    roots = {"before": a.code.resolve(), "after": ROOT}
    runs: dict[tuple[str, str], list[dict]] = {(c, m): [] for c in roots for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            order = [(c, m) for m in modes for c in roots]
            for c, m in order if i % 2 == 0 else order[::-1]:
                db = Path(tmp) / f"{c}-{m}-{i}.duckdb"
                r = scale.run(["replay", a.trace, "--db", db, "--json", *modes[m]], root=roots[c])
                shutil.rmtree(db.with_suffix(".storage"), ignore_errors=True)
                runs[(c, m)].append(r)
                print(f"{c} {m} #{i + 1}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU", file=sys.stderr)
    med = {k: (statistics.median(r["wall_s"] for r in v), statistics.median(r["cpu_s"] for r in v))
           for k, v in runs.items()}
    print(f"{a.trace.name}, {a.repeats} interleaved rounds, medians (wall / CPU s); before {roots['before']}")
    print("| | before | after |\n|---|---|---|")
    for m in modes:
        print(f"| {m} | " + " | ".join(f"{med[(c, m)][0]:.2f} / {med[(c, m)][1]:.2f}" for c in roots) + " |")
    for m, what in (("storage", "storage / probes"), ("dp8", "dp 8 / probes")):
        if m not in modes:
            continue
        cells = []
        for c in roots:
            w, p = med[(c, m)], med[(c, "probes")]
            cells.append(f"{w[0] / p[0]:.2f}x (CPU {w[1] / p[1]:.2f}x)")
        print(f"| {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
