"""kv-cache-tester traces (github.com/callanjfox/kv-cache-tester, `trace_replay_tester.py`): one
JSON file per agentic-coding conversation.

    {"id": "f64a8d4c-12d", "block_size": 64, "hash_id_scope": "local",
     "requests": [{"t": 0.0, "type": "s", "in": 25259, "out": 86, "hash_ids": [1, 2, ...],
                   "model": "...", "api_time": 3.1, "think_time": 0.0, "stop": "tool_use"},
                  {"t": 12.5, "type": "subagent", "requests": [...], ...}, ...]}

- `t`: seconds from the conversation's start; the files carry no absolute start, so
  conversations start `start_spread_s` apart on average (exponential gaps, seeded: a Poisson
  stream of conversations, the first at 0). A sub-agent's requests are on the same clock (the
  tester spawns a sub-agent when its parent reaches the marker's `t`).
- `hash_ids`: one id per *full* `block_size`-token block (`in // block_size` of them; the tail
  is never shared). `hash_id_scope` `local` (the default): ids are numbered per file, a file's
  sub-agents included, so files are kept apart; `global`: one numbering across files.
- `think_time` (s): the client's pause before this request, after the previous answer;
  `think_ms` of every turn after a session's first. `api_time`, `model`, `stop`, `type` `s`/`n`
  (streaming or not) and any other field are not used.
- `type: "subagent"` with its own `requests`: a nested conversation, replayed as its own session
  (`<session>/sa<n>`, numbered in file order; the tester runs sub-agents as separate users).

The session is the file's `id` (else its file name without `.json`); requests are
`<session>#<n>`, n counting from 1 within the session.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from tierdiag.errors import TraceError
from tierdiag.trace.convert.jsonpos import line_of
from tierdiag.trace.convert.records import (BadRecord, ConvertNotes, Rechainer, SessionRequest, need_ids, need_int,
                                            need_seconds, session_name, timestamp_ms)

DEFAULT_BLOCK_SIZE = 64  # what the tester assumes when a file has no `block_size`
SCOPES = ("local", "global")


class _Bad(BadRecord):
    def __init__(self, message: str, where: tuple):
        super().__init__(message)
        self.where = where


def read(files: list[Path], *, rechain: Rechainer, notes: ConvertNotes, start_spread_s: float,
         seed: int) -> Iterator[SessionRequest]:
    rng = random.Random(f"kv-cache-tester/{seed}")
    start_s = 0.0
    first_file: dict[str, Path] = {}
    for index, path in enumerate(files):
        if index and start_spread_s > 0:
            start_s += rng.expovariate(1.0 / start_spread_s)
        text = _text(path)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{exc.lineno}: bad JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"{path}:1: bad JSON ({type(exc).__name__})") from None
        try:
            yield from _conversation(doc, path, index, start_s, first_file, rechain, notes)
        except _Bad as exc:
            raise TraceError(f"{path}:{line_of(text, exc.where)}: {exc}") from None


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"{path}:1: not UTF-8 text (is this a binary file?)") from None


def _conversation(doc: object, path: Path, index: int, start_s: float, first_file: dict[str, Path],
                  rechain: Rechainer, notes: ConvertNotes) -> Iterator[SessionRequest]:
    if not isinstance(doc, dict):
        raise _Bad("expected a JSON object (one conversation a file)", ())
    try:
        block_size = need_int(doc, "block_size", low=1) if "block_size" in doc else DEFAULT_BLOCK_SIZE
        scope = doc.get("hash_id_scope", "local")
        if scope not in SCOPES:
            raise BadRecord(f"'hash_id_scope' is {json.dumps(scope)[:40]}, expected one of {', '.join(SCOPES)}")
        name = doc.get("id", path.stem)
        if not isinstance(name, str) or not name.strip():
            raise BadRecord("'id' must be a non-empty string")
        session = session_name(name)
        if not isinstance(doc.get("requests"), list):
            raise BadRecord("missing field 'requests' (a list)" if "requests" not in doc else "'requests' must be a list")
    except BadRecord as exc:
        raise _Bad(str(exc), ()) from None
    if session in first_file:
        raise _Bad(f"conversation id {json.dumps(session)} is also the id of {first_file[session]}", ())
    first_file[session] = path
    namespace = index if scope == "local" else -1
    yield from _requests(doc["requests"], session, ("requests",), namespace, block_size, start_s, rechain, notes)


def _requests(requests: list, session: str, where: tuple, namespace: int, block_size: int, start_s: float,
              rechain: Rechainer, notes: ConvertNotes) -> Iterator[SessionRequest]:
    turn = 0
    last_t = 0.0
    num_subagents = 0
    for k, req in enumerate(requests):
        at = (*where, k)
        if not isinstance(req, dict):
            raise _Bad(f"a request must be a JSON object, got {json.dumps(req)[:40]}", where)
        if req.get("type") == "subagent":
            inner = req.get("requests")
            if not isinstance(inner, list):
                raise _Bad("a sub-agent entry needs 'requests' (a list)", at)
            num_subagents += 1
            notes.subagents += 1
            try:
                sub = session_name(f"{session}/sa{num_subagents}")
            except BadRecord as exc:
                raise _Bad(str(exc), at) from None
            yield from _requests(inner, sub, (*at, "requests"), namespace, block_size, start_s, rechain, notes)
            continue
        try:
            t = need_seconds(req, "t")
            input_len = need_int(req, "in", low=1)
            output_len = need_int(req, "out")
            hash_ids = need_ids(req)
            think_s = need_seconds(req, "think_time", required=False)
            if len(hash_ids) != input_len // block_size:
                raise BadRecord(f"'hash_ids' has {len(hash_ids)} entries, expected {input_len // block_size} "
                                f"(one per full {block_size}-token block of 'in' {input_len})")
            if turn and t < last_t:
                raise BadRecord(f"'t' {t:g} goes backwards (the session's previous request is at {last_t:g})")
            ts = timestamp_ms(start_s + t)
        except BadRecord as exc:
            raise _Bad(str(exc), at) from None
        turn += 1
        last_t = t
        yield SessionRequest(f"{session}#{turn}", session, ts, input_len, output_len,
                             rechain.blocks(namespace, hash_ids, block_size, input_len),
                             None if turn == 1 or think_s is None else round(think_s * 1000, 3))
