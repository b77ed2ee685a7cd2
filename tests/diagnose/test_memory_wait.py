"""Queue time is named one way everywhere (issue 34's `memory_wait`, issue 43's `decode`).

A request's queue attribution once labelled the GPU-idle time while decoding requests held device
memory "decode", while its verdict said the queue was "idle ... waiting for device memory": one
span, two names. That span became `memory_wait`. With decode steps on the engine's clock (issue
43) the GPU is no longer idle while requests decode: the time it ran their decode steps is
`decode`, in explain --json's `queue_attribution_ms`, in the terminal's attribution line and
behind the verdict's sentence, with the same number; `memory_wait` keeps what is left of a gap
while requests decoded. Checked on a replay whose small pools hold requests for memory
(test_run_claims' storage run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tierdiag.diagnose.request.context import ATTRIBUTION_KEYS, queue_attribution
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.units import fmt_ms

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke as _invoke  # noqa: E402

from .test_run_claims import STORAGE, _ms_ok  # noqa: E402


@pytest.fixture(scope="module")
def held(tmp_path_factory) -> tuple[Path, str, int]:
    """The run, and its request with the most queue time behind decode steps."""
    folder = tmp_path_factory.mktemp("memory_wait")
    trace, db = folder / "mixed.jsonl", folder / "held.duckdb"
    _invoke("synth", str(trace), "--kind", "mixed", "--requests", "300", "--rate", "30")
    _invoke("replay", str(trace), "--db", str(db), *STORAGE)
    best = None
    with open_store(db) as con:
        run = resolve_run(con, None)
        cur = con.execute("SELECT * FROM requests WHERE run_id = ? AND status = 'finished' AND queue_ns > 0 "
                          "ORDER BY seq", [run.run_id])
        names = [d[0] for d in cur.description]
        for t in cur.fetchall():
            row = dict(zip(names, t))
            qa = queue_attribution(con, run.run_id, row)
            if qa is not None and (best is None or qa.parts_ns["decode"] > best[1]):
                best = (row["req_id"], qa.parts_ns["decode"])
    assert best is not None and best[1] > 0, "no request waited behind decode steps"
    return db, best[0], best[1]


def test_one_name_for_waiting_for_memory():
    # `decode` is the GPU running decode steps (issue 43), no longer a name for waiting for memory
    assert "memory_wait" in ATTRIBUTION_KEYS and "decode" in ATTRIBUTION_KEYS


def test_json_terminal_and_verdict_agree(held):
    db, req_id, ns = held
    out = _invoke("explain", req_id, "--db", str(db), "--json")
    j = json.loads(out[out.index("{"):])
    qa = j["queue_attribution_ms"]
    assert qa["decode"] == pytest.approx(ns / 1e6)
    # The verdict's sentence for that span carries the same number under the same meaning.
    queue = next(c["text"] for c in j["claims"] if c["name"] == "queue")
    m = re.search(r"([\d,.]+ (?:µs|ms|s|min|h)) \([^)]*\) running decode steps of the requests ahead", queue)
    assert m is not None, queue
    assert _ms_ok(m[1], ns) and m[1] == fmt_ms(ns)
    # The terminal's attribution line names it with the --json key, the same time.
    text = " ".join(_invoke("explain", req_id, "--db", str(db)).replace("│", " ").split())
    line = text[text.index("its wait, by what held it up:"):]
    assert f"decode {fmt_ms(ns)}" in line
