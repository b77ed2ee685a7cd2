"""One small replayed run for the CLI tests: a trace that starts late (its first arrival at
1,000,000 ms, like a slice of a longer trace), with shared prefixes, evictions and load-backs.
Tiny model on the CPU preset, so it replays in a few seconds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_ARRIVAL_MS = 1_000_000
NUM_REQUESTS = 300


def tierdiag(*args, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, with this checkout first on the path."""
    full = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import main; main()", *map(str, args)],
                          capture_output=True, text=True, env=full, cwd=cwd, timeout=300)


def write_late_trace(path: Path, num_requests: int = NUM_REQUESTS) -> Path:
    """Mooncake-format requests: one block every request shares (it stays on the device), then
    one of eight 4-block prefixes, some hotter than others (more than the pools keep, so some
    come back from host and some are recomputed), then 2 blocks of its own."""
    rng = random.Random(16)
    with path.open("w") as f:
        for i in range(num_requests):
            group = rng.choice((0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7))
            prefix = [0] + [1 + group * 100 + b for b in range(4)]
            own = [1_000_000 + i * 10 + b for b in range(2)]
            f.write(json.dumps({"timestamp": FIRST_ARRIVAL_MS + i * 300, "input_length": 7 * 512 - 17,
                                "output_length": 16, "hash_ids": prefix + own}) + "\n")
    return path


REPLAY_ARGS = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", 12288, "--host-tokens", 20480)
