"""Whether two recorded runs stored the same run evidence (issue 41: the close's sections made
differently must store what they stored before): each store's `run_evidence` rows (version and
JSON; the run id, which names the run, replaced by RID, and `created_at` left out) and its
`request_lookup` rows (run id aside), compared section by section.

    .venv/bin/python benchmarks/compare_evidence.py BEFORE.duckdb AFTER.duckdb [--ignore KEY ...]

`--ignore KEY` leaves a JSON key out wherever it appears (a storage run's `storage_dir` names a
folder after its store file). Prints one line a section (`same` or where it first differs) and
exits 1 when anything differs, 0 when all is the same. benchmarks/compare_rows.py compares the
rows of every table; this the evidence stored beside them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import duckdb


def _strip(value, ignore: set[str]):
    if isinstance(value, dict):
        return {k: _strip(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_strip(v, ignore) for v in value]
    return value


def load(path: str, ignore: set[str]) -> dict:
    """{"version": ..., "sections": {name: JSON}, "lookup": (rows, sha256)} of the store's one run."""
    with duckdb.connect(path, read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        rows = con.execute("SELECT evidence_version, evidence_json FROM run_evidence WHERE run_id = ?",
                           [run_id]).fetchall()
        lookup = con.execute("SELECT * EXCLUDE (run_id) FROM request_lookup WHERE run_id = ? ORDER BY ALL",
                             [run_id]).fetchall()
    if len(rows) != 1:
        raise SystemExit(f"{path}: {len(rows)} run_evidence rows for run {run_id}, expected 1")
    version, raw = rows[0]
    sections = _strip(json.loads(raw.replace(run_id, "RID")), ignore)
    return {"version": version, "sections": sections,
            "lookup": (len(lookup), hashlib.sha256(repr(lookup).encode()).hexdigest())}


def first_difference(a, b, where: str = "") -> str | None:
    """Where `a` and `b` (JSON values) first differ, as a path; None where they are equal."""
    if type(a) is not type(b):
        return f"{where or '.'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}.{key}: only in {'after' if key not in a else 'before'}"
            got = first_difference(a[key], b[key], f"{where}.{key}")
            if got:
                return got
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            got = first_difference(x, y, f"{where}[{i}]")
            if got:
                return got
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--ignore", action="append", default=[], help="a JSON key left out wherever it appears")
    args = ap.parse_args(argv)
    ignore = set(args.ignore)
    a, b = load(args.before, ignore), load(args.after, ignore)
    same = True
    if a["version"] != b["version"]:
        print(f"evidence_version: {a['version']} vs {b['version']}")
        same = False
    for name in sorted(set(a["sections"]) | set(b["sections"])):
        diff = first_difference(a["sections"].get(name), b["sections"].get(name), name)
        print(f"{name:>16}: {'same' if diff is None else 'DIFFERS at ' + diff}")
        same &= diff is None
    print(f"{'request_lookup':>16}: {'same' if a['lookup'] == b['lookup'] else 'DIFFERS'} ({a['lookup'][0]} rows)")
    same &= a["lookup"] == b["lookup"]
    print("run_evidence identical (run id and created_at aside)" if same else "run_evidence DIFFERS")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
