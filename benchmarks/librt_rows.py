"""What writing the rows' bytes natively would save (issue 41's probe overhead, h41rec3's item 3,
measured and not done: benchmarks/README.md "Session 20, h41rowbuf"): an eviction-shaped row of
14 values (10 large ints, 2 str, 2 None) built three ways in a module compiled by mypyc here,
instructions a row counted with cachegrind (valgrind), the bytes checked identical:

  tuple    the row a tuple handed to `_cplane.RowBuffer.append` (what the engine does now)
  bytes    the same values written in RowBuffer's format with `librt.strings.BytesWriter` /
           `write_i64_le` (native calls on unboxed ints), handed over a row at a time
           (`getvalue` + `bytearray.extend`, standing in for a RowBuffer.extend)
  batched  ... handed over once per 64 KiB

    .venv/bin/python benchmarks/librt_rows.py [--rows 20000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
from typing import Callable, Optional
from librt.strings import BytesWriter, write_i64_le, write_i32_le


def rows_tuple(n: int, app: Callable[[tuple], None], s: str, t: str) -> None:
    for i in range(n):
        x = i * 1000003 + 123456789
        app((x, x + 1, s, x + 2, x + 3, t, None, None, x + 4, x + 5, x + 6, x + 7, x + 8, 0))


def _int(w: BytesWriter, x: int) -> None:
    w.append(73)
    write_i64_le(w, x)


def _str(w: BytesWriter, s: Optional[str]) -> None:
    if s is None:
        w.append(78)
        return
    b = s.encode()
    w.append(83)
    write_i32_le(w, len(b))  # (librt's stubs have no write_u32_le; a length < 2**31: the same bytes)
    w.write(b)


def _row(w: BytesWriter, x: int, s: str, t: str) -> None:
    _int(w, x); _int(w, x + 1); _str(w, s); _int(w, x + 2); _int(w, x + 3); _str(w, t)
    _str(w, None); _str(w, None)
    _int(w, x + 4); _int(w, x + 5); _int(w, x + 6); _int(w, x + 7); _int(w, x + 8); _int(w, 0)


def rows_bytes(n: int, ext: Callable[[bytes], object], s: str, t: str) -> None:
    w = BytesWriter()
    for i in range(n):
        _row(w, i * 1000003 + 123456789, s, t)
        ext(w.getvalue())
        w.truncate(0)


def rows_batched(n: int, ext: Callable[[bytes], object], s: str, t: str) -> None:
    w = BytesWriter()
    for i in range(n):
        _row(w, i * 1000003 + 123456789, s, t)
        if len(w) > 1 << 16:
            ext(w.getvalue())
            w.truncate(0)
    ext(w.getvalue())
'''

DRIVER = '''
import sys
sys.path.insert(0, {tmp!r}); sys.path.insert(1, {root!r})
import lrtrows
from tierdiag.native import cplane
mode, n = sys.argv[1], int(sys.argv[2])
rb = cplane.compiled("RowBuffer")(14)
ba = bytearray()
s, t = "device", "demote"
if mode == "tuple":
    lrtrows.rows_tuple(n, rb.append, s, t)
else:
    getattr(lrtrows, "rows_" + mode)(n, ba.extend, s, t)
    if len(sys.argv) > 3:  # the check, not counted
        lrtrows.rows_tuple(n, rb.append, s, t)
        assert bytes(ba) == rb.take()[0], "the bytes differ from RowBuffer's"
'''


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "lrtrows.py").write_text(MODULE)
        subprocess.run([sys.executable, "-m", "mypyc", "lrtrows.py"], cwd=tmp, check=True, capture_output=True)
        driver = DRIVER.format(tmp=tmp, root=str(ROOT))
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        for mode in ("bytes", "batched"):  # the bytes checked against RowBuffer.append's
            subprocess.run([sys.executable, "-c", driver, mode, "1000", "check"], check=True, env=env)
        print(f"| way | instructions a row ({args.rows:,} rows) |")
        print("|---|---|")
        for mode in ("tuple", "bytes", "batched"):
            counts = []
            for n in (0, args.rows):
                out = Path(tmp, f"cg.{mode}.{n}")
                subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                                sys.executable, "-c", driver, "tuple" if mode == "tuple" else mode, str(n)],
                               check=True, capture_output=True, env=env)
                counts.append(int(re.search(r"^summary:\s+(\d+)", out.read_text(), re.M).group(1)))
            print(f"| {mode} | {(counts[1] - counts[0]) / args.rows:,.0f} |")


if __name__ == "__main__":
    main()
