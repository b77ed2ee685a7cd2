"""targets41.py's sessions (issue 41): the chosen rows measured N times, S seconds apart, each row
judged on the median over sessions of each session's own ratio, with the spread beside it. The
pure parts live here (option parsing, the checks a row's verdict is made of, the median over
sessions, the session loop with its sleeps and failures injected) so the tests run them without a
replay; targets41.py measures and calls in.

A single session of targets41 (its rows medians of interleaved rounds inside a few minutes) swung
more between three runs in four minutes than any change of session 28 moved it (README, "Session
28, after every merge"): this VM has fast and slow phases minutes long. Sessions spread over time
sample several phases; each session's floor wall (one busy process) says which phase it met.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from typing import Any, Callable

MAX_SESSIONS = 20
MAX_GAP_S = 3600.0
MAX_REPEATS = 50
DEFAULT_GAP_S = 60.0
OPS: dict[str, Callable[[float, float], bool]] = {"<=": lambda v, lim: v <= lim, ">=": lambda v, lim: v >= lim}
_DIGITS = re.compile(r"[0-9]{1,6}")
CPU_LEGEND = ("CPU: the same ratio in CPU-seconds (user + sys, children included: a probed replay's writer "
              "process), its verdict information only; the target is on the wall ratio")


# --- the options --------------------------------------------------------------------------------
def count_option(name: str, most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to `most`, ASCII digits only."""

    def parse(text: str) -> int:
        s = text.strip()
        if not _DIGITS.fullmatch(s) or not 1 <= int(s) <= most:
            raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {most}, got {text!r}")
        return int(s)

    parse.__name__ = name
    return parse


def gap_option(text: str) -> float:
    """An argparse type: seconds between sessions, finite, from 0 to MAX_GAP_S."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_GAP_S:
        raise argparse.ArgumentTypeError(f"must be seconds from 0 to {MAX_GAP_S:g}, got {text!r}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (no usage block), exit 2 as argparse's."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_options(ap: argparse.ArgumentParser, where: str = "") -> None:
    ap.add_argument("--sessions", type=count_option("sessions", MAX_SESSIONS), default=1,
                    help=f"measure the chosen rows N times (1-{MAX_SESSIONS}), --gap seconds apart; each row's "
                         f"verdict on the median over sessions of each session's ratio (default 1){where}")
    ap.add_argument("--gap", type=gap_option, default=DEFAULT_GAP_S,
                    help=f"seconds between one session's end and the next one's start (0-{MAX_GAP_S:g}, "
                         f"default {DEFAULT_GAP_S:g}){where}")


# --- a row's checks -----------------------------------------------------------------------------
def check(name: str, value: float, op: str, limit: float, unit: str) -> dict[str, Any]:
    """One number a row's verdict compares with its target: unit "x" a ratio, "overhead" a ratio
    shown as +N % over 1, "s" seconds, "MB" megabytes."""
    return {"name": name, "value": float(value), "op": op, "limit": float(limit), "unit": unit,
            "ok": OPS[op](float(value), float(limit))}


def passes(checks: list[dict[str, Any]]) -> bool:
    return all(OPS[c["op"]](c["value"], c["limit"]) for c in checks)


def fmt(value: float, unit: str) -> str:
    if unit == "overhead":
        return f"{value - 1:+.1%}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:,.0f} {unit}"


def spread(values: list[float], unit: str) -> str:
    """'median (min .. max)' of a row's values over sessions."""
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med, unit)
    return f"{fmt(med, unit)} ({fmt(min(values), unit)} .. {fmt(max(values), unit)})"


# --- the median over sessions -------------------------------------------------------------------
def combine(tables: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per row key over every session's table: each check's median over the sessions that
    measured the row (its `checks` not empty), min and max; the verdict that of the medians; the
    CPU ratio likewise (information). A row no session measured or judged keeps the last session's
    value and the notes."""
    order: list[str] = []
    by_key: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, rows in enumerate(tables):
        for r in rows:
            if r["key"] not in by_key:
                order.append(r["key"])
                by_key[r["key"]] = []
            by_key[r["key"]].append((i, r))
    out = []
    for key in order:
        seen = by_key[key]
        measured = [(i, r) for i, r in seen if r.get("checks")]
        missing = [f"session {i + 1}: {r.get('note') or 'not measured'}" for i, r in seen if not r.get("checks")]
        last = seen[-1][1]
        row: dict[str, Any] = {"key": key, "row": last["row"], "target": last["target"], "sessions": len(seen),
                               "measured_in": [i + 1 for i, _ in measured], "checks": [], "cpu": None}
        if not measured:
            out.append({**row, "measured": last["measured"], "ok": None,  # n/a (--quick's 1M row): the last session's value
                        "note": "; ".join(dict.fromkeys(r.get("note", "") for _, r in seen))})
            continue
        for c0 in measured[-1][1]["checks"]:
            values = [c["value"] for _, r in measured for c in r["checks"] if c["name"] == c0["name"]]
            med = statistics.median(values)
            row["checks"].append({**check(c0["name"], med, c0["op"], c0["limit"], c0["unit"]),
                                  "min": min(values), "max": max(values), "values": values})
        cpus = [r["cpu"] for _, r in measured if r.get("cpu")]
        if cpus:
            values = [c["value"] for c in cpus]
            row["cpu"] = {**check("cpu", statistics.median(values), cpus[-1]["op"], cpus[-1]["limit"], cpus[-1]["unit"]),
                          "min": min(values), "max": max(values), "values": values}
        row["measured"] = "; ".join(spread(c["values"], c["unit"]) for c in row["checks"])
        row["ok"] = passes(row["checks"])
        row["note"] = (f"measured in {len(measured)} of {len(seen)} sessions; " + "; ".join(missing)) if missing else ""
        out.append(row)
    return out


# --- the loop -----------------------------------------------------------------------------------
def failed_rows(res: dict[str, Any]) -> dict[str, str]:
    """The rows a session selected but could not measure, with why (a replay exiting non-zero
    names its mode and round)."""
    return {k: v.get("why", "") for k, v in res.items()
            if isinstance(v, dict) and v.get("available") is False and v.get("why") not in (None, "not selected")
            and not str(v.get("why", "")).startswith(("not run:", "the scale run has"))}


def run_sessions(n: int, gap_s: float, measure: Callable[[int], dict[str, Any]],
                 table: Callable[[dict[str, Any]], list[dict[str, Any]]],
                 on_session: Callable[[dict[str, Any]], None] = lambda doc: None,
                 sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`measure(i)` n times, `gap_s` apart (end to start), each session's results, table and phase
    kept; `on_session(doc)` after every session (the JSON written there, so a run stopped or broken
    later keeps the sessions measured). A session that raises is recorded as failed, the sessions
    before it kept, and the exception re-raised after `on_session`."""
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    doc: dict[str, Any] = {"sessions_asked": n, "gap_s": gap_s, "sessions": [], "table": []}
    for i in range(n):
        if i:
            say(f"targets: session {i + 1} of {n} in {gap_s:g} s")
            sleep(gap_s)
        started = time.time()
        load = os.getloadavg()[0]
        try:
            res = measure(i)
        except BaseException as exc:
            doc["sessions"].append({"session": i + 1, "started": started, "load_at_start": load,
                                    "error": f"{type(exc).__name__}: {exc}"})
            doc["table"] = combine([s["table"] for s in doc["sessions"] if "table" in s])
            on_session(doc)
            raise
        rows = table(res)
        doc["sessions"].append({"session": i + 1, "started": started, "load_at_start": load, **res, "table": rows,
                                "failed": failed_rows(res)})
        doc["table"] = combine([s["table"] for s in doc["sessions"] if "table" in s])
        on_session(doc)
    return doc


# --- the tables ---------------------------------------------------------------------------------
def verdict(r: dict[str, Any]) -> str:
    return "[dim]n/a[/] " + r.get("note", "") if r["ok"] is None else (
        ("[green]met[/]" if r["ok"] else "[red]missed[/]") + (f" [dim]({r['note']})[/]" if r.get("note") else ""))


def cpu_cell(cpu: dict[str, Any] | None) -> str:
    """The CPU ratio and what its verdict would be (information: the target is on the wall)."""
    if not cpu:
        return "-"
    value = spread(cpu["values"], cpu["unit"]) if "values" in cpu else fmt(cpu["value"], cpu["unit"])
    return f"{value}: {'met' if cpu['ok'] else 'missed'}"


def _primary(r: dict[str, Any]) -> str:
    if not r.get("checks"):
        return "-"
    c = r["checks"][0]
    cpu = f" (CPU {fmt(r['cpu']['value'], r['cpu']['unit'])})" if r.get("cpu") else ""
    return fmt(c["value"], c["unit"]) + cpu


def render_sessions(doc: dict[str, Any], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or (Console() if sys.stdout.isatty() else Console(width=160))
    done = [s for s in doc["sessions"] if "table" in s]
    t = Table(title=f"issue 41: every target, the median over {len(done)} sessions {doc['gap_s']:g} s apart "
                    "(each session's ratio a median of its interleaved rounds; whole processes)")
    for col in ("target row", "median over sessions (min .. max)", "target", "verdict (on the median)",
                "CPU ratio, median (min .. max) (information)"):
        t.add_column(col, overflow="fold")
    for r in doc["table"]:
        t.add_row(r["row"], r["measured"] or "-", r["target"], verdict(r), cpu_cell(r["cpu"]))
    t.caption = CPU_LEGEND
    con.print(t)
    keys = [r["key"] for r in doc["table"] if r.get("checks")]
    p = Table(title="the sessions: the phase each met (load average at its start, the floor's wall: one busy "
                    "process) and its own wall ratios (CPU)")
    for col in ("session", "started (UTC)", "load", "floor wall", *keys):
        p.add_column(col, overflow="fold")
    for s in doc["sessions"]:
        own = {r["key"]: r for r in s.get("table", [])}
        floor = s.get("floor_wall_s")
        p.add_row(str(s["session"]), time.strftime("%H:%M:%S", time.gmtime(s["started"])), f"{s['load_at_start']:.1f}",
                  "-" if floor is None else f"{floor:.3f} s",
                  *((_primary(own[k]) if k in own else "-") for k in keys))
        if s.get("error") or s.get("failed"):
            p.add_row("", "[red]failed[/]", "", "", s.get("error") or "; ".join(f"{k}: {v}" for k, v in s["failed"].items()))
    con.print(p)
