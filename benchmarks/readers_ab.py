"""The read commands before and after a change, side by side: `summary` and `explain` (text and
--json) on the given stores, by this checkout and by a baseline, their outputs compared byte for
byte, then timed as whole processes (start-up included), interleaved, medians of wall and CPU.

    .venv/bin/python benchmarks/readers_ab.py --db RUN.duckdb [--db ...] [--baseline REF|DIR] [--rounds N]
        [--instructions] [--json FILE]

--baseline: a git ref (checked out detached in a temporary worktree, its C data plane built as
`make` would) or the directory of a checkout; default `main`. Both checkouts are byte-compiled
first, as an installed package is (where PYTHONDONTWRITEBYTECODE is set a checkout without .pyc
files would compile its modules in every timed run), and a checkout that keeps dataclasses'
generated methods (cli/dataclass_code.py) has that table built the same way. `explain` explains
each store's slowest request (`slow --top 1 --ids`). `--instructions`: each command once more by
each checkout under valgrind's cachegrind (instructions: what a loaded machine cannot move).
Exit 1 when an output differs. Nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import compileall
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale  # noqa: E402  (benchmarks/scale.py: a command's own wall, CPU and peak RSS)

ROOT = HERE.parent


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _checkout(ref: str, tmp: Path) -> tuple[Path, bool]:
    """(the baseline's root, whether this made it)."""
    if Path(ref).is_dir():
        return Path(ref).resolve(), False
    where = tmp / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), ref], check=True,
                   capture_output=True, text=True)
    if (where / "setup.py").is_file():
        built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=where,
                               capture_output=True, text=True)
        if built.returncode:
            _say(f"baseline {ref}: its C data plane did not build; it runs without it")
    return where, True


def _output(args: list[str], root: Path) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `tierdiag ARGS` imported from `root`."""
    import os

    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "120"}
    proc = subprocess.run(scale.TIERDIAG + [str(a) for a in args], capture_output=True, text=True, cwd=root, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {i + 1}: {x!r} != {y!r}"
    return f"lengths differ: {len(a.splitlines())} / {len(b.splitlines())} lines"


def compare(dbs: list[str], base: Path) -> tuple[list[dict[str, Any]], dict[str, list[list[str]]]]:
    """Each command's output by both checkouts; the timed commands per store."""
    rows, timed = [], {}
    for db in dbs:
        code, out, err = _output(["slow", "--db", db, "--top", 1, "--ids"], ROOT)
        req = out.strip().splitlines()[0] if code == 0 and out.strip() else "1"
        cmds = [["summary", "--db", db], ["summary", "--db", db, "--json"],
                ["explain", req, "--db", db], ["explain", req, "--db", db, "--json"]]
        timed[db] = [cmds[0], cmds[2]]
        for args in cmds:
            new, old = _output(args, ROOT), _output(args, base)
            same = new == old
            rows.append({"db": db, "command": " ".join(str(a) for a in args if a not in ("--db", db)),
                         "identical": same, "bytes": len(new[1]),
                         "difference": None if same else (f"exit {old[0]} -> {new[0]}" if old[0] != new[0] else
                                                          _first_difference(old[1] + old[2], new[1] + new[2]))})
            _say(f"readers_ab: {rows[-1]['command']} on {Path(db).name}: "
                 f"{'identical' if same else 'DIFFERS: ' + rows[-1]['difference']}")
    return rows, timed


def _build_tables(root: Path) -> None:
    """The checkout's table of dataclass methods (cli/dataclass_code.py), where it has one."""
    if (root / "tierdiag" / "cli" / "dataclass_code.py").is_file():
        import os

        subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], cwd=root, check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(root)})


def instructions(timed: dict[str, list[list[str]]], base: Path) -> list[dict[str, Any]]:
    """Instructions (valgrind --tool=cachegrind) of each timed command, whole process, by each checkout."""
    import os
    import re

    out = []
    for db, cmds in timed.items():
        for args in cmds:
            row: dict[str, Any] = {"db": db, "command": args[0]}
            for who, root in (("baseline", base), ("this", ROOT)):
                proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
                                      + scale.TIERDIAG + [str(a) for a in args], capture_output=True, text=True, cwd=root,
                                      env={**os.environ, "PYTHONPATH": str(root)})
                found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
                row[f"{who}_instructions"] = int(found.group(1).replace(",", "")) if found else None
            out.append(row)
            _say(f"readers_ab: {args[0]} on {Path(db).name}: instructions {row['baseline_instructions']:,} -> "
                 f"{row['this_instructions']:,}")
    return out


def time_them(timed: dict[str, list[list[str]]], base: Path, rounds: int) -> list[dict[str, Any]]:
    out = []
    for db, cmds in timed.items():
        for args in cmds:
            runs: dict[str, list[dict]] = {"baseline": [], "this": []}
            for root in (base, ROOT):  # the OS file cache warmed, both checkouts' files read once
                scale.run(args, root=root)
            for i in range(rounds):
                order = ("baseline", "this") if i % 2 == 0 else ("this", "baseline")
                for who in order:
                    runs[who].append(scale.run(args, root=base if who == "baseline" else ROOT))
            med = {who: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")}
                   for who, rs in runs.items()}
            out.append({"db": db, "command": args[0], **{f"{who}_{k}": v for who, m in med.items() for k, v in m.items()},
                        "rounds": rounds})
            _say(f"readers_ab: {args[0]} on {Path(db).name}: wall {med['baseline']['wall_s']:.3f} -> "
                 f"{med['this']['wall_s']:.3f} s, CPU {med['baseline']['cpu_s']:.3f} -> {med['this']['cpu_s']:.3f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", action="append", required=True, help="a run store (repeatable)")
    ap.add_argument("--baseline", default="main", help="git ref or checkout directory (default: main)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds, interleaved (0: compare outputs only)")
    ap.add_argument("--instructions", action="store_true", help="also each command's instructions (cachegrind)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="readers-ab-") as tmp:
        base, made = _checkout(args.baseline, Path(tmp))
        try:
            for root in (ROOT, base):
                compileall.compile_dir(str(root / "tierdiag"), quiet=1)
                _build_tables(root)
            outputs, timed = compare([str(Path(d).resolve()) for d in args.db], base)
            times = time_them(timed, base, args.rounds) if args.rounds > 0 else []
            counted = instructions(timed, base) if args.instructions else []
        finally:
            if made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    differ = [r for r in outputs if not r["identical"]]
    print(f"outputs: {len(outputs) - len(differ)}/{len(outputs)} identical")
    for r in times:
        print(f"{r['command']:8} {Path(r['db']).name:24} wall {r['baseline_wall_s']:.3f} -> {r['this_wall_s']:.3f} s   "
              f"CPU {r['baseline_cpu_s']:.3f} -> {r['this_cpu_s']:.3f} s   ({r['rounds']} rounds, medians)")
    for r in counted:
        b, t = r["baseline_instructions"], r["this_instructions"]
        print(f"{r['command']:8} {Path(r['db']).name:24} instructions {b:,} -> {t:,}"
              + (f" ({t / b - 1:+.1%})" if b and t else ""))
    if args.json:
        args.json.write_text(json.dumps({"baseline": args.baseline, "outputs": outputs, "times": times,
                                         "instructions": counted}, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
