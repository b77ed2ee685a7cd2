"""Typed, immutable probe events: one per step the troubleshooting order needs.

Field names match the run-store columns (tierdiag/store/schema.py) so the recorder copies
them across without a mapping table. Events are NamedTuples rather than frozen dataclasses:
just as typed and immutable, five times cheaper to build (a replay emits ~15 per request),
and the recorder turns a list of them into columns with one zip. The engine emits through
engine/emitters.py's `Emitters` (one callable a kind of EMITTED, made by `emitter` here): the
recorder takes each stored event's fields as a plain tuple (the event is never built) and is
not handed the kinds no table stores; any other probe gets every event built.
"""

# No `from __future__ import annotations` here: typing.NamedTuple makes a ForwardRef of every
# field's annotation text, and a ForwardRef compiles its text, ~170 compiles (~15 M instructions,
# ~3 % of a replay's start-up, issue 41); evaluated, `int` and `str | None` cost nothing.
from typing import NamedTuple


class RequestArrived(NamedTuple):
    t_ns: int
    req_id: str
    seq: int
    input_tokens: int
    output_tokens: int


class PrefixMatched(NamedTuple):
    t_ns: int
    req_id: str
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    prefix_indices_len: int
    cache_protected_len: int


class LoadBackSkipped(NamedTuple):
    t_ns: int
    req_id: str
    tier: str  # host | storage
    tokens: int
    reason: str  # below_threshold | device_full | prefetch_incomplete | host_full


class Transfer(NamedTuple):
    """A copy between tiers: load_back (host->device), backup (device->host), prefetch
    (storage->host), write_back (device->host at eviction, blocking), storage_write."""
    transfer_id: int
    t_start_ns: int
    t_end_ns: int
    kind: str
    req_id: str | None
    pages: int
    runs: int
    bytes: int
    data_plane_bytes: int
    queued_ns: int
    wall_ns: int
    verified: bool | None
    dp_rank: int = 0  # the data-parallel rank whose pools and link it was (engine/deployment.py)


class Eviction(NamedTuple):
    eviction_id: int
    t_ns: int
    tier: str
    node_id: int
    tokens: int
    action: str  # demote | drop | delete
    cause_req_id: str | None
    owner_req_id: str | None
    pool_used_tokens: int
    pool_capacity_tokens: int
    locked_tokens: int
    node_hit_count: int
    node_last_access_ns: int
    dp_rank: int = 0


class PrefixLostPages(NamedTuple):
    """Request `req_id` came back for pages that eviction `eviction_id` had taken."""
    req_id: str
    eviction_id: int
    tokens: int


class BatchScheduled(NamedTuple):
    batch_id: int
    t_start_ns: int
    t_end_ns: int
    num_reqs: int
    extend_tokens: int
    loadback_bytes: int
    compute_ns: int
    loadback_exposed_ns: int
    num_decoding: int
    recompute_ns: int  # of compute_ns, spent recomputing once-cached tokens
    dp_rank: int = 0


class DecodeStep(NamedTuple):
    """One decode step of the running batch (not stored: for probes that follow the schedule,
    such as the differential harness). `mixed`: it rode in the prefill batch `batch_id`."""
    t_start_ns: int
    t_end_ns: int
    step: int  # the decode clock: steps run so far, this one included
    req_ids: tuple  # the requests decoding in it, in running-batch order
    retracted: tuple  # requests retract_decode sent back to the queue before it
    batch_id: int | None  # the mixed prefill batch it rode in; None: a step on its own
    dp_rank: int = 0


class PrefillDone(NamedTuple):
    t_ns: int
    req_id: str
    batch_id: int
    chunk: int
    extend_tokens: int


class FirstToken(NamedTuple):
    t_ns: int
    req_id: str
    ttft_ns: int


class PoolSample(NamedTuple):
    t_ns: int
    tier: str
    used_tokens: int
    capacity_tokens: int
    locked_tokens: int
    dp_rank: int = 0


class RequestRecord(NamedTuple):
    """Everything about one request, emitted when it finishes (or is rejected)."""
    req_id: str
    seq: int
    arrival_ns: int
    input_tokens: int
    output_tokens: int
    status: str
    reject_reason: str | None
    hit_class: str | None
    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    host_match_tokens: int
    storage_match_tokens: int
    loadback_skipped_reason: str | None
    loadback_skipped_tokens: int
    storage_skipped_reason: str | None
    prefix_indices_len: int
    cache_protected_len: int
    extend_input_len: int
    queue_ns: int | None
    storage_wait_ns: int | None
    loadback_ns: int | None
    loadback_exposed_ns: int | None
    loadback_queued_ns: int | None
    loadback_bytes: int
    loadback_pages: int
    loadback_runs: int
    storage_bytes: int
    storage_fetch_ns: int | None
    recompute_ns: int | None
    compute_ns: int | None
    prefill_ns: int | None
    ttft_ns: int | None
    ideal_ttft_ns: int | None
    ttft_if_device_resident_ns: int | None
    recompute_instead_ns: int | None
    first_batch_id: int | None
    num_chunks: int
    first_token_ns: int | None
    finish_ns: int | None
    session_id: str | None
    think_ms: float | None
    trace_arrival_ns: int | None
    # v4, data-parallel ranks (engine/deployment.py): the rank that served it, and (NULL in a
    # one-rank run: ROUTE_NONE) the routing decision and where its prefix was at arrival.
    dp_rank: int | None = 0
    route_branch: str | None = None
    route_reason: str | None = None
    route_score: float | None = None
    route_score_name: str | None = None
    arrival_device_tokens: int | None = None
    arrival_host_tokens: int | None = None
    best_rank: int | None = None
    best_rank_device_tokens: int | None = None
    best_rank_host_tokens: int | None = None
    ranks_json: str | None = None
    # v6 (issue 43): of queue_ns, the time the GPU ran decode steps; times the request was
    # retracted (retract_decode) and prefilled again.
    decode_wait_ns: int | None = None
    retractions: int | None = 0
    # v5 miss reasons (engine/miss.py, DESIGN §7): a finished request's computed tokens by why they
    # were not reused, summing to computed_tokens (NULL: rejected, or an older run). Set by name.
    miss_never_cached_tokens: int | None = None
    miss_evicted_before_reuse_tokens: int | None = None
    miss_lost_while_queued_tokens: int | None = None
    miss_loadback_skipped_tokens: int | None = None
    miss_prefetch_declined_tokens: int | None = None
    miss_prefetch_revoked_tokens: int | None = None
    miss_shared_in_batch_tokens: int | None = None
    miss_routed_elsewhere_tokens: int | None = None
    miss_beyond_storage_tokens: int | None = None
    # v7: of those, read from storage by its own prefetch, then evicted from host before it was scheduled
    miss_prefetch_lost_tokens: int | None = None


class Route(NamedTuple):
    """A request's routing columns (RequestRecord's ten after dp_rank, same names): the router's
    decision and where the request's prefix was at arrival (engine/deployment.py)."""

    route_branch: str | None
    route_reason: str | None
    route_score: float | None
    route_score_name: str | None
    arrival_device_tokens: int | None  # the serving rank's device prefix at arrival
    arrival_host_tokens: int | None
    best_rank: int | None  # the rank that held the longest prefix at arrival
    best_rank_device_tokens: int | None
    best_rank_host_tokens: int | None
    ranks_json: str | None


# A one-rank run's routing columns: none.
ROUTE_NONE = Route(*(None,) * len(Route._fields))


class RequestFinished(NamedTuple):
    record: RequestRecord


def field_names(cls) -> tuple[str, ...]:
    return cls._fields


# The engine's emitters (engine/emitters.py's `Emitters`, one attribute a kind): attribute name ->
# the event class whose fields the attribute's callable takes, as a tuple in order.
EMITTED = {"arrived": RequestArrived, "matched": PrefixMatched, "skipped": LoadBackSkipped,
           "transfer": Transfer, "eviction": Eviction, "lost": PrefixLostPages, "batch": BatchScheduled,
           "prefill_done": PrefillDone, "first_token": FirstToken, "pool_sample": PoolSample,
           "record": RequestRecord, "decode_step": DecodeStep}


def emitter(probe, cls):
    """The callable the engine hands a `cls` event's fields (a tuple in order) for `probe`, or
    None where nothing is to be emitted (no probe, or a probe that keeps no such events: the
    engine then builds neither the event nor its fields).

    A probe may provide `emitter(cls)` (the recorder's is its buffer's `append`: no Python
    frame an event, and a replay emits ~10^5 of them) and `wants(cls)`; any other probe gets
    each event built and passed to its `emit`, as always."""
    if probe is None:
        return None
    return _emitter(probe, cls)


def _emitter(probe, cls):
    wants = getattr(probe, "wants", None)
    if wants is not None and not wants(cls):
        return None
    make = getattr(probe, "emitter", None)
    if make is not None:
        return make(cls)
    emit = probe.emit
    if cls is RequestRecord:  # a request's record reaches a plain probe as RequestFinished
        return lambda fields: emit(RequestFinished(RequestRecord(*fields)))
    return lambda fields: emit(cls(*fields))


_BY_KEYWORD: dict = {}


def by_keyword(cls, emit):
    """`emit` (a callable taking the tuple of `cls`'s fields in order) as a function taking every
    field by keyword: `by_keyword(RequestRecord, emit)(req_id="7", seq=6, ...)` calls
    `emit(("7", 6, ...))`. A field `cls` gives a default may be left out; one it does not, or a
    name it has not, is a TypeError naming it (Python's own). One generated function a class
    (compiled once), its `emit` bound as a default: one Python frame a row, and no dict or
    NamedTuple built on the way (the recorder stores the tuple as it comes)."""
    make = _BY_KEYWORD.get(cls)
    if make is None:
        fields = cls._fields
        defaults = cls._field_defaults
        if any(not f.isidentifier() or f.startswith("_") for f in fields):
            raise ValueError(f"{cls.__name__}: a field name that is no plain identifier")
        params = ", ".join(f"{f}=_d_{f}" if f in defaults else f for f in fields)
        src = (f"def make(_emit, {', '.join(f'_d_{f}' for f in defaults)}):\n"
               f"    def {cls.__name__.lower()}(*, {params}):\n"
               f"        _emit(({', '.join(fields)},))\n"
               f"    return {cls.__name__.lower()}\n")
        scope: dict = {}
        exec(compile(src, f"<by_keyword {cls.__name__}>", "exec"), scope)  # noqa: S102 - field names checked above
        inner = scope["make"]
        values = tuple(defaults.values())
        make = _BY_KEYWORD[cls] = lambda emit: inner(emit, *values)
    return make(emit)
