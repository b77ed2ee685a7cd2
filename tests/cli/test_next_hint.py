"""The "next:" hint a replay prints ends with the store it wrote, quoted for a shell: pasted as
it is, it names that file whatever its path holds (a space, a quote)."""

from __future__ import annotations

import shlex

from tests.cli.cli_helpers import REPLAY_ARGS, cli_here, write_late_trace


def test_the_next_hint_pastes_back_to_the_store_it_names(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=20)
    folder = tmp_path / "my runs"
    folder.mkdir()
    db = folder / "it's [here].duckdb"
    r = cli_here("replay", trace, "--db", db, *REPLAY_ARGS)
    assert r.returncode == 0, r.stderr
    (hint,) = [line for line in r.stdout.splitlines() if line.startswith("next: ")]
    commands = [shlex.split(part) for part in hint.removeprefix("next: ").split("   ·   ")]
    assert [c[:2] for c in commands] == [["tierdiag", "slow"], ["tierdiag", "explain"], ["tierdiag", "report"]]
    for command in commands:
        assert command[command.index("--db") + 1] == str(db)
    pasted = cli_here(*commands[0][1:])  # the first hint, run as printed
    assert pasted.returncode == 0 and pasted.stdout.strip(), pasted.stderr
