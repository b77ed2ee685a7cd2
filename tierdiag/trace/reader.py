"""Streaming reader for JSONL workload traces (Mooncake format, or ours with ids/tokens).

One request a line::

    {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [int, ...]}   # Mooncake
    {"id": "sess3-turn2", "timestamp": ms, "input_length": n, "output_length": n,
     "tokens": [int, ...], "session": "sess3", "think_ms": 4200}                    # ours

`session` and `think_ms` describe sessions (chat turns, agent steps): a turn's predecessor is the
previous line of its session (`trace.sessions.predecessors`), `think_ms` the pause between that
turn's answer and this request (the user reading, a tool running).

`hash_ids` name `block_size`-token blocks (the last one may be partial) and chain: two requests
that share hash id k share every block up to k (checked: an id seen behind two different
predecessors is a bad line, since every hit would be wrong after it). `.jsonl.gz` is read transparently (detected by
its magic bytes, not its name). The file is never loaded whole: lines are parsed one at a time
and only the requests that share the current timestamp are held back (see `_spread`).

Every problem is a `TraceError` naming `file:line`; with `skip_bad=True` bad lines are skipped
and counted in a `ReadReport` instead. A line's fields, their types and bounds are declared once,
in `line_model` (msgspec; `trace.fields` words what is wrong); what relates fields to each other
or to other lines (lengths, the hash chain, ids, a session's clock) is checked here.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain as chained
from pathlib import Path
from typing import Annotated, Optional, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from tierdiag.errors import TraceError
from tierdiag.paths import refuse_endless_input
from tierdiag.units import NS_PER_MS
from tierdiag.trace.chain import ChainLinks, _check_chain_slow, link_chain as _link_chain  # noqa: F401 - _check_chain_slow: this module's API too
from tierdiag.trace.fields import FieldError, convert as convert_fields, json_type as _json_type, show as _show
from tierdiag.trace.lines import BadLine, is_seekable_file, numbered_lines, open_raw, skip_bad_line  # noqa: F401 - numbered_lines, is_seekable_file: this module's API too

KNOWN_KEYS = frozenset({"id", "timestamp", "input_length", "output_length", "hash_ids", "tokens",
                        "priority", "extra_key", "session", "think_ms"})
# SGLang's Req.priority is an int; its radix tree stores it in an int64 (RadixCache._insert_helper).
PRIORITY_RANGE = (-(2**63) + 1, 2**63 - 1)
MAX_EXTRA_KEY_CHARS = 1024
MAX_SESSION_CHARS = MAX_EXTRA_KEY_CHARS
# Every time downstream is int64 ns (DuckDB BIGINT, ~292 years). Arrivals (after --time-scale)
# stay below 2**62 ns (~146 years: epoch-millisecond timestamps fit), leaving as much again for
# what the engine adds (queueing, prefill, decode), so no accepted trace can overflow.
MAX_ARRIVAL_NS = 2**62
MAX_TIMESTAMP_MS = MAX_ARRIVAL_NS // NS_PER_MS
# A pause is added to a finish time: bounded like an arrival, so finish + pause stays in int64.
MAX_THINK_MS = MAX_TIMESTAMP_MS
# Lengths in tokens: 2**24 (16.7M) is past every model's context; decode time is output_length
# steps, so this bounds it too.
MAX_LENGTH_TOKENS = 2**24
# Token ids are hashed as 4-byte words (see pages.py); every real vocabulary fits.
MAX_TOKEN_ID = 2**32 - 1


def _line_fields(max_hash: int) -> list:
    """A trace line's fields, each with its type and bounds (`line_model`)."""
    count = Annotated[int, Meta(ge=0, le=MAX_LENGTH_TOKENS, extra={"unit": " tokens"})]
    return [
        ("timestamp", Annotated[int, Meta(ge=0, le=MAX_TIMESTAMP_MS, extra={"unit": " ms"})]),
        ("input_length", Annotated[int, Meta(ge=1, le=MAX_LENGTH_TOKENS, extra={
            "unit": " tokens", "low": "a request needs at least one input token"})]),
        ("output_length", count),
        ("hash_ids", Union[tuple[Annotated[int, Meta(ge=0, le=max_hash)], ...], UnsetType], UNSET),
        ("tokens", Union[tuple[Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)], ...], UnsetType], UNSET),
        ("id", Union[str, UnsetType], UNSET),
        ("priority", Annotated[int, Meta(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1],
                                         extra={"range": "does not fit in a 64-bit integer"})], 0),
        ("extra_key", Optional[Annotated[str, Meta(max_length=MAX_EXTRA_KEY_CHARS)]], None),
        ("session", Optional[Annotated[str, Meta(max_length=MAX_SESSION_CHARS)]], None),
        ("think_ms", Optional[Annotated[float, Meta(ge=0, le=MAX_THINK_MS, extra={"unit": " ms"})]], None),
    ]


@lru_cache(maxsize=8)
def line_model(max_hash: int) -> type:
    """A trace line's fields: types and bounds, declared once (`trace.fields` words a value that
    does not fit). `max_hash` depends on the block size (`max_hash_id`)."""
    return msgspec.defstruct("TraceLine", _line_fields(max_hash), frozen=True)


@lru_cache(maxsize=8)
def _typed_decoder(max_hash: int):
    """The fast path of `_parse`: a line's bytes decoded straight into its fields (no dict, no
    second pass), for a line that holds only known keys, each fitting its declaration. Anything
    else (a blank line, bad JSON, an unknown key, a value out of bounds, a byte-order mark) fails
    here and takes the general path, which finds the same fields or words what is wrong: this
    decoder only ever answers where that path would accept the line, with the same values
    (tests/trace/test_trace_reader.py holds them to each other on Hypothesis-drawn lines). Not
    tracked by the cycle collector (`gc=False`): strings, numbers and tuples of ints hold no cycle."""
    model = msgspec.defstruct("TraceLine", _line_fields(max_hash), frozen=True, forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(model).decode


def pause_ns(think_ms: float) -> int:
    """`think_ms` in integer ns, exact for a whole number of ms (what replay uses, and convert
    checks its sessions' clocks with)."""
    return int(think_ms) * NS_PER_MS if think_ms == int(think_ms) else round(think_ms * NS_PER_MS)


class SessionClock:
    """Per session, the earliest time its next turn can arrive in closed loop: its first turn's
    timestamp plus the pauses (`think_ms`) of its later turns (the replay adds each turn's
    serving time on top). A turn that would take that past MAX_ARRIVAL_NS is a bad line: several
    pauses, each within its own bound, must not add up past the clock's range (issue 39 bug 10).
    `check` raises BadLine without changing anything; `commit` records a turn that was taken."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[str, int] = {}

    def check(self, session: str, timestamp_ns: int, think_ns: int | None, what: str = "'think_ms'") -> int:
        at = self._at.get(session)
        if at is None:  # the session's first turn: its pause, if any, is ignored
            return timestamp_ns
        at += think_ns or 0
        if at > MAX_ARRIVAL_NS:
            raise BadLine(f"{what}: in closed loop this turn of session {_show(session)} would arrive past "
                          f"the latest time tierdiag can keep (the session's first timestamp plus its pauses "
                          f"come to {at // NS_PER_MS:,} ms; at most {MAX_TIMESTAMP_MS:,} ms)")
        return at

    def commit(self, session: str, at: int) -> None:
        self._at[session] = at


class TraceRequest(msgspec.Struct, frozen=True, gc=False):
    """One request of a trace, as the engine reads it. A msgspec Struct rather than a frozen
    dataclass: built in C (a frozen dataclass's `__init__` is an `object.__setattr__` a field,
    ~3 us a request, a quarter of the trace read; issue 41), immutable, compared and hashed by
    its fields all the same. Never tracked by the cycle collector (`gc=False`): its fields are
    strings, integers and tuples of integers, which can hold no cycle, and a run's collector
    passes need not walk a trace's requests."""

    req_id: str  # "id" field if present, else the 1-based line number as a string
    seq: int  # 0-based order among valid requests
    line: int  # 1-based line number in the file
    arrival_ns: int  # timestamp (ms) -> ns, after spreading shared timestamps
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None  # Mooncake blocks (block_size tokens each)
    tokens: tuple[int, ...] | None  # our JSONL alternative
    # Optional per line. `priority`: SGLang's request priority, used by --eviction-policy priority
    # (higher survives longer). `extra_key`: SGLang's RadixKey.extra_key (LoRA id, cache salt):
    # requests under different keys never share a prefix, whatever their tokens.
    priority: int = 0
    extra_key: str | None = None
    # Sessions (optional per line). `session`: the turn's session; its predecessor is the previous
    # request of the same session. `think_ns`: `think_ms` in ns, the pause between the
    # predecessor's answer and this request (None where the line has no `think_ms`).
    session: str | None = None
    think_ns: int | None = None


@dataclass
class ReadReport:
    """What reading a trace found besides the requests; filled while iterating."""

    bad_lines: int = 0
    first_bad: list[tuple[int, str]] = field(default_factory=list)  # (line, message), first 5
    unknown_keys: set[str] = field(default_factory=set)
    num_requests: int = 0
    sha256: str | None = None  # of the bytes read, once the whole input was read (pipes)




def max_hash_id(block_size: int) -> int:
    """Largest hash id whose page keys (`pages.page_keys`) still fit in 63 bits at any page size."""
    return (2**63 - 1) // block_size - 1


def trace_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of the file bytes as stored (compressed or not), read in chunks."""
    import hashlib  # here: an unrecorded replay takes no digest, and OpenSSL's load is ~2 ms

    digest = hashlib.sha256()
    with open_raw(Path(path)) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_trace(path: str | os.PathLike, *, block_size: int = 512, skip_bad: bool = False,
               report: ReadReport | None = None) -> Iterator[TraceRequest]:
    """Yield the trace's requests in file order, arrivals spread (see `_spread`).

    Raises TraceError on the first bad line (or, with skip_bad, counts it in `report` and goes
    on), and when the file holds no valid request at all.
    """
    if block_size < 1:
        raise TraceError(f"block size must be a positive number of tokens, got {block_size}")
    path = Path(path)
    if is_seekable_file(path):
        open_raw(path).close()  # a missing file fails at the call, not at the first next()
    elif refuse_endless_input(path, what="trace file") or not path.exists():
        raise TraceError(f"{path}: no such trace file")
    elif path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    report = report if report is not None else ReadReport()
    return _spread(_parse(path, block_size=block_size, skip_bad=skip_bad, report=report), path, report)


def _parse(path: Path, *, block_size: int, skip_bad: bool, report: ReadReport) -> Iterator[tuple[int, tuple]]:
    """Validate each line; yield (timestamp_ms, the request's fields but arrival_ns) in file order.

    Fields rather than a TraceRequest: it is frozen, and `_spread` builds each one once, with
    its arrival."""
    # The ids accepted so far, and (by seq) each one's id and line, for a duplicate's message: a
    # set, a list and an array('q') rather than a dict of id -> line number (a Python int a
    # line: ~70 -> ~50 MB at a million requests, held by the engine process through the run;
    # issue 41). A duplicate, rare and fatal or skipped, finds its first line by a scan.
    seen_ids: set[str] = set()
    ids_by_seq: list[str] = []
    line_by_seq = array("q")
    # hash id -> the id before it (-1: first block). Mooncake ids chain: a shared id means a
    # shared prefix. The radix tree and page keys rely on it, so a trace that breaks it is
    # rejected rather than credited with hits it does not have.
    parents = ChainLinks()
    last_ts = -1
    seq = 0
    max_hash = max_hash_id(block_size)
    model = line_model(max_hash)
    typed = _typed_decoder(max_hash)
    known_keys = KNOWN_KEYS
    decode = msgspec.json.Decoder().decode
    clock = SessionClock()
    clock_at = clock._at  # its check and commit inline below: two calls a session's line less
    for lineno, data in numbered_lines(path, report):
        try:
            try:
                line = typed(data)  # most lines: straight into their fields
            except (msgspec.DecodeError, RecursionError):
                if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
                    data = data[3:]  # a UTF-8 byte-order mark some editors write
                try:
                    obj = decode(data)
                except (msgspec.DecodeError, RecursionError):  # blank lines, NaN, bad UTF-8: worded by json.loads
                    obj = _loads_slow(data)
                    if obj is None:
                        continue
                if type(obj) is not dict:
                    raise BadLine(f"expected a JSON object, got {_json_type(obj)}")
                if not known_keys.issuperset(obj):
                    report.unknown_keys.update(obj.keys() - known_keys)
                try:
                    line = convert_fields(obj, model)
                except FieldError as exc:
                    raise BadLine(str(exc)) from None
            # What relates a line's fields (each fits its declaration, `line_model`): checked
            # here, in this order (inline: a call and a tuple a line less than a helper's).
            input_len = line.input_length
            hash_ids, tokens = line.hash_ids, line.tokens
            if hash_ids is not UNSET:
                if tokens is not UNSET:
                    raise BadLine("needs exactly one of 'hash_ids' or 'tokens', found both")
                tokens = None
                if len(hash_ids) != -(-input_len // block_size):
                    raise BadLine(f"'hash_ids' has {len(hash_ids)} entries, expected {-(-input_len // block_size)} "
                                  f"(ceil(input_length {input_len} / block size {block_size}); see --block-size)")
            elif tokens is UNSET:
                raise BadLine("needs exactly one of 'hash_ids' or 'tokens', found neither")
            else:
                hash_ids = None
                if len(tokens) != input_len:
                    raise BadLine(f"'tokens' has {len(tokens)} entries but 'input_length' is {input_len}")
            req_id = line.id
            if req_id is UNSET:
                req_id = str(lineno)
            elif not req_id.strip():
                raise BadLine("'id' is empty")
            session = line.session  # null: no session, as an absent field
            if session is not None and not session.strip():
                raise BadLine("'session' is empty")
            think_ms = line.think_ms
            think_ns = None
            if think_ms is not None:
                if session is None:
                    raise BadLine("'think_ms' without a 'session' (the pause follows the previous turn of the same session)")
                think_ns = pause_ns(think_ms)
            ts = line.timestamp
            if ts < last_ts:
                raise BadLine(f"timestamp {ts} goes backwards (previous request is at {last_ts})")
            if req_id in seen_ids:
                first = line_by_seq[ids_by_seq.index(req_id)]
                raise BadLine(f"duplicate id {_show(req_id)} (first used on line {first})")
            if session is not None:
                at = clock_at.get(session)
                if at is None:  # the session's first turn (`SessionClock.check`)
                    at = ts * NS_PER_MS
                else:
                    at += think_ns or 0
                    if at > MAX_ARRIVAL_NS:
                        clock.check(session, ts * NS_PER_MS, think_ns)  # raises, worded there
            if hash_ids is not None:
                _link_chain(hash_ids, parents)  # last: a line that fails leaves no links behind
        except BadLine as exc:
            report.bad_lines += 1
            if skip_bad_line(path, lineno, exc, skip_bad, report.bad_lines):
                report.first_bad.append((lineno, str(exc)))
            continue
        if session is not None:
            clock_at[session] = at
        seen_ids.add(req_id)
        ids_by_seq.append(req_id)
        line_by_seq.append(lineno)
        last_ts = ts
        yield ts, (req_id, seq, lineno, input_len, line.output_length, hash_ids, tokens, line.priority,
                   line.extra_key, session, think_ns)
        seq += 1


def _loads(text: str) -> dict:
    """One non-blank line's object, decoded as `_parse` does (msgspec, then json.loads for what
    msgspec refuses: the accepted objects and every error, message and column, are json.loads's)."""
    data = text.encode("utf-8", "surrogatepass")
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        obj = _loads_slow(data)
    if type(obj) is not dict:
        raise BadLine(f"expected a JSON object, got {_json_type(obj)}")
    return obj


def _loads_slow(data: bytes) -> object | None:
    """A line msgspec could not decode: None for a blank line, else the object json.loads makes
    of it (it reads NaN and Infinity, which are then worded as not finite) or BadLine with its
    message and column."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadLine("not UTF-8 text (is this a binary file?)") from None
    if not text or text.isspace():  # `not text.strip()`, without the copy
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise BadLine("bad JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise BadLine(f"bad JSON ({_first_line(exc)})") from None
    if type(obj) is dict:
        _refuse_lone_surrogates(obj)
    return obj


def _refuse_lone_surrogates(obj: dict) -> None:
    """json.loads takes an escaped lone surrogate ("\\ud800", which msgspec refuses): text that
    no UTF-8 file or store can hold, so an id, session or key holding one would fail only when
    the run is written. A bad line here instead."""
    for key, value in obj.items():
        for text, what in ((key, "a key"), (value, f"'{key}'")):
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    shown = text.encode("ascii", "backslashreplace").decode("ascii")
                    raise BadLine(f"{what} holds text that is not valid Unicode (a lone surrogate: "
                                  f"{shown[:40]})") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- spreading shared timestamps ------------------------------------------------------------

def _spread(parsed: Iterator[tuple[int, tuple]], path: Path, report: ReadReport) -> Iterator[TraceRequest]:
    """Give requests that share a timestamp evenly spaced arrivals.

    Mooncake buckets timestamps (~3 s buckets of ~10 requests in the conversation trace);
    replaying a bucket as one burst would invent queueing. A group of k requests at t whose
    next distinct timestamp is t2 gets arrivals t + i*(t2 - t)/k, i = 0..k-1:

        t                                   t2
        |--r0------r1------r2------r3-------|--r4 ...

    The last group has no t2. It is spread over the mean gap between distinct timestamps of
    the whole trace (a bucketed trace keeps its rhythm to the end); a trace with a single
    distinct timestamp leaves that group at t, since there is no gap to learn from.
    Arrivals are integer ns, rounded down, so they never reach t2.
    """
    group: list[tuple] = []
    group_ts = first_ts = -1
    num_distinct = 0
    # The end of the input is one more (timestamp, fields) pair, so that the last group is spread
    # by the same loop (over the mean gap) as the others (over the gap to the next timestamp).
    for ts, fields in chained(parsed, _END):
        if ts != group_ts:
            if group:
                if ts is None:
                    mean_gap_ms = (group_ts - first_ts) / (num_distinct - 1) if num_distinct > 1 else 0.0
                    gap_ns = round((group_ts + mean_gap_ms - group_ts) * NS_PER_MS)
                else:
                    gap_ns = (ts - group_ts) * NS_PER_MS
                k = len(group)
                base_ns = group_ts * NS_PER_MS
                for i, (req_id, seq, line, input_len, output_len, hash_ids, tokens, priority, extra_key, session,
                        think_ns) in enumerate(group):
                    report.num_requests += 1
                    yield TraceRequest(req_id, seq, line, base_ns + i * gap_ns // k, input_len, output_len, hash_ids,
                                       tokens, priority, extra_key, session, think_ns)
                group = []
            if ts is None:
                break
            group_ts = ts
            num_distinct += 1
            if first_ts < 0:
                first_ts = ts
        group.append(fields)
    if first_ts < 0:
        skipped = f" ({report.bad_lines} bad lines skipped)" if report.bad_lines else ""
        raise TraceError(f"{path}: no requests in the trace{skipped}",
                         hint="expected one JSON object a line")


_END = ((None, None),)
