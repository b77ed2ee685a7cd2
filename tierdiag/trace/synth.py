"""Seeded synthetic workloads in the Mooncake trace format (plus an "id" per line).

Three generators, each a stream of *sessions* that start as a Poisson process; `mixed`
interleaves all three in time:

- `system-prompt`: a few long system prompts ("apps", Zipf-popular) each reused by many short,
  independent questions ("sys2-q7" is app 2's 7th question). Popular apps stay hot; rare ones
  come back after their prompt has been pushed down a tier or out.
- `multi-turn`: chat sessions ("sess3-turn2"). Turn n's input is turn n-1's input + its output +
  a new user message, so the prefix grows and is reused after a think time. Think times are a
  mixture: quick follow-ups (prefix still on device), coffee breaks (demoted to host, loaded
  back) and long absences (evicted everywhere, recomputed).
- `agent`: tool-using loops ("agent1-step5") over long contexts revisited within seconds, with
  an occasional slow tool call that lets the context sink a tier.

Chat and agent lines carry `"session"` ("sess3", "agent1") and, from the second turn on,
`"think_ms"`: the pause drawn between the previous turn's answer and this request (the user's
think time, the tool's run time; see `_multi_turn_sessions` and `_agent_sessions`). The
timestamps are placed with the same pause: turn n arrives at turn n-1's timestamp + its answer
(`DECODE_MS_PER_TOKEN` a token) + think_ms, so a closed-loop replay as fast as that model and an
open-loop one agree. System-prompt questions are independent requests: no session.

Prefix identity is by `hash_ids` of `block_size`-token blocks, chained as in Mooncake traces: a
block id stands for its content and everything before it. When a context grows, its full
blocks keep their ids; the partial last block gets more tokens, so it becomes a new block:

    turn 1 input  | b0 | b1 | b2 |b3..|                  (b3 partial)
    turn 2 input  | b0 | b1 | b2 | b4 | b5 | b6 |b7.|    (b3's tokens + output + message)

Hash ids are renumbered in order of first appearance, so a trace reads like Mooncake's.
Everything is drawn from `random.Random` seeded per generator: the same config gives the same
bytes.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tierdiag.errors import ConfigError, unknown_name
from tierdiag.trace.reader import MAX_LENGTH_TOKENS, MAX_TIMESTAMP_MS
from tierdiag.trace.writer import write_jsonl

MAX_INPUT_TOKENS = 30_000
# The bundled demo: `tierdiag synth` with its defaults. Shaped for a small device pool
# (64k-128k tokens) with a host pool ~4x that. Under a two-level LRU model (tests/trace) at 96k/384k,
# about half the returning sessions find their own prefix still on device, nearly as many find it
# demoted to host (load-back), and a few find it gone (recompute).
DEMO_TRACE = Path(__file__).with_name("samples") / "demo.jsonl"
# Rough decode speed of a mid-size model on one GPU, used only to place the next turn after the
# previous answer has plausibly finished streaming (a turn sent before that would find no cache).
DECODE_MS_PER_TOKEN = 25.0
_SAMPLE_SESSIONS = 200  # sessions drawn once to learn a kind's mean requests per session


@dataclass(frozen=True, slots=True)
class SynthConfig:
    # The defaults make the bundled demo (samples/demo.jsonl).
    kind: str = "mixed"
    num_requests: int = 700
    seed: int = 7
    rate_per_s: float = 2.0  # long-run mean arrival rate (the first minutes run a little below it)
    block_size: int = 512

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise unknown_name("workload kind", self.kind, KINDS)
        if self.num_requests < 1:
            raise ConfigError(f"--requests must be at least 1, got {self.num_requests}")
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ConfigError(f"--rate must be a positive number of requests per second, got {self.rate_per_s}")
        if self.block_size < 16:
            # Smaller blocks would need thousands of hash ids per request for no realism gain.
            raise ConfigError(f"--block-size must be at least 16 tokens, got {self.block_size}")
        # What synth writes, replay must accept (trace/reader.py bounds): a block is at most a
        # request's length, and the trace's span (~requests / rate) stays well inside the
        # latest timestamp replay takes (10x margin for the randomness of arrivals).
        if self.block_size > MAX_LENGTH_TOKENS:
            raise ConfigError(f"--block-size must be at most {MAX_LENGTH_TOKENS:,} tokens, got {self.block_size}")
        span_ms = self.num_requests / self.rate_per_s * 1000
        if not span_ms * 10 <= MAX_TIMESTAMP_MS:
            raise ConfigError(f"--rate {self.rate_per_s:g} is too low for {self.num_requests:,} requests: the trace "
                              f"would span ~{span_ms / 1000:.3g} s, past the latest timestamp replay takes "
                              f"({MAX_TIMESTAMP_MS // 1000:,} s)")


@dataclass(frozen=True, slots=True)
class SynthRequest:
    req_id: str
    timestamp_ms: int
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    session: int  # which session (or lone question) it belongs to, counted; not written to the trace
    session_id: str | None = None  # the trace's "session" (chat and agent turns only)
    think_ms: int | None = None  # the pause after the previous turn's answer; None on a first turn

    def to_json_line(self) -> str:
        line = {"id": self.req_id, "timestamp": self.timestamp_ms, "input_length": self.input_tokens,
                "output_length": self.output_tokens, "hash_ids": list(self.hash_ids)}
        if self.session_id is not None:
            line["session"] = self.session_id
            if self.think_ms is not None:
                line["think_ms"] = self.think_ms
        return json.dumps(line)


@dataclass(frozen=True, slots=True)
class SynthSummary:
    path: str
    kind: str
    seed: int
    num_requests: int
    num_sessions: int
    span_s: float
    mean_input_tokens: float
    max_input_tokens: int
    total_input_tokens: int
    reusable_tokens: int  # full blocks seen earlier in the trace: the unlimited-cache hit

    @property
    def reusable_share(self) -> float:
        return self.reusable_tokens / self.total_input_tokens if self.total_input_tokens else 0.0

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "seed": self.seed, "num_requests": self.num_requests,
                "num_sessions": self.num_sessions, "span_s": round(self.span_s, 3),
                "mean_input_tokens": round(self.mean_input_tokens, 1), "max_input_tokens": self.max_input_tokens,
                "total_input_tokens": self.total_input_tokens, "reusable_tokens": self.reusable_tokens,
                "reusable_share": round(self.reusable_share, 4)}


# --- building blocks -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Context:
    """A token sequence known by its block ids (last one partial unless length % block == 0)."""

    hash_ids: tuple[int, ...]
    length: int


class _Blocks:
    """Hands out fresh block ids; shared by every generator of one trace."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._next = 0

    def new(self, length: int) -> _Context:
        return self.extend(_Context((), 0), length)

    def extend(self, ctx: _Context, add_tokens: int) -> _Context:
        # Full blocks keep their identity; the partial block's content changes, so it and every
        # block after it are new.
        length = ctx.length + add_tokens
        keep = ctx.hash_ids[: ctx.length // self.block_size]
        num_new = -(-length // self.block_size) - len(keep)
        ids = keep + tuple(range(self._next, self._next + num_new))
        self._next += num_new
        return _Context(ids, length)


@dataclass(frozen=True, slots=True)
class _Step:
    offset_ms: float  # from the session's start
    input: _Context
    output_tokens: int
    think_ms: float | None = None  # the pause after the previous step's answer (None: first step)


@dataclass(frozen=True, slots=True)
class _Session:
    group: str  # "sess3", "agent1", "sys2": the id prefix
    word: str  # "turn", "step", "q": the id's counter word
    steps: tuple[_Step, ...]
    is_session: bool = True  # False: independent requests (system-prompt questions), no "session"


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _decode_ms(output_tokens: int) -> float:
    return output_tokens * DECODE_MS_PER_TOKEN


# --- generators ------------------------------------------------------------------------------
# Each takes its own rng and the shared block allocator and returns a session factory. State
# that outlives one session (system prompts, app popularity, counters) lives in the closure.

SessionFactory = Callable[[], _Session]


def _system_prompt_sessions(rng: random.Random, blocks: _Blocks) -> SessionFactory:
    num_apps = 6
    prompts = [blocks.new(_log_uniform(rng, 1_500, 12_000)) for _ in range(num_apps)]
    # Zipf-like popularity: app 0 is asked constantly, app 5 rarely, so the same prompt is seen
    # after a few seconds or after minutes.
    weights = [1.0 / (i + 1) ** 1.2 for i in range(num_apps)]

    def make() -> _Session:
        app = rng.choices(range(num_apps), weights)[0]
        question = blocks.extend(prompts[app], _log_uniform(rng, 40, 1_500))
        return _Session(f"sys{app}", "q", (_Step(0.0, question, _log_uniform(rng, 20, 400)),), is_session=False)

    return make


def _multi_turn_sessions(rng: random.Random, blocks: _Blocks) -> SessionFactory:
    chat_prompts = [blocks.new(_log_uniform(rng, 700, 2_000)) for _ in range(2)]
    counter = iter(range(1 << 62))

    # The user's think time: a three-part mixture (45 % 2-20 s, 40 % 40-150 s, 15 % 2.5-6.7 min),
    # each part aimed at one tier under the demo's pools (see DEMO_TRACE): a quick follow-up finds
    # its prefix on device, a break finds it demoted to host, a long absence finds it gone. A
    # lognormal would spread the same range without aiming at the tiers, and every timestamp of
    # the bundled demo and of existing synth outputs is placed with these draws: they stay.
    def think_ms() -> float:
        u = rng.random()
        if u < 0.45:  # quick follow-up: the prefix is usually still on device
            return rng.uniform(2_000, 20_000)
        if u < 0.85:  # a break: other traffic has pushed the prefix down to host
            return rng.uniform(40_000, 150_000)
        return rng.uniform(150_000, 400_000)  # gone long enough to be evicted from host too

    def make() -> _Session:
        ctx = blocks.extend(rng.choice(chat_prompts), _log_uniform(rng, 400, 6_000))
        steps = []
        t = 0.0
        pause = None
        for _ in range(rng.randint(2, 10)):
            out = _log_uniform(rng, 60, 700)
            steps.append(_Step(t, ctx, out, pause))
            pause = think_ms()
            t += _decode_ms(out) + pause
            nxt = ctx.length + out + _log_uniform(rng, 30, 2_500)
            if nxt > MAX_INPUT_TOKENS:
                break
            ctx = blocks.extend(ctx, nxt - ctx.length)
        return _Session(f"sess{next(counter)}", "turn", tuple(steps))

    return make


def _agent_sessions(rng: random.Random, blocks: _Blocks) -> SessionFactory:
    tool_prompts = [blocks.new(_log_uniform(rng, 3_000, 7_000)) for _ in range(2)]
    counter = iter(range(1 << 62))

    # The tool's run time: a two-part mixture, 85 % quick calls (0.3-4 s: a file read, a grep; the
    # context stays on device) and 15 % slow ones (30-150 s: a build, a crawl; it sinks a tier).
    # Tool times are bimodal rather than one smooth tail: a call either returns at once or waits
    # on real work. Kept as drawn for the same reason as the chat think time.
    def tool_ms() -> float:
        if rng.random() < 0.85:
            return rng.uniform(300, 4_000)
        return rng.uniform(30_000, 150_000)  # a slow tool (a build, a crawl): the context sinks a tier

    def make() -> _Session:
        ctx = blocks.extend(rng.choice(tool_prompts), _log_uniform(rng, 400, 3_000))
        steps = []
        t = 0.0
        pause = None
        for _ in range(rng.randint(4, 24)):
            out = _log_uniform(rng, 30, 350)
            steps.append(_Step(t, ctx, out, pause))
            pause = tool_ms()
            t += _decode_ms(out) + pause
            nxt = ctx.length + out + _log_uniform(rng, 150, 5_000)
            if nxt > MAX_INPUT_TOKENS:
                break
            ctx = blocks.extend(ctx, nxt - ctx.length)
        return _Session(f"agent{next(counter)}", "step", tuple(steps))

    return make


@dataclass(frozen=True, slots=True)
class _Kind:
    make: Callable[[random.Random, _Blocks], SessionFactory]
    mixed_share: float  # share of requests in `mixed`


_GENERATORS: dict[str, _Kind] = {
    "system-prompt": _Kind(_system_prompt_sessions, 0.30),
    "multi-turn": _Kind(_multi_turn_sessions, 0.45),
    "agent": _Kind(_agent_sessions, 0.25),
}
KINDS: tuple[str, ...] = ("mixed", *_GENERATORS)


# --- putting a trace together ----------------------------------------------------------------

@dataclass(order=True)
class _Source:
    """One generator's session stream, ordered by its next session's start time."""

    next_start_ms: float
    order: int
    rng: random.Random = field(compare=False)
    make: SessionFactory = field(compare=False)
    mean_gap_ms: float = field(compare=False)


def _mean_requests_per_session(kind: _Kind, seed: int, order: int, block_size: int) -> float:
    # A throwaway draw (own rng, own block ids) so the real trace does not depend on it.
    make = kind.make(random.Random(f"sample/{seed}/{order}"), _Blocks(block_size))
    return statistics.fmean(len(make().steps) for _ in range(_SAMPLE_SESSIONS))


def generate(cfg: SynthConfig) -> list[SynthRequest]:
    """The first `cfg.num_requests` requests, in time order, of the configured workload."""
    names = list(_GENERATORS) if cfg.kind == "mixed" else [cfg.kind]
    total_share = sum(_GENERATORS[n].mixed_share for n in names)
    blocks = _Blocks(cfg.block_size)
    sources = []
    for order, name in enumerate(names):
        kind = _GENERATORS[name]
        rng = random.Random(f"{name}/{cfg.seed}")
        rate_per_ms = cfg.rate_per_s / 1000 * kind.mixed_share / total_share
        mean_gap_ms = _mean_requests_per_session(kind, cfg.seed, order, cfg.block_size) / rate_per_ms
        first = rng.expovariate(1.0 / mean_gap_ms)
        sources.append(_Source(first, order, rng, kind.make(rng, blocks), mean_gap_ms))
    heapq.heapify(sources)

    # Pull sessions in start order. Every later session starts at or after the earliest next
    # start, so once N requests lie strictly before it, the first N in time order are final.
    timed: list[tuple[float, int, int, int, _Session]] = []  # (t, source, session#, step, session)
    pending: list[float] = []  # request times not yet known to precede every later session
    num_settled = 0
    num_sessions = 0
    while num_settled < cfg.num_requests:
        src = sources[0]
        session = src.make()
        for i, step in enumerate(session.steps):
            t_ms = src.next_start_ms + step.offset_ms
            timed.append((t_ms, src.order, num_sessions, i, session))
            heapq.heappush(pending, t_ms)
        num_sessions += 1
        src.next_start_ms += src.rng.expovariate(1.0 / src.mean_gap_ms)
        heapq.heapreplace(sources, src)
        while pending and pending[0] < sources[0].next_start_ms:
            heapq.heappop(pending)
            num_settled += 1
    timed.sort(key=lambda x: x[:4])
    del timed[cfg.num_requests:]
    return _finish(timed)


def _finish(timed: list[tuple[float, int, int, int, _Session]]) -> list[SynthRequest]:
    """Name requests in time order and renumber block ids by first appearance. Empties `timed`
    as it goes: a session (its contexts' block ids) is let go once its last request is named,
    not held beside a million named ones (issue 41)."""
    renumber: dict[int, int] = {}
    counts: dict[str, int] = {}
    out = []
    for i in range(len(timed)):
        t_ms, _src, session_num, step_index, session = timed[i]
        timed[i] = None  # type: ignore[call-overload]
        if not t_ms <= MAX_TIMESTAMP_MS:  # the bound above makes this all but impossible
            raise ConfigError(f"a request would arrive at {t_ms:.3g} ms, past the latest timestamp replay takes "
                              f"({MAX_TIMESTAMP_MS:,} ms); raise --rate or lower --requests")
        step = session.steps[step_index]
        n = counts[session.group] = counts.get(session.group, 0) + 1
        ids = tuple(renumber.setdefault(h, len(renumber)) for h in step.input.hash_ids)
        session_id = session.group if session.is_session else None
        think_ms = None if step.think_ms is None or session_id is None else round(step.think_ms)
        out.append(SynthRequest(f"{session.group}-{session.word}{n}", int(t_ms), step.input.length,
                                step.output_tokens, ids, session_num, session_id, think_ms))
    return out


def summarize(requests: list[SynthRequest], *, path: str, cfg: SynthConfig) -> SynthSummary:
    block = cfg.block_size
    seen: set[int] = set()
    reusable = 0
    for r in requests:
        # Only full blocks can be reused (as with page matching, the partial tail is computed).
        full = r.hash_ids[: r.input_tokens // block]
        reusable += block * sum(1 for h in full if h in seen)
        seen.update(full)
    inputs = [r.input_tokens for r in requests]
    return SynthSummary(path=path, kind=cfg.kind, seed=cfg.seed, num_requests=len(requests),
                        num_sessions=len({r.session for r in requests}),
                        span_s=(requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000,
                        mean_input_tokens=statistics.fmean(inputs), max_input_tokens=max(inputs),
                        total_input_tokens=sum(inputs), reusable_tokens=reusable)


def write_trace(path: str | os.PathLike, requests: list[SynthRequest]) -> None:
    """Write JSONL (gzip if the name ends in .gz) atomically: a failed write leaves no half file."""
    write_jsonl(path, (r.to_json_line() for r in requests), chunked=True)  # made already: cannot fail midway


def synth_to_file(path: str | os.PathLike, cfg: SynthConfig) -> SynthSummary:
    requests = generate(cfg)
    write_trace(path, requests)
    return summarize(requests, path=str(path), cfg=cfg)
