"""The run shares an advice rule's change must lower, each measured on the baseline and on the
change's replay (verify.py) and shown beside the TTFT that judges it (types.classify).

A `Target` is a name, its words and its SQL over a run's finished requests. Each rule names
its target (base.Rule.target); `advise` measures every target a registered rule names, so a rule
with a new share defines its Target in its own file and nothing else changes."""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.diagnose.request.causes import excess_sql, routing_tokens_sql

# Every Target made, by name: what `Verified.numbers` calls a target in words.
_BY_NAME: dict[str, "Target"] = {}


@dataclass(frozen=True)
class Target:
    name: str  # as Verified.target and --json's verified.target say it
    words: str  # "recompute share of input"
    sql: str  # a share over the finished requests of one run (an aggregate expression)

    def __post_init__(self) -> None:
        known = _BY_NAME.setdefault(self.name, self)
        if known != self:
            raise ValueError(f"advice target {self.name!r} is defined twice, differently")


def words(name: str) -> str:
    """A target's words; an unknown name (a store from a later tierdiag) is shown as it is."""
    t = _BY_NAME.get(name)
    return t.words if t is not None else name


RECOMPUTE_SHARE = Target("recompute_share", "recompute share of input",
                         "sum(recomputed_tokens) / nullif(sum(input_tokens), 0)")
LOADBACK_EXPOSED_SHARE = Target("loadback_exposed_share", "exposed load-back share of TTFT",
                                "sum(loadback_exposed_ns) / nullif(sum(ttft_ns), 0)")
QUEUE_SHARE = Target("queue_share", "queueing share of TTFT", "sum(queue_ns) / nullif(sum(ttft_ns), 0)")
SESSION_RECOMPUTE_SHARE = Target(
    "session_recompute_share", "recompute share of later session turns' input",
    "sum(recomputed_tokens) FILTER (WHERE think_ms IS NOT NULL) "
    "/ nullif(sum(input_tokens) FILTER (WHERE think_ms IS NOT NULL), 0)")
ROUTING_SHARE = Target("routing_share", "routing-lost share of input",
                       f"sum({routing_tokens_sql()}) / nullif(sum(input_tokens), 0)")
QUEUE_EXCESS_SHARE = Target("queue_excess_share", "queueing share of excess TTFT",
                            f"sum(queue_ns) / nullif(sum(greatest({excess_sql()}, 0)), 0)")
