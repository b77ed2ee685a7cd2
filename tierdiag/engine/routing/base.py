"""What a router sees and what it answers: the typed boundary between the deployment and a policy.

A router in front of data-parallel ranks (SGLang's model gateway, Dynamo's KV router) never reads
a rank's radix tree. It knows the request it is routing, the load it tracks itself (requests it
sent and has not seen finish: the gateway's `Worker::load()`, raised when a request is sent and
lowered when its response ends), optionally the token loads a load monitor polls, and whatever
state the policy keeps (a counter, a seeded generator, an approximate tree). `RequestView` and
`RanksView` carry exactly that, so a policy cannot peek at the ranks' true caches by accident.

Page keys instead of text. The gateway's cache-aware policy matches raw request text character
by character (policies/tree.rs, `Tree::prefix_match`) or, in its gRPC path, token ids grouped
in pages of 16 (the token tree's `PAGE_SIZE`). Here a request is its prefix-chained page keys
(trace/pages.py): key k names the whole prefix up to and including its page. Matching keys is
matching the prompt at page granularity, like the gateway's token tree:
  - a match counts whole pages only; a trailing partial page never matches (the ranks, like
    SGLang's radix cache, never reuse one either);
  - the match rate is matched pages × page_tokens / input_tokens: the share of the prompt the
    router believes cached, where the gateway's text tree uses characters (a tokenizer-dependent
    ~4 characters a token: the rates agree up to that ratio and the page rounding);
  - text that differs only inside a page is a miss for the whole page here, and two texts that
    tokenize alike but differ in characters would differ for the text tree but not here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar, NamedTuple, Sequence

from tierdiag.config.router import RouterConfig


# The three are NamedTuples (immutable, no __dict__): a deployment builds one of each a request,
# and a frozen dataclass's __init__ sets each field through object.__setattr__ (~20,000
# instructions the three, a --dp 8 arrival, callgrind; ~2.5x a NamedTuple's, issue 41 session 24).


class RequestView(NamedTuple):
    """One request as the router sees it on arrival."""

    req_id: str
    page_keys: Sequence[int]  # one key per full input page, prefix-chained (trace/pages.page_keys)
    input_tokens: int
    page_tokens: int  # tokens a page (the engine's page size)
    session: str | None = None  # the trace's session id, when it has one


class RanksView(NamedTuple):
    """The ranks as the router knows them at one instant; index = rank."""

    in_flight: tuple[int, ...]  # requests routed to each rank and not yet finished
    # Tokens waiting on each rank, as a load monitor polls them (the gateway's `update_loads`);
    # None when nothing polls: policies then compare request counts, as the gateway does.
    pending_tokens: tuple[int, ...] | None = None

    @property
    def num_ranks(self) -> int:
        return len(self.in_flight)


class RouteDecision(NamedTuple):
    """Where a request goes and why: what `explain`'s routing step prints."""

    rank: int
    router: str
    branch: str  # which rule decided: "cache_hit", "cache_miss", "imbalanced", "ring", ...
    reason: str  # one line, e.g. "cache_aware: match 0.62 > 0.30 on rank 2"
    score: float | None  # the deciding number (a match rate, a load), None where there is none
    score_name: str  # what `scores` measure ("approx match", "in flight")
    scores: tuple[float, ...]  # that number for every rank, index = rank


class Router(ABC):
    """A routing policy. Subclasses register in routing/registry.py under `name`."""

    name: ClassVar[str]
    follows: ClassVar[str]  # the gateway function (or other source) the policy follows

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        self.num_ranks = num_ranks
        self.config = config

    @abstractmethod
    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        """Choose a rank for `request`. May update the policy's own state (never the ranks')."""

    # `on_finish(rank, request, now_ns)`: the request routed to `rank` finished (or was refused
    # there). A policy that keeps per-request state defines it as a method and updates that state
    # there; load itself is the gateway's (gateway.Gateway). None, the default (no policy here
    # keeps any): the gateway calls nothing (a no-op method's call, its arguments boxed, was ~1,100
    # instructions a request at --dp 8; issue 41, session 36). Set on a class or an instance, it
    # is called: the gateway reads it at every finish.
    on_finish: Callable[[int, RequestView, int], None] | None = None


def loads_of(ranks: RanksView) -> tuple[int, ...]:
    """The load a policy compares: polled token loads when the monitor has them for every rank,
    else request counts (PowerOfTwoPolicy::select_worker falls back to request counts for both
    candidates when either lacks a token load)."""
    return ranks.pending_tokens if ranks.pending_tokens is not None else ranks.in_flight


def least_loaded(loads: Sequence[int], candidates: Sequence[int] | None = None) -> int:
    """The first rank with the smallest load (Rust's `min_by_key` keeps the first minimum)."""
    ranks = range(len(loads)) if candidates is None else candidates
    return min(ranks, key=loads.__getitem__)


def stable_hash(data: bytes) -> int:
    """A 64-bit hash that is the same in every process and run (Python's hash() is salted)."""
    import hashlib  # here: a replay without a hashing router never loads OpenSSL (~2 ms of its start)

    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def key_bytes(key: int) -> bytes:
    return int(key).to_bytes(8, "little", signed=True)


def fmt_loads(loads: Sequence[int]) -> str:
    return ", ".join(str(x) for x in loads)
