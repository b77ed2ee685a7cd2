"""kv-cache-tester traces (github.com/callanjfox/kv-cache-tester, `trace_replay_tester.py`): one
JSON file per agentic-coding conversation.

    {"id": "f64a8d4c-12d", "block_size": 64, "hash_id_scope": "local",
     "requests": [{"t": 0.0, "type": "s", "in": 25259, "out": 86, "hash_ids": [1, 2, ...],
                   "model": "...", "api_time": 3.1, "think_time": 0.0, "stop": "tool_use"},
                  {"t": 12.5, "type": "subagent", "requests": [...], ...}, ...]}

- `t`: seconds from the conversation's start; the files carry no absolute start, so
  conversations start `start_spread_s` apart on average (exponential gaps, seeded: a Poisson
  stream of conversations, the first at 0). A sub-agent's `t` values count from its spawn
  marker's `t` (the tester spawns the sub-agent when its parent reaches the marker and replays
  it from there), so its requests are at conversation start + marker `t` + their own `t`
  (nested sub-agents add each marker on the way).
- `hash_ids`: one id per *full* `block_size`-token block (`in // block_size` of them; the tail
  is never shared). `hash_id_scope` `local` (the default): ids are numbered per file, a file's
  sub-agents included, so files are kept apart; `global`: one numbering across files.
- `think_time` (s): the client's pause before this request, after the previous answer;
  `think_ms` of every turn after a session's first. `api_time`, `model`, `stop`, `type` `s`/`n`
  (streaming or not) and any other field are not used.
- `type: "subagent"` with its own `requests` and its spawn time `t`: a nested conversation,
  replayed as its own session (`<session>/sa<n>`, numbered in file order; the tester runs
  sub-agents as separate users). A session name is one conversation's across all files: a file
  whose `id` is another file's sub-agent session (`x/sa1`) is a bad record naming both files.

The session is the file's `id` (else its file name without `.json`); requests are
`<session>#<n>`, n counting from 1 within the session.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal, Optional

import msgspec
from msgspec import Meta, Struct

from tierdiag.errors import ConfigError, TraceError
from tierdiag.paths import refuse_endless_input
from tierdiag.trace.convert.jsonpos import line_of
from tierdiag.trace.convert.records import (MAX_SECONDS, BadRecord, BlockIds, ConvertNotes, Count, InputCount,
                                            Rechainer, Seconds, SessionClocks, SessionRequest, record, session_name,
                                            timestamp_ms)
from tierdiag.trace.reader import MAX_LENGTH_TOKENS

DEFAULT_BLOCK_SIZE = 64  # what the tester assumes when a file has no `block_size`
SCOPES = ("local", "global")
# Conversation starts (--start-spread) stay in the first half of the clock's range, leaving the
# other half to the conversations' own `t`: a start past it is the option's fault, not a file's.
MAX_START_S = MAX_SECONDS // 2


class Conversation(Struct):
    """A file's top-level fields (`id` is checked by hand: absent means the file's name)."""

    requests: list
    block_size: Annotated[int, Meta(ge=1, le=MAX_LENGTH_TOKENS)] = DEFAULT_BLOCK_SIZE
    hash_id_scope: Literal["local", "global"] = "local"


class Request(Struct):
    """A request's fields; any other (`api_time`, `model`, `stop`, `type` s/n) is not used."""

    t: Seconds
    in_: InputCount = msgspec.field(name="in")
    out: Count
    hash_ids: BlockIds
    think_time: Optional[Seconds] = None


class SubAgent(Struct):
    """A sub-agent marker: when it is spawned (`t`, on its parent's clock) and its requests."""

    t: Seconds
    requests: list


class _Bad(BadRecord):
    def __init__(self, message: str, where: tuple):
        super().__init__(message)
        self.where = where


def conversation_starts(num_files: int, start_spread_s: float, seed: int) -> list[float]:
    """Each file's start (s): exponential gaps of mean `start_spread_s`, seeded, the first at 0.
    ConfigError (exit 2, naming --start-spread) when the last start would pass MAX_START_S."""
    rng = random.Random(f"kv-cache-tester/{seed}")
    starts, start_s = [], 0.0
    for index in range(num_files):
        if index and start_spread_s > 0:
            start_s += rng.expovariate(1.0 / start_spread_s)
        starts.append(start_s)
    if starts and starts[-1] > MAX_START_S:
        raise ConfigError(f"--start-spread {start_spread_s:g} over {num_files:,} files places the last conversation "
                          f"start at {starts[-1]:,.0f} s, past the latest start a trace can hold ({MAX_START_S:,} s)",
                          hint="pass a smaller --start-spread")
    return starts


def read(files: list[Path], *, rechain: Rechainer, notes: ConvertNotes, start_spread_s: float,
         seed: int) -> Iterator[SessionRequest]:
    starts = conversation_starts(len(files), start_spread_s, seed)
    owners: dict[str, tuple[Path, str]] = {}  # every session name (file ids and sub-agents) -> its file
    clocks = SessionClocks()
    for index, path in enumerate(files):
        text = _text(path)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{exc.lineno}: bad JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"{path}:1: bad JSON ({type(exc).__name__})") from None
        try:
            yield from _conversation(doc, path, index, starts[index], owners, clocks, rechain, notes)
        except _Bad as exc:
            raise TraceError(f"{path}:{line_of(text, exc.where)}: {exc}") from None


def _text(path: Path) -> str:
    refuse_endless_input(path, what="kv-cache-tester file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"{path}:1: not UTF-8 text (is this a binary file?)") from None


_ID, _SUB = "conversation id", "sub-agent session"


def _claim(session: str, path: Path, owners: dict[str, tuple[Path, str]], what: str, where: tuple) -> None:
    """`session` is this file's (`what`: its id, or a sub-agent's session); a name another file
    (or this one) already has would merge two conversations (issue 39 bug 3)."""
    taken = owners.get(session)
    if taken is not None:
        other, kind = taken
        also = ("the id of " if kind == _ID else "a sub-agent session of ") + (
            "this file" if other == path else str(other))
        raise _Bad(f"{what} {json.dumps(session)[:200]} is also {also}: two conversations would be merged "
                   "(change a file's 'id')", where)
    owners[session] = (path, what)


def _conversation(doc: object, path: Path, index: int, start_s: float, owners: dict[str, tuple[Path, str]],
                  clocks: SessionClocks, rechain: Rechainer, notes: ConvertNotes) -> Iterator[SessionRequest]:
    if not isinstance(doc, dict):
        raise _Bad("expected a JSON object (one conversation a file)", ())
    try:
        conv = record(doc, Conversation)
        name = doc.get("id", path.stem)
        if not isinstance(name, str) or not name.strip():
            raise BadRecord("'id' must be a non-empty string")
        session = session_name(name)
    except BadRecord as exc:
        raise _Bad(str(exc), ()) from None
    _claim(session, path, owners, _ID, ())
    namespace = index if conv.hash_id_scope == "local" else -1
    yield from _requests(conv.requests, session, ("requests",), namespace, conv.block_size, start_s, path, owners,
                         clocks, rechain, notes)


def _requests(requests: list, session: str, where: tuple, namespace: int, block_size: int, start_s: float,
              path: Path, owners: dict[str, tuple[Path, str]], clocks: SessionClocks, rechain: Rechainer,
              notes: ConvertNotes) -> Iterator[SessionRequest]:
    """The requests of one session whose clock starts at `start_s` (s from the trace's start):
    its conversation's start, or for a sub-agent its parent's start + the marker's `t`."""
    turn = 0
    last_t = 0.0
    num_subagents = 0
    for k, req in enumerate(requests):
        at = (*where, k)
        if not isinstance(req, dict):
            raise _Bad(f"a request must be a JSON object, got {json.dumps(req)[:40]}", where)
        if req.get("type") == "subagent":
            if not isinstance(req.get("requests"), list):
                raise _Bad("a sub-agent entry needs 'requests' (a list)", at)
            try:
                marker = record(req, SubAgent)
            except BadRecord as exc:
                raise _Bad(f"sub-agent entry: {exc}", at) from None
            num_subagents += 1
            notes.subagents += 1
            try:
                sub = session_name(f"{session}/sa{num_subagents}")
            except BadRecord as exc:
                raise _Bad(str(exc), at) from None
            _claim(sub, path, owners, _SUB, at)
            yield from _requests(marker.requests, sub, (*at, "requests"), namespace, block_size, start_s + marker.t,
                                 path, owners, clocks, rechain, notes)
            continue
        try:
            r = record(req, Request)
            t, input_len, hash_ids = r.t, r.in_, r.hash_ids
            if len(hash_ids) != input_len // block_size:
                raise BadRecord(f"'hash_ids' has {len(hash_ids)} entries, expected {input_len // block_size} "
                                f"(one per full {block_size}-token block of 'in' {input_len})")
            if turn and t < last_t:
                raise BadRecord(f"'t' {t:g} goes backwards (the session's previous request is at {last_t:g})")
            ts = timestamp_ms(t, start_s=start_s)
            think_ms = None if turn == 0 or r.think_time is None else round(r.think_time * 1000, 3)
            clocks.turn(session, ts, think_ms, "'think_time'")
        except BadRecord as exc:
            raise _Bad(str(exc), at) from None
        turn += 1
        last_t = t
        yield SessionRequest(f"{session}#{turn}", session, ts, input_len, r.out,
                             rechain.blocks(namespace, hash_ids, block_size, input_len), think_ms)
