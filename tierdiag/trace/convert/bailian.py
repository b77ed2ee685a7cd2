"""Qwen / Alibaba Bailian usage traces (the `qwen-bailian-usagetraces-anon` release): JSONL, one
request a line.

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

- `timestamp`: arrival in seconds (kept as it is, in ms: the trace's own clock).
- `hash_ids`: one id per 16-token block (`ceil` or `floor` of input_length / 16 of them; only
  full blocks are shared), one numbering for the whole trace.
- A session is a chain of `parent_chat_id`s (-1 or absent: none): its name is its first chat's
  id, each request's id its `chat_id`. Parents come before their children in the input.
  A chat whose parent is not in the input starts a session (counted: `orphans`), and so does a
  second child of one chat (a regenerated answer, a fork; counted: `forks`), since a session is
  a line of turns.
- `think_ms` = arrival - the parent's estimated finish. The trace records no finish; it is
  estimated as the parent's arrival + its output_length x `DECODE_MS_PER_TOKEN` (the decode
  speed `synth` assumes; prefill left out, as a follow-up turn's context is mostly cached).
  A turn that arrives before that estimate gets think_ms 0 (counted: `early_turns`).
- `type`, `turn` and any other field are not used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tierdiag.errors import TraceError
from msgspec import Struct

from tierdiag.trace.convert.records import (BadRecord, BlockIds, ConvertNotes, Count, InputCount, Rechainer, Seconds,
                                            SessionClocks, SessionRequest, record, session_name, show, timestamp_ms)
from tierdiag.trace.reader import numbered_lines
from tierdiag.trace.synth import DECODE_MS_PER_TOKEN

SOURCE_BLOCK_SIZE = 16  # tokens a hash id covers in the Bailian traces
_NO_PARENT = -1
_NAMESPACE = 0  # one numbering of hash ids across the whole trace


class Row(Struct):
    """A usage-trace line's fields (`chat_id` and `parent_chat_id`, an integer or a string, are
    checked by `_chat_id`); any other field is not used."""

    timestamp: Seconds
    input_length: InputCount
    output_length: Count
    hash_ids: BlockIds


@dataclass(slots=True)
class _Chat:
    session: str
    arrival_ms: int
    finish_ms: float  # estimated
    where: str  # file:line
    has_child: bool = False  # a child continues this chat's session (a second one forks)


def read(files: list[Path], *, rechain: Rechainer, notes: ConvertNotes) -> Iterator[SessionRequest]:
    chats: dict[str, _Chat] = {}  # chat ids as text: 5 and "5" are one chat (and one request id)
    missing_parents: dict[str, str] = {}  # parent id never seen -> the first child's file:line
    clocks = SessionClocks()
    for path in files:
        for lineno, data in numbered_lines(path):
            where = f"{path}:{lineno}"
            try:
                req = _request(data, lineno, chats, missing_parents, where, rechain, notes, clocks)
            except BadRecord as exc:
                raise TraceError(f"{where}: {exc}") from None
            if req is not None:
                yield req


def _chat_id(obj: dict, key: str) -> str:
    value = obj.get(key)
    if (type(value) is int and value >= 0) or (isinstance(value, str) and value.strip()):
        return str(value)
    raise BadRecord(f"missing field '{key}'" if value is None else
                    f"'{key}' must be a non-negative integer or a non-empty string, got {show(value)}")


def _request(data: bytes, lineno: int, chats: dict, missing_parents: dict, where: str, rechain: Rechainer,
             notes: ConvertNotes, clocks: SessionClocks) -> SessionRequest | None:
    if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("not UTF-8 text (is this a binary file?)") from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        raise BadRecord(f"bad JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise BadRecord("expected a JSON object")
    chat_id = _chat_id(obj, "chat_id")
    parent_id = None if obj.get("parent_chat_id") in (None, _NO_PARENT) else _chat_id(obj, "parent_chat_id")
    row = record(obj, Row)
    arrival_s, input_len, output_len, hash_ids = row.timestamp, row.input_length, row.output_length, row.hash_ids
    want = (input_len // SOURCE_BLOCK_SIZE, -(-input_len // SOURCE_BLOCK_SIZE))
    if len(hash_ids) not in want:
        raise BadRecord(f"'hash_ids' has {len(hash_ids)} entries, expected {want[1]} "
                        f"(one per {SOURCE_BLOCK_SIZE}-token block of input_length {input_len})")
    if chat_id in chats:
        raise BadRecord(f"duplicate chat_id {show(chat_id)} (first at {chats[chat_id].where})")
    if chat_id in missing_parents:
        raise BadRecord(f"chat {show(chat_id)} comes after its child at {missing_parents[chat_id]} "
                        "(parents must come first: sort the input by timestamp)")
    if parent_id == chat_id:
        raise BadRecord(f"chat {show(chat_id)} is its own parent")
    arrival_ms = timestamp_ms(arrival_s)

    parent = chats.get(parent_id) if parent_id is not None else None
    think_ms = None
    if parent is not None and arrival_ms < parent.arrival_ms:
        raise BadRecord(f"arrives at {arrival_s:g} s, before its parent chat {show(parent_id)} "
                        f"({parent.where})")
    if parent is None or parent.has_child:
        if parent is not None:
            notes.forks += 1
        elif parent_id is not None:
            notes.orphans += 1
            missing_parents.setdefault(parent_id, where)
        session = session_name(chat_id)
    else:
        parent.has_child = True
        session = parent.session
        think_ms = round(arrival_ms - parent.finish_ms, 3)
        if think_ms < 0:
            notes.early_turns += 1
            think_ms = 0.0
    clocks.turn(session, arrival_ms, think_ms, "the pause before it (its arrival - the parent's estimated finish)")
    chats[chat_id] = _Chat(session, arrival_ms, arrival_ms + output_len * DECODE_MS_PER_TOKEN, where)
    return SessionRequest(chat_id, session, arrival_ms, input_len, output_len,
                          rechain.blocks(_NAMESPACE, hash_ids, SOURCE_BLOCK_SIZE, input_len), think_ms)
