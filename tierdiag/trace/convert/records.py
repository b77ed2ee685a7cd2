"""What every source format is read into, the checks its fields share, and the block re-chaining.

A converted request is whole when it is made (`SessionRequest`): each reader validates a source
record completely (its fields by a typed msgspec model, `record`; what relates them by hand),
then builds one; a bad record raises `BadRecord` and the reader adds its `file:line`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated

from msgspec import Meta

from tierdiag.trace.fields import FieldError, convert as convert_fields, show as show_value
from tierdiag.trace.lines import BadLine
from tierdiag.trace.reader import (MAX_LENGTH_TOKENS, MAX_SESSION_CHARS, MAX_THINK_MS, MAX_TIMESTAMP_MS, NS_PER_MS,
                                   SessionClock, pause_ns)


class BadRecord(Exception):
    """A source record that cannot be converted; the reader words it as `file:line: message`."""


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """One request of a converted trace, every field filled (`think_ms` None: a session's first
    turn, or a turn whose source gives no pause)."""

    req_id: str
    session: str
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # output blocks, prefix-chained (`Rechainer`)
    think_ms: float | None

    def to_json_line(self) -> str:
        line = {"id": self.req_id, "timestamp": self.timestamp_ms, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids), "session": self.session}
        if self.think_ms is not None:
            line["think_ms"] = int(self.think_ms) if self.think_ms == int(self.think_ms) else self.think_ms
        return json.dumps(line)


@dataclass
class ConvertNotes:
    """What a conversion met that the user should know (counted while reading)."""

    unchained_blocks: int = 0  # distinct source block ids met behind a different predecessor than first
    unchained_block_uses: int = 0  # how many times (requests x positions) they were met so
    subagents: int = 0  # kv-cache-tester: nested sub-agent conversations, each its own session
    orphans: int = 0  # bailian: turns whose parent chat is not in the input (a session starts there)
    forks: int = 0  # bailian: second children of one chat (a session starts there)
    early_turns: int = 0  # bailian: turns sent before their parent's estimated finish (think_ms 0)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --- the fields the readers share (bounds are replay's: what convert writes, replay takes) -------

# Seconds (a time, a pause): finite, >= 0, within replay's latest timestamp; an integer of any
# size is compared as it is ("too large"), never converted first.
MAX_SECONDS = min(MAX_TIMESTAMP_MS, MAX_THINK_MS) // 1000
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS, extra={
    "unit": " s", "value_unit": True, "number": "a finite number of seconds"})]
Count = Annotated[int, Meta(ge=0, le=MAX_LENGTH_TOKENS)]
InputCount = Annotated[int, Meta(ge=1, le=MAX_LENGTH_TOKENS)]
# Source block ids are only compared and used as keys; any 64-bit integer is one.
BlockIds = list[Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]]


def record(obj: dict, model: type):
    """`obj` as a `model` (a source record's typed fields), or BadRecord worded from the model:
    `trace.fields`, converter style (null is a missing field, counts say their range)."""
    try:
        return convert_fields(obj, model, style="record", null_is_missing=True)
    except FieldError as exc:
        raise BadRecord(str(exc)) from None


def show(value: object, limit: int = 40) -> str:
    return show_value(value, limit)


def session_name(name: str) -> str:
    if len(name) > MAX_SESSION_CHARS:
        raise BadRecord(f"session name is {len(name):,} characters long (at most {MAX_SESSION_CHARS})")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # an escaped lone surrogate json.loads took: replay would refuse the line
            raise BadRecord(f"session name {name.encode('ascii', 'backslashreplace').decode()[:40]} is not valid "
                            "Unicode text (a lone surrogate)") from None
    return name


def timestamp_ms(seconds: float, *, start_s: float = 0.0) -> int:
    """`start_s + seconds` in ms; BadRecord past replay's latest timestamp (naming the start
    when there is one: kv-cache-tester's conversation start)."""
    ms = round((start_s + seconds) * 1000)
    if ms > MAX_TIMESTAMP_MS:
        where = f" (its conversation starts at {start_s:,.3f} s, then {seconds:,.3f} s)" if start_s else ""
        raise BadRecord(f"arrives at {start_s + seconds:,.3f} s{where}, past the latest timestamp replay takes "
                        f"({MAX_TIMESTAMP_MS // 1000:,} s)")
    return ms


class SessionClocks:
    """Replay's closed-loop bound on each converted session (`reader.SessionClock`): a turn whose
    session's first timestamp plus its pauses would pass the clock's range is a bad record here,
    not a failed replay later (issue 39 bug 10)."""

    def __init__(self) -> None:
        self._clock = SessionClock()

    def turn(self, session: str, ts_ms: int, think_ms: float | None, what: str) -> None:
        """`what`: the source's field the pause comes from, for the message."""
        try:
            at = self._clock.check(session, ts_ms * NS_PER_MS, None if think_ms is None else pause_ns(think_ms), what)
        except BadLine as exc:
            raise BadRecord(str(exc)) from None
        self._clock.commit(session, at)


# --- block ids: local source ids -> prefix-chained output ids, re-blocked ---------------------

@dataclass
class Rechainer:
    """Source block ids to output ids of `block_size` tokens that chain like Mooncake's: equal
    output ids mean the same tokens *and* the same prefix.

    Each full source block gets a global id from (namespace, its predecessor's global id, its
    own id): ids numbered per conversation stay apart (one namespace each), and an id the source
    reuses behind a different prefix gets a new global id (its KV differs there; counted in
    `unchained_ids`, and each use in `unchained`, since the source's ids were not prefix-chained). An output block is named by
    the source block holding its last token and how far into it it ends:

        source (64)  | g0 | g1 | g2 | g3 | g4 | g5 | g6 | g7 | g8 |g9..   (g: global ids)
        output (128) |  (g1,64) |  (g3,64) |  (g5,64) |  (g7,64) | new   (last block: no full
                                                                         source block covers it)

    A block not covered by full source blocks (an unhashed tail, a partial last source block)
    is never shared: it gets a fresh id. Output ids are numbered by first appearance.
    """

    block_size: int
    unchained: int = 0  # uses: (request, position) pairs where a source id follows another block
    unchained_ids: set = field(default_factory=set)  # the distinct (namespace, source id) pairs
    _src: dict = field(default_factory=dict)  # (namespace | parent global, source id) -> global
    _first_pred: dict = field(default_factory=dict)  # (namespace, source id) -> first predecessor
    _out: dict = field(default_factory=dict)  # (global, end offset) -> output id
    _next_out: int = 0

    def blocks(self, namespace: int, src_ids: list[int], src_block: int, input_len: int) -> tuple[int, ...]:
        full = min(len(src_ids), input_len // src_block)
        src, first_pred = self._src, self._first_pred
        chain: list[int] = []
        parent: tuple | int = ("ns", namespace)  # a root block's "parent" is its namespace
        prev = None
        for local in src_ids[:full]:
            key = (parent, local)
            g = src.get(key)
            if g is None:
                g = src[key] = len(src)
            if first_pred.setdefault((namespace, local), prev) != prev:
                self.unchained += 1
                self.unchained_ids.add((namespace, local))
            chain.append(g)
            parent, prev = g, local
        covered = full * src_block
        out, size = [], self.block_size
        for j in range(-(-input_len // size)):
            end = min((j + 1) * size, input_len)
            if end <= covered:
                s = (end - 1) // src_block
                key = (chain[s], end - s * src_block)
                o = self._out.get(key)
                if o is None:
                    o = self._out[key] = self._next_out
                    self._next_out += 1
            else:
                o = self._next_out
                self._next_out += 1
            out.append(o)
        return tuple(out)
