"""What a `next:` hint names, so that it runs as printed (issue 42): a real request id in place of
REQ_ID. tests/cli/test_next_hints.py runs every hint the commands print."""

from __future__ import annotations

import shlex
from pathlib import Path


def slowest_request(db: str | Path, run_id: str) -> str | None:
    """The run's request `slow` lists first (the largest excess TTFT over its ideal; an observed run,
    which has no ideal: the largest TTFT), quoted for a shell; None when the run has no finished
    request with a TTFT (or the store cannot be read: the hint then leaves `explain` out)."""
    from tierdiag.diagnose.read.ids import first_slow_request
    from tierdiag.errors import StoreError
    from tierdiag.store.reader import open_store

    try:
        con = open_store(db)
    except StoreError:
        return None
    with con:
        found = first_slow_request(con, run_id)
    return None if found is None else shlex.quote(found)
