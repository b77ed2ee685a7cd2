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
and counted in a `ReadReport` instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tierdiag.errors import TraceError
from tierdiag.trace.lines import BadLine, is_seekable_file, numbered_lines, open_raw, skip_bad_line  # noqa: F401 - numbered_lines, is_seekable_file: this module's API too

KNOWN_KEYS = frozenset({"id", "timestamp", "input_length", "output_length", "hash_ids", "tokens",
                        "priority", "extra_key", "session", "think_ms"})
# SGLang's Req.priority is an int; its radix tree stores it in an int64 (RadixCache._insert_helper).
PRIORITY_RANGE = (-(2**63) + 1, 2**63 - 1)
MAX_EXTRA_KEY_CHARS = 1024
MAX_SESSION_CHARS = MAX_EXTRA_KEY_CHARS
NS_PER_MS = 1_000_000
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


@dataclass(frozen=True, slots=True)
class TraceRequest:
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
    elif not path.exists():
        raise TraceError(f"{path}: no such trace file")
    elif path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    report = report if report is not None else ReadReport()
    return _spread(_parse(path, block_size=block_size, skip_bad=skip_bad, report=report), path, report)


def _parse(path: Path, *, block_size: int, skip_bad: bool, report: ReadReport) -> Iterator[tuple[int, tuple]]:
    """Validate each line; yield (timestamp_ms, the request's fields but arrival_ns) in file order.

    Fields rather than a TraceRequest: it is frozen, and `_spread` builds each one once, with
    its arrival (a frozen dataclass's construction is ten object.__setattr__ calls)."""
    seen_ids: dict[str, int] = {}
    # hash id -> the id before it (-1: first block). Mooncake ids chain: a shared id means a
    # shared prefix. The radix tree and page keys rely on it, so a trace that breaks it is
    # rejected rather than credited with hits it does not have.
    parents: dict[int, int] = {}
    last_ts = -1
    seq = 0
    max_hash = max_hash_id(block_size)
    known_keys = KNOWN_KEYS
    for lineno, data in numbered_lines(path, report):
        try:
            if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]  # a UTF-8 byte-order mark some editors write
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise BadLine("not UTF-8 text (is this a binary file?)") from None
            if not text or text.isspace():  # `not text.strip()`, without the copy
                continue
            obj = _loads(text)
            if not known_keys.issuperset(obj):
                report.unknown_keys.update(obj.keys() - known_keys)
            ts, fields = _request(obj, lineno, seq, block_size, max_hash)
            if ts < last_ts:
                raise BadLine(f"timestamp {ts} goes backwards (previous request is at {last_ts})")
            req_id = fields[0]
            first = seen_ids.get(req_id)
            if first is not None:
                raise BadLine(f"duplicate id {_show(req_id)} (first used on line {first})")
            if fields[5]:
                _link_chain(fields[5], parents)  # last: a line that fails leaves no links behind
        except BadLine as exc:
            report.bad_lines += 1
            if skip_bad_line(path, lineno, exc, skip_bad, report.bad_lines):
                report.first_bad.append((lineno, str(exc)))
            continue
        seen_ids[req_id] = lineno
        last_ts = ts
        seq += 1
        yield ts, fields


# The scanner json.loads ends in, called directly for a line that is one object (see _loads).
_scan_json = json.scanner.make_scanner(json.JSONDecoder())
_JSON_SPACE = " \t\n\r"


def _scanned_object(text: str) -> dict | None:
    """The line's object by the scanner alone; None where json.loads is to parse it (a failure,
    whose message and column json.loads gives again, or more than whitespace after it)."""
    try:
        obj, end = _scan_json(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return obj if end == len(text) or not text[end:].strip(_JSON_SPACE) else None


def _loads(text: str) -> dict:
    # json.loads wraps the scanner in two regex whitespace matches and three Python calls. A
    # line that starts with "{" and ends in JSON whitespace after the object parses the same
    # by the scanner alone; anything else, a failure included, goes through json.loads, whose
    # error (and column) is the one reported.
    if text[0] == "{":
        obj = _scanned_object(text)
        if obj is not None:
            return obj
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise BadLine("bad JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise BadLine(f"bad JSON ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise BadLine(f"expected a JSON object, got {_json_type(obj)}")
    return obj


def _request(obj: dict, lineno: int, seq: int, block_size: int, max_hash: int) -> tuple[int, tuple]:
    """(timestamp ms, TraceRequest's fields in order, arrival_ns left out)."""
    # Each field is tested inline and `_int_field` called only to word what is wrong with it.
    ts = obj.get("timestamp")
    if type(ts) is not int or ts < 0:
        ts = _int_field(obj, "timestamp")
    if ts > MAX_TIMESTAMP_MS:
        raise BadLine(f"'timestamp' {_show(ts)} is too large (at most {MAX_TIMESTAMP_MS} ms)")
    input_len = obj.get("input_length")
    if type(input_len) is not int or input_len < 0:
        input_len = _int_field(obj, "input_length")
    if input_len == 0:
        raise BadLine("'input_length' is 0 (a request needs at least one input token)")
    output_len = obj.get("output_length")
    if type(output_len) is not int or output_len < 0:
        output_len = _int_field(obj, "output_length")
    if input_len > MAX_LENGTH_TOKENS:
        raise BadLine(f"'input_length' {_show(input_len)} is too large (at most {MAX_LENGTH_TOKENS:,} tokens)")
    if output_len > MAX_LENGTH_TOKENS:
        raise BadLine(f"'output_length' {_show(output_len)} is too large (at most {MAX_LENGTH_TOKENS:,} tokens)")

    has_hashes, has_tokens = "hash_ids" in obj, "tokens" in obj
    if has_hashes == has_tokens:
        raise BadLine("needs exactly one of 'hash_ids' or 'tokens', found "
                       + ("both" if has_hashes else "neither"))
    hash_ids = tokens = None
    if has_hashes:
        hash_ids = _int_list(obj, "hash_ids", max_hash)
        want = -(-input_len // block_size)
        if len(hash_ids) != want:
            raise BadLine(f"'hash_ids' has {len(hash_ids)} entries, expected {want} "
                           f"(ceil(input_length {input_len} / block size {block_size}); see --block-size)")
    else:
        tokens = _int_list(obj, "tokens", MAX_TOKEN_ID)
        if len(tokens) != input_len:
            raise BadLine(f"'tokens' has {len(tokens)} entries but 'input_length' is {input_len}")

    if "id" in obj:
        req_id = obj["id"]
        if not isinstance(req_id, str):
            raise BadLine(f"'id' must be a string, got {_json_type(req_id)}")
        if not req_id.strip():
            raise BadLine("'id' is empty")
    else:
        req_id = str(lineno)
    priority = 0
    if "priority" in obj:
        priority = obj["priority"]
        if type(priority) is not int:
            raise BadLine(f"'priority' must be an integer, got {_json_type(priority)} {_show(priority)}")
        if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
            raise BadLine(f"'priority' {_show(priority)} does not fit in a 64-bit integer")
    extra_key = obj.get("extra_key")  # null: no key, as an absent field
    if extra_key is not None:
        if not isinstance(extra_key, str):
            raise BadLine(f"'extra_key' must be a string, got {_json_type(extra_key)}")
        if len(extra_key) > MAX_EXTRA_KEY_CHARS:
            raise BadLine(f"'extra_key' is {len(extra_key):,} characters long (at most {MAX_EXTRA_KEY_CHARS})")
    session = obj.get("session")  # null: no session, as an absent field
    think_ns = None
    if session is not None:
        session = _session(session)
    think_ms = obj.get("think_ms")
    if think_ms is not None:
        think_ns = _think_ns(think_ms, session)
    return ts, (req_id, seq, lineno, input_len, output_len, hash_ids, tokens, priority, extra_key, session, think_ns)


def _session(session: object) -> str:
    if not isinstance(session, str):
        raise BadLine(f"'session' must be a string, got {_json_type(session)} {_show(session)}")
    if not session.strip():
        raise BadLine("'session' is empty")
    if len(session) > MAX_SESSION_CHARS:
        raise BadLine(f"'session' is {len(session):,} characters long (at most {MAX_SESSION_CHARS})")
    return session


def _think_ns(think_ms: object, session: str | None) -> int:
    if type(think_ms) not in (int, float):  # bool is an int subclass; JSON true is not a pause
        raise BadLine(f"'think_ms' must be a number, got {_json_type(think_ms)} {_show(think_ms)}")
    if not math.isfinite(think_ms):  # json reads NaN and Infinity
        raise BadLine(f"'think_ms' must be a finite number, got {think_ms}")
    if think_ms < 0:
        raise BadLine(f"'think_ms' is negative ({_show(think_ms)})")
    if think_ms > MAX_THINK_MS:
        raise BadLine(f"'think_ms' {_show(think_ms)} is too large (at most {MAX_THINK_MS} ms)")
    if session is None:
        raise BadLine("'think_ms' without a 'session' (the pause follows the previous turn of the same session)")
    return think_ms * NS_PER_MS if type(think_ms) is int else round(think_ms * NS_PER_MS)


def _int_field(obj: dict, key: str) -> int:
    try:
        value = obj[key]
    except KeyError:
        raise BadLine(f"missing field '{key}'") from None
    if type(value) is not int:  # bool is an int subclass; JSON true is not a length
        raise BadLine(f"'{key}' must be an integer, got {_json_type(value)} {_show(value)}")
    if value < 0:
        raise BadLine(f"'{key}' is negative ({_show(value)})")
    return value


def _int_list(obj: dict, key: str, max_value: int) -> tuple[int, ...]:
    values = obj[key]
    if not isinstance(values, list):
        raise BadLine(f"'{key}' must be a list of integers, got {_json_type(values)}")
    if not values:
        return ()
    # One C-level pass for the types, then min/max: a per-element Python loop would dominate
    # reading time on long traces.
    if set(map(type, values)) != {int}:
        bad = next(v for v in values if type(v) is not int)
        raise BadLine(f"'{key}' must hold only integers, found {_json_type(bad)} {_show(bad)}")
    lo, hi = min(values), max(values)
    if lo < 0:
        raise BadLine(f"'{key}' holds a negative value ({_show(lo)})")
    if hi > max_value:
        raise BadLine(f"'{key}' holds {_show(hi)}, larger than the maximum {max_value}")
    return tuple(values)


def _link_chain(hash_ids: tuple[int, ...], parents: dict[int, int]) -> None:
    """Add this line's links to `parents`; raise, adding none, if an id follows a different
    predecessor than before (or than earlier in the line).

    A chained trace's line is ids seen before (a shared prefix) then ids never seen, each once:
    that shape is checked with C-level tuple compares and one `parents` look-up an id, and its
    new ids go straight in, no Python loop. Anything else (a broken chain, an id twice in the
    line) takes `_check_chain_slow`, which finds the same links or the first bad position."""
    knowns = tuple(map(parents.get, hash_ids))
    prevs = (-1, *hash_ids[:-1])
    if knowns == prevs:
        return
    if None in knowns:
        i = knowns.index(None)
        num_new = len(knowns) - i
        if knowns[:i] == prevs[:i] and knowns.count(None) == num_new:
            before = len(parents)
            parents.update(zip(hash_ids[i:], prevs[i:]))
            if len(parents) == before + num_new:
                return
            for h in hash_ids[i:]:  # an id twice among the new ones: undo, then find the error
                parents.pop(h, None)
    parents.update(_check_chain_slow(hash_ids, parents))


def _check_chain_slow(hash_ids: tuple[int, ...], parents: dict[int, int]) -> dict[int, int]:
    """The links this line adds to `parents`; raises if an id follows a different predecessor."""
    new: dict[int, int] = {}
    prev = -1
    for pos, h in enumerate(hash_ids):
        known = parents.get(h)
        if known is None:
            known = new.setdefault(h, prev)
        if known != prev:
            before = "nothing" if known < 0 else f"id {known}"
            here = "nothing" if prev < 0 else f"id {prev}"
            raise BadLine(f"'hash_ids' do not chain: id {h} at position {pos} follows {here} here but "
                           f"{before} before (a shared hash id must mean a shared prefix)")
        prev = h
    return new


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _show(value: object, limit: int = 40) -> str:
    """A short one-line rendering of a value for an error message."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    for ts, fields in parsed:
        if group and ts != group_ts:
            yield from _emit(group, group_ts, ts, report)
            group = []
        if not group:
            group_ts = ts
            num_distinct += 1
            if first_ts < 0:
                first_ts = ts
        group.append(fields)
    if not group:
        skipped = f" ({report.bad_lines} bad lines skipped)" if report.bad_lines else ""
        raise TraceError(f"{path}: no requests in the trace{skipped}",
                         hint="expected one JSON object a line")
    mean_gap_ms = (group_ts - first_ts) / (num_distinct - 1) if num_distinct > 1 else 0.0
    yield from _emit(group, group_ts, group_ts + mean_gap_ms, report)


def _emit(group: list[tuple], ts_ms: int, next_ts_ms: float, report: ReadReport) -> Iterator[TraceRequest]:
    k = len(group)
    base_ns = ts_ms * NS_PER_MS
    gap_ns = round((next_ts_ms - ts_ms) * NS_PER_MS)
    for i, (req_id, seq, line, input_len, output_len, hash_ids, tokens, priority, extra_key, session,
            think_ns) in enumerate(group):
        report.num_requests += 1
        yield TraceRequest(req_id, seq, line, base_ns + i * gap_ns // k, input_len, output_len, hash_ids, tokens,
                           priority, extra_key, session, think_ns)
