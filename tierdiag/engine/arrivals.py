"""Where the scheduler's arrivals come from: the trace read as it goes, open loop or closed loop.

`trace` (open loop): every request arrives at its timestamp x --time-scale, as recorded.
`closed`: a session's first turn, and every request without a session, arrive at their
timestamps; each later turn arrives at its predecessor's finish (the last output token, in this
replay) + its `think_ms`. A turn whose predecessor was rejected is not served, nor is any later
turn of that session (`ended_turns`, `ended_sessions`). `think_ms` is the client's pause and is
not stretched by --time-scale (which moves the timestamps, i.e. when sessions start).

    trace   a1 ─────── a2 ──────────── a3            (timestamps: the original server's pace)
    closed  a1 ▓▓▓▓▓▓▓▓▓▓▓│think│ a2 ▓▓▓▓▓│think│ a3  (▓ this replay's service of the turn)

The trace is read as the clock reaches each line's timestamp, as in open loop, so a trace is
never held whole. A later turn can be due before its own timestamp (this replay serves its
predecessor faster than the trace's server did), so while some session waits for its next turn
the source also reads up to READ_AHEAD_LINES lines ahead; a turn found later than its due time
(further ahead than that) arrives when it is read, counted in `late_turns`.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Iterable, Iterator

from tierdiag.trace.reader import TraceRequest

# Lines read ahead of the clock while a session waits for its next turn (the memory of that
# many trace lines at most, beside the turns waiting for their predecessor).
READ_AHEAD_LINES = 4096


class ArrivalSource:
    """The arrivals in time order: `next_ns(now)` the earliest one not delivered (None: none left),
    `due(now)` those at or before `now` as (request, arrival ns, trace arrival ns); the
    scheduler reports `finished(session, now)` and `rejected(session)` of each turn."""

    def __init__(self, requests: Iterable[TraceRequest], time_scale: float, *, closed: bool,
                 read_ahead: int = READ_AHEAD_LINES):
        self._it = iter(requests)
        self._scale = time_scale
        self.closed = closed
        self._read_ahead = read_ahead
        # (arrival, seq, request, trace arrival, think_ms: None for a turn without a predecessor)
        self._heap: list[tuple[int, int, TraceRequest, int, float | None]] = []
        self._seen: set[str] = set()  # sessions met (open loop: which turns have a predecessor)
        # Closed loop, a session met is in one of two maps. Busy: a turn released and not
        # finished; the later turns read meanwhile wait in its deque (None: none yet). Idle
        # ("hungry"): its turn finished at the int (ns) and its next turn is not read yet; every
        # session ends there, and stays, as nothing says which turn is a session's last. A plain
        # int a session, not an object with a deque (~0.7 KB: ~70 MB of a 1M-request synth replay).
        self._busy: dict[str, deque[TraceRequest] | None] = {}
        self._idle: dict[str, int] = {}
        self._ended: set[str] = set()
        self._in_hand = 0  # lines read and not yet delivered nor dropped
        self._peek: TraceRequest | None = None
        self._peek_ns: int | None = None
        self.num_sessions = 0
        self.ended_turns = 0  # turns not served: an earlier turn of their session was rejected
        self.ended_sessions: dict[str, int] = {}  # session -> turns not served, in order of ending
        self.late_turns = 0  # turns read after their due time (past the read-ahead)
        # Called with (request, now, trace arrival ns) for each turn not served: the scheduler
        # records it as rejected (session_ended).
        self.on_drop = lambda req, now, trace_ns: None
        self._read()

    def _read(self) -> None:
        nxt = next(self._it, None)
        self._peek = nxt
        self._peek_ns = None if nxt is None else int(nxt.arrival_ns * self._scale)

    # --- what the scheduler calls -------------------------------------------------------
    def next_ns(self, now: int) -> int | None:
        # (the read-ahead called only where its loop would read a line: a closed loop's sessions
        # keep `_idle` non-empty, and a full read-ahead made a call and three checks at every ask)
        if self._idle and self._peek is not None and self._in_hand < self._read_ahead:
            self._read_ahead_lines(now)
        # The heap's top read as an object (`list[Any]`): compiled, the typed entry's `[0]`
        # unboxed the whole 5-tuple (three ints, a float or None) into a C struct and boxed the
        # time again for the answer, a new int each ask (~830 instructions an ask, ~20 asks a
        # request on a closed-loop synth trace; issue 41, session 32). The compare unboxes the
        # two times alone; the answer is the object the heap or the read holds.
        heap: list[Any] = self._heap
        peek: Any = self._peek_ns
        if heap:
            top: Any = heap[0][0]
            if peek is not None:
                p: int = peek
                t: int = top
                if p < t:
                    return peek
            return top
        return peek

    def reads_ahead(self) -> bool:
        """Whether `next_ns` would read lines ahead now (a session waits for its next turn, lines
        are left and the read-ahead has room): then the clock it is asked at decides which turns
        are late. Only a delivery, a finish or a dropped turn changes this."""
        return bool(self._idle) and self._peek is not None and self._in_hand < self._read_ahead

    def has_due(self, now: int) -> bool:
        """Whether `due(now)` would do anything (a line to read at or before `now`, or a turn due):
        where it would not, the loops skip it (compiled, `due` is a generator object a call)."""
        peek: Any = self._peek_ns
        if peek is not None:
            p: int = peek
            if p <= now:
                return True
        heap: list[Any] = self._heap  # (the top's time alone unboxed, as next_ns)
        if heap:
            t: int = heap[0][0]
            return t <= now
        return False

    def due(self, now: int) -> Iterator[tuple[TraceRequest, int, int, float | None]]:
        heap = self._heap
        while True:
            if self._peek_ns is not None and self._peek_ns <= now:
                self._ingest(self._peek, self._peek_ns, now)
                self._read()
            elif heap and heap[0][0] <= now:
                t, _, req, trace_ns, think_ms = heapq.heappop(heap)
                self._in_hand -= 1
                yield req, t, trace_ns, think_ms
            else:
                return

    def finished(self, session: str, now: int) -> None:
        """A turn of `session` finished at `now`: its next turn, if read, is released."""
        busy = self._busy
        if session not in busy:
            return
        queue = busy.pop(session)
        if queue:
            self._release(session, queue.popleft(), now, now, queue or None)
        else:
            self._idle[session] = now

    def rejected(self, session: str, now: int) -> None:
        """A turn of `session` was rejected at `now`: the session ends there; its later turns
        already read are dropped now, the others as they are read."""
        queue = self._busy.pop(session, None)
        self._idle.pop(session, None)
        self._ended.add(session)
        self.ended_sessions.setdefault(session, 0)
        if queue:
            self._in_hand -= len(queue)
            for req in queue:
                self._drop(req, now)

    def _drop(self, req: TraceRequest, now: int) -> None:
        self.ended_turns += 1
        self.ended_sessions[req.session] += 1
        self.on_drop(req, now, int(req.arrival_ns * self._scale))

    # --- reading ---------------------------------------------------------------------------
    def _read_ahead_lines(self, now: int) -> None:
        while self._peek is not None and self._in_hand < self._read_ahead and self._idle:
            self._ingest(self._peek, self._peek_ns, now)
            self._read()

    def _ingest(self, req: TraceRequest, trace_ns: int, now: int) -> None:
        """A line read, the clock at `now` (at or before its timestamp)."""
        session = req.session
        if session is None:
            self._push(req, trace_ns, trace_ns, None)
            return
        if not self.closed:
            if session in self._seen:
                self._push(req, trace_ns, trace_ns, pause_ms(req))
            else:
                self._seen.add(session)
                self.num_sessions += 1
                self._push(req, trace_ns, trace_ns, None)
            return
        if session in self._ended:
            self._drop(req, now)
            return
        busy = self._busy
        if session in busy:
            self._in_hand += 1
            queue = busy[session]
            if queue is None:
                busy[session] = deque((req,))
            else:
                queue.append(req)
            return
        finish_ns = self._idle.pop(session, None)
        if finish_ns is None:  # a session's first turn: its timestamp
            busy[session] = None
            self.num_sessions += 1
            self._push(req, trace_ns, trace_ns, None)
            return
        self._in_hand += 1
        self._release(session, req, finish_ns, now, None)

    def _release(self, session: str, req: TraceRequest, finish_ns: int, now: int,
                 queue: deque[TraceRequest] | None) -> None:
        """The turn's predecessor finished at `finish_ns`: it is due then + think_ms; the session
        is busy again, `queue` its later turns read meanwhile."""
        self._busy[session] = queue
        t = finish_ns + (req.think_ns or 0)
        if t < now:  # read after its due time
            self.late_turns += 1
            t = now
        heapq.heappush(self._heap, (t, req.seq, req, int(req.arrival_ns * self._scale), pause_ms(req)))

    def _push(self, req: TraceRequest, t: int, trace_ns: int, think_ms: float | None) -> None:
        self._in_hand += 1
        heapq.heappush(self._heap, (t, req.seq, req, trace_ns, think_ms))


def pause_ms(req: TraceRequest) -> float:
    """A later turn's pause in ms: 0 where its line gives none (it follows at once)."""
    return 0.0 if req.think_ns is None else req.think_ns / 1e6
