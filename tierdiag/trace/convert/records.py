"""What every source format is read into, the checks its fields share, and the block re-chaining.

A converted request is whole when it is made (`SessionRequest`): each reader validates a source
record completely, then builds one; a bad record raises `BadRecord` and the reader adds its
`file:line`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tierdiag.trace.reader import MAX_LENGTH_TOKENS, MAX_SESSION_CHARS, MAX_THINK_MS, MAX_TIMESTAMP_MS


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

    unchained_blocks: int = 0  # source block ids seen behind two different predecessors
    subagents: int = 0  # kv-cache-tester: nested sub-agent conversations, each its own session
    orphans: int = 0  # bailian: turns whose parent chat is not in the input (a session starts there)
    forks: int = 0  # bailian: second children of one chat (a session starts there)
    early_turns: int = 0  # bailian: turns sent before their parent's estimated finish (think_ms 0)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --- field checks shared by the readers (bounds are replay's: what convert writes, replay takes) ----

def show(value: object, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def need_int(obj: dict, key: str, *, low: int = 0, high: int = MAX_LENGTH_TOKENS) -> int:
    if key not in obj:
        raise BadRecord(f"missing field '{key}'")
    value = obj[key]
    if type(value) is not int:  # bool is an int subclass; JSON true is not a count
        raise BadRecord(f"'{key}' must be an integer, got {show(value)}")
    if not low <= value <= high:
        raise BadRecord(f"'{key}' is {show(value)}, expected {low} to {high:,}")
    return value


def need_seconds(obj: dict, key: str, *, required: bool = True) -> float | None:
    """A time in seconds (>= 0, finite, within replay's latest timestamp); None if absent and
    not required."""
    value = obj.get(key)
    if value is None:
        if required:
            raise BadRecord(f"missing field '{key}'")
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BadRecord(f"'{key}' must be a finite number of seconds, got {show(value)}")
    if value < 0:
        raise BadRecord(f"'{key}' is negative ({show(value)})")
    if value * 1000 > min(MAX_TIMESTAMP_MS, MAX_THINK_MS):
        raise BadRecord(f"'{key}' {show(value)} s is too large (at most {MAX_TIMESTAMP_MS // 1000:,} s)")
    return float(value)


def need_ids(obj: dict, key: str = "hash_ids") -> list[int]:
    values = obj.get(key)
    if not isinstance(values, list):
        raise BadRecord(f"missing field '{key}'" if values is None else f"'{key}' must be a list of integers")
    if values and set(map(type, values)) != {int}:
        bad = next(v for v in values if type(v) is not int)
        raise BadRecord(f"'{key}' must hold only integers, found {show(bad)}")
    return values


def session_name(name: str) -> str:
    if len(name) > MAX_SESSION_CHARS:
        raise BadRecord(f"session name is {len(name):,} characters long (at most {MAX_SESSION_CHARS})")
    return name


def timestamp_ms(seconds: float) -> int:
    ms = round(seconds * 1000)
    if ms > MAX_TIMESTAMP_MS:
        raise BadRecord(f"arrives at {seconds:,.3f} s, past the latest timestamp replay takes "
                        f"({MAX_TIMESTAMP_MS // 1000:,} s)")
    return ms


# --- block ids: local source ids -> prefix-chained output ids, re-blocked ---------------------

@dataclass
class Rechainer:
    """Source block ids to output ids of `block_size` tokens that chain like Mooncake's: equal
    output ids mean the same tokens *and* the same prefix.

    Each full source block gets a global id from (namespace, its predecessor's global id, its
    own id): ids numbered per conversation stay apart (one namespace each), and an id the source
    reuses behind a different prefix gets a new global id (its KV differs there; counted in
    `unchained`, since the source's ids were not prefix-chained). An output block is named by
    the source block holding its last token and how far into it it ends:

        source (64)  | g0 | g1 | g2 | g3 | g4 | g5 | g6 | g7 | g8 |g9..   (g: global ids)
        output (128) |  (g1,64) |  (g3,64) |  (g5,64) |  (g7,64) | new   (last block: no full
                                                                         source block covers it)

    A block not covered by full source blocks (an unhashed tail, a partial last source block)
    is never shared: it gets a fresh id. Output ids are numbered by first appearance.
    """

    block_size: int
    unchained: int = 0
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
