"""Issue 42 item 5: every table complete when piped and readable at 80 columns. At 80 columns
(piped, and on a terminal) no line of a table is wider than 80 and no cell is cut with "…": a
table that does not fit is stacked (report.terminal.stacked), one block a row, and a run id or a
change such as `host_tokens=1048576` stays whole on its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.cli_helpers import REPLAY_ARGS, cli_here, on_tty, write_late_trace

SAMPLES = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples"
BOX = re.compile(r"[│┃┏┓┗┛┡┩└┘├┤┼━─╇╈╋]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def table_lines(text: str) -> list[str]:
    return [x for x in ANSI.sub("", text).splitlines() if BOX.search(x)]


def check_80(text: str, where: str) -> None:
    for x in table_lines(text):
        assert len(x.rstrip()) <= 80, f"{where}: a table line of {len(x.rstrip())} columns:\n{x}"
        assert "…" not in x, f"{where}: a cut cell:\n{x}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tables")
    db = tmp / "r.duckdb"
    trace = write_late_trace(tmp / "t.jsonl", num_requests=300)
    for name, host in (("small", 20480), ("large", 40960)):
        r = cli_here("replay", trace, "--db", db, "--run-name", name, *REPLAY_ARGS[:-2], "--host-tokens", host)
        assert r.returncode == 0, r.stderr
    r = cli_here("sweep", trace, "--db", db, "--set", "model=tiny", "--set", "gpu=cpu", "--set", "device_tokens=12288",
                 "--set", "host_tokens=20480,40960,81920", "--set", "write_policy=write_through,write_back", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    for name, router in (("rr", "round_robin"), ("ca", "cache_aware")):  # compare's ranks table
        r = cli_here("replay", trace, "--db", db, "--run-name", name, *REPLAY_ARGS, "--dp", 2, "--router", router)
        assert r.returncode == 0, r.stderr
    prod = tmp / "prod.duckdb"
    r = cli_here("import", "sglang", SAMPLES / "sglang", "--db", prod, "--run-name", "prod", "--trace-out",
                 tmp / "twin.jsonl")
    assert r.returncode == 0, r.stderr
    r = cli_here("replay", tmp / "twin.jsonl", "--db", prod, "--run-name", "twin", "--device-tokens", 9600,
                 "--host-tokens", 65536, "--page-size", 64, "--verify", "off")
    assert r.returncode == 0, r.stderr
    return db, prod


VIEWS = [
    ("summary", "--run", "small"), ("slow", "--top", "10", "--run", "small"), ("runs",), ("summary", "--run", "rr"),
    ("compare", "small", "large"), ("compare", "small", "large", "--requests"), ("compare",), ("compare", "rr", "ca"),
    ("summary", "--run", "prod", "@prod"), ("slow", "--run", "prod", "@prod"), ("runs", "@prod"),
    ("compare", "prod", "twin", "--requests", "@prod"), ("compare", "prod", "twin", "@prod"),
]


@pytest.mark.parametrize("view", VIEWS, ids=[" ".join(v) for v in VIEWS])
def test_piped_views_fit_80_columns(store, view):
    db, prod = store
    args = [a for a in view if a != "@prod"]
    r = cli_here(*args, "--db", prod if "@prod" in view else db, columns=80)
    assert r.returncode == 0, r.stderr
    check_80(r.stdout, " ".join(args))


def test_advise_fits_80_columns_and_keeps_changes_and_ids_whole(store):
    db, _ = store
    r = cli_here("advise", "--run", "small", "--budget", "2", "--jobs", "2", "--db", db, columns=80)
    assert r.returncode == 0, r.stderr
    check_80(r.stdout, "advise")
    ids = set(re.findall(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b", r.stdout))
    assert ids  # each run id whole somewhere on a line
    for line in r.stdout.splitlines():
        # a change is never split over lines: `key=` is followed by its whole value on the same line
        assert not re.search(r"\b[a-z_]+=$", line.rstrip()), line


@pytest.mark.parametrize("view", [("compare",), ("compare", "small", "large", "--requests"), ("summary", "--run", "small")],
                         ids=["compare-sweep", "compare-requests", "summary"])
def test_terminal_views_fit_80_columns(store, view):
    db, _ = store
    code, shown = on_tty(*view, "--db", db, columns=80)
    assert code == 0, shown[-2000:]
    check_80(shown, " ".join(view))


def test_stacked_keeps_every_cell():
    from rich.table import Table

    from tierdiag.report.terminal import new_console, stacked

    t = Table(title="t")
    for col in ("run", "host_tokens", "a very long header of a column"):
        t.add_column(col)
    t.add_row("20261204-234746-a84bd5", "host_tokens=1048576", "x" * 30)
    t.add_row("r2", "1", "2")
    console = new_console()
    console.width = 60
    with console.capture() as cap:
        console.print(stacked(t))
    text = cap.get()
    for cell in ("20261204-234746-a84bd5", "host_tokens=1048576", "x" * 30, "r2"):
        assert cell in text
    assert all(len(x.rstrip()) <= 60 for x in text.splitlines())
