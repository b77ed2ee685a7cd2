"""Sessions in a trace: which request is each turn's predecessor.

A turn's predecessor is the previous request of the same `session` in trace order (the order
`read_trace` yields, bad lines skipped under --skip-bad left out); a request without a session,
or the first of its session, has none:

    seq      0        1        2        3        4
    session  a        -        a        b        a
    pred     None     None     0        None     2
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tierdiag.trace.reader import TraceRequest


def predecessors(requests: Iterable[TraceRequest]) -> Iterator[int | None]:
    """For each request, in order, the `seq` of its predecessor in its session, or None."""
    last_seq: dict[str, int] = {}
    for req in requests:
        session = req.session
        if session is None:
            yield None
            continue
        yield last_seq.get(session)
        last_seq[session] = req.seq
