"""One small replayed run for the CLI tests: a trace that starts late (its first arrival at
1,000,000 ms, like a slice of a longer trace), with shared prefixes, evictions and load-backs.
Tiny model on the CPU preset, so it replays in a few seconds."""

from __future__ import annotations

import json
import os
import pty
import random
import struct
import subprocess
import sys
from pathlib import Path

from tests.support.cli import ENTRY, completed_in_process, run
from tests.support.cli import cli_env as support_env

ROOT = Path(__file__).resolve().parents[2]
FIRST_ARRIVAL_MS = 1_000_000
NUM_REQUESTS = 300


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


# Views as a user meets them: piped (stdout not a terminal, as in `tierdiag slow > file`) and
# under a pseudo-terminal of a given width.
def _env(**kw) -> dict:
    """This checkout first on the path (also for what the CLI starts), no inherited width or colour."""
    return support_env(columns=None, keep_width=False, **kw)


def cli(*args: object, columns: int = 80, cwd: Path | None = None, **env) -> subprocess.CompletedProcess:
    """Piped: stdout is not a terminal."""
    return run(*args, env=_env(COLUMNS=str(columns), **env), cwd=cwd)


def cli_here(*args: object, columns: int = 80, cwd: Path | None = None, direct: bool = False,
             **env) -> subprocess.CompletedProcess:
    """`cli` in this process (tests/support/cli.py `tierdiag_in_process`): the same environment,
    stdout not a terminal, for tests of what a command prints, not of its process. `direct`:
    the path the console script takes for this line (a plain read command's direct call)."""
    return completed_in_process(*args, env=_env(COLUMNS=str(columns), **env), cwd=cwd, direct=direct)


def on_tty(*args: object, columns: int = 80, **env) -> tuple[int, str]:
    """Under a pseudo-terminal `columns` wide; returns (exit code, everything written)."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, *map(str, args)], stdin=slave, stdout=slave, stderr=slave,
                            env=_env(**env), close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")
