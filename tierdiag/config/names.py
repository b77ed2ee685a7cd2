"""The names a user types (an option's value) and a run's rows hold, as str-valued enums: a
member is its string (`Tier.DEVICE == "device"`, stored and printed as "device"), so the rows and
the outputs are the strings they always were, and a typo in the code is a NameError instead of a
comparison that is never true.

Only names: the implementations registered under them live above (the engine's policies, the
explain's causes).
"""

from __future__ import annotations

from enum import StrEnum


class WritePolicy(StrEnum):
    """`--write-policy`: when device pages are backed up to host (HiCache's write policy)."""

    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


class PrefetchPolicy(StrEnum):
    """`--prefetch-policy`: how long a request waits for its storage prefetch."""

    BEST_EFFORT = "best_effort"
    WAIT_COMPLETE = "wait_complete"
    TIMEOUT = "timeout"


class Tier(StrEnum):
    """Where KV pages live (the `tier` of pool samples, evictions and skipped hits)."""

    DEVICE = "device"
    HOST = "host"
    STORAGE = "storage"


class TransferKind(StrEnum):
    """A copy between tiers (the `transfers` table's `kind`)."""

    LOAD_BACK = "load_back"  # host -> device, for a request's cached prefix
    WRITE_BACK = "write_back"  # device -> host backup
    PREFETCH = "prefetch"  # storage -> host
    STORAGE_WRITE = "storage_write"  # host -> storage backup


class EvictionAction(StrEnum):
    """What an eviction did to a node's pages (the `evictions` table's `action`)."""

    DEMOTE = "demote"  # device copy dropped, a host copy kept (or made: write_back)
    DROP = "drop"  # device copy dropped, no host copy: gone
    DELETE = "delete"  # host (or storage) copy dropped
    FREE_DUPLICATE = "free_duplicate"  # host copy of a node also on device, reclaimed under pressure


class Cause(StrEnum):
    """The part of a request's excess TTFT that dominates it (`explain`, `slow --cause`); the
    order breaks ties and fixes the order of columns and rows everywhere."""

    NONE = "none"
    QUEUEING = "queueing"
    LOAD_BACK = "load_back"
    STORAGE_FETCH = "storage_fetch"
    ROUTING = "routing"
    RECOMPUTE = "recompute"
    COMPUTE = "compute"


class HitClass(StrEnum):
    """Where a request's prefix was found (`slow --class`)."""

    DEVICE_HIT = "device_hit"
    TIERED_HIT = "tiered_hit"
    MISS = "miss"


class RunKind(StrEnum):
    """What recorded a run (`runs.kind`)."""

    REPLAY = "replay"  # the reference engine: every TTFT part
    OBSERVED = "observed"  # imported from a server's export: what the server reported


def values(enum: type[StrEnum]) -> tuple[str, ...]:
    """The plain strings of an enum's members, in order (for option choices and schemas)."""
    return tuple(m.value for m in enum)
