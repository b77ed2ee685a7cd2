"""`compare`: runs side by side, and one request in two runs.

Run metrics come from `summary`'s numbers (facts.py: the numbers `summary` prints, with its one quantile
definition); the only new aggregate is the GPU's prefill busy share, from the `batches` table.
Per-request verdicts come from `cause_sql` (the rule `explain` and `slow` use), never re-derived.

    compare_runs(con, runs)            -> Comparison: one RunRow per run, the options that differ
    compare_requests(con, a, b, top)   -> RequestComparison: same req_id in both, largest TTFT
                                          gains and losses, verdicts that changed (from -> to)
    compare_twins(con, obs, twins)     -> an observed run against one twin (TwinAgreement) or
                                          several (TwinComparison): each twin's agreement, its
                                          TTFT error per hit class, and the clock it ran on

Requests are paired by req_id, which only means "the same request" when both runs replayed the
same trace. A pair whose input lengths differ is two unrelated requests that share an id (two
traces numbered the same way): when most pairs differ so, the runs are of different traces and
the comparison is refused (ConfigError, exit 2); when only some do, it goes on, says so in one
warning line on stderr and counts them in `num_input_mismatch` (docs/contract.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import duckdb

from tierdiag.diagnose.read.query import dataclass_json, jsonify
from tierdiag.diagnose.read.compare import RequestPair, RequestPairs, busy_time
from tierdiag.diagnose.run.facts import RunFacts
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.run.numbers import ClassStats, RunSummary
from tierdiag.diagnose.twin.observed_twin import Agreement, agreement
from tierdiag.diagnose.dp.ranks import deployment, rank_summary
from tierdiag.diagnose.twin.twin_error import TwinError, twin_clock, twin_error
from tierdiag.units import share
from tierdiag.errors import ConfigError, StoreError, TierdiagError
from tierdiag.store.reader import RunInfo, list_runs, no_runs_error
from tierdiag.diagnose.read.run import parse
from tierdiag.diagnose.run.kv_memory import kv_memory
TIERS = ("device", "host", "storage")
CLASSES = ("device_hit", "tiered_hit", "miss")
DEFAULT_TOP = 10


# --- which options differ ---------------------------------------------------------------------

# Recorded per run, not an option: the run's own storage folder (tierdiag.store.storage_dir),
# and the running-requests cap as given (max_running_requests, the cap used, shows the difference).
PER_RUN_KEYS = frozenset({"storage_dir", "max_running_requests_given"})


def varied_options(configs: Sequence[dict]) -> tuple[str, ...]:
    """Config keys whose recorded value is not the same in every run (in config order)."""
    keys: dict[str, None] = {}
    for c in configs:
        keys.update(dict.fromkeys(k for k in c if k not in PER_RUN_KEYS))
    missing = object()
    return tuple(k for k in keys if len({repr(c.get(k, missing)) for c in configs}) > 1)


def changed_from_defaults(config: dict) -> dict[str, Any]:
    """The recorded options that differ from what `replay` would use with none given.

    Pool sizes default from the presets (device: the GPU's memory left after the weights;
    host: 2x device), so those defaults are the ones for the run's own model and GPU, and the
    host default follows the run's device size; so does the derived running-requests cap (from
    the run's device pool and context)."""
    from tierdiag.config.engine import EngineConfig  # presets and validation only, no torch

    if not config:
        return {}
    geometry = {k: config[k] for k in ("model", "gpu", "page_size", "mem_fraction_static") if k in config}
    try:
        reference = EngineConfig(**geometry).to_json()
        sized = EngineConfig(**geometry, device_tokens=config.get("device_tokens"),
                             max_context_tokens=config.get("max_context_tokens")).to_json()
        reference["host_tokens"] = sized["host_tokens"]
        reference["max_running_requests"] = sized["max_running_requests"]
    except (TierdiagError, TypeError):  # recorded by another version, with presets or keys this one lacks
        reference = EngineConfig().to_json()
    # The geometry itself against the plain defaults (llama3-8b on an h200, ...).
    reference.update({k: f.default for k, f in EngineConfig.__dataclass_fields__.items() if k in geometry})
    return {k: v for k, v in config.items() if k in reference and reference[k] != v and k not in PER_RUN_KEYS}


def memory_bytes(config: dict) -> int | None:
    """Every rank's device + host KV capacity plus the shared storage tier, in modelled bytes
    (the run's model geometry): KvMemory.total_bytes."""
    m = kv_memory(config)
    return None if m is None else m.total_bytes


# --- one row per run ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RunRow:
    run_id: str
    name: str
    status: str
    kind: str
    sweep_id: str | None
    changes: dict  # the options that differ between the compared runs, this run's values
    num_finished: int
    input_tokens: int
    reuse_share: float | None  # device + host + storage, token-weighted
    device_share: float | None
    host_share: float | None
    storage_share: float | None
    recompute_share: float | None  # computed tokens that had been cached once, of all input
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None
    ttft_by_class: tuple[ClassStats, ...]  # device_hit, tiered_hit, miss (those present)
    loadback_bytes: int
    loadback_exposed_ns: int
    num_evictions: int
    evicted_tokens: int
    gpu_busy_share: float | None  # share of the run's virtual time the GPU spent in prefill
    memory_bytes: int | None  # KV capacity in all: every rank's device + host, plus the shared storage
    memory_rank_bytes: int | None = None  # one rank's device + host pools (each rank has its own)
    num_ranks: int = 1  # the run's data-parallel ranks (config dp)
    ranks: Any = None  # ranks.RankSummary of a data-parallel run (None: one rank; no JSON key then)

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d.pop("ranks")
        if self.ranks is not None:
            d["ranks"] = self.ranks.to_json()
        return d


def gpu_busy_share(con: duckdb.DuckDBPyConnection, run_id: str, ranks: int = 1) -> float | None:
    """Prefill batch time over the virtual time to the last finish (as `replay` reports it): each
    GPU's on average when the run has `ranks` data-parallel ranks (their batches overlap)."""
    busy = busy_time(con, run_id)
    return share(busy.busy_ns, None if busy.end_ns is None else busy.end_ns * max(ranks, 1))


def _row(con: duckdb.DuckDBPyConnection, run: RunInfo, s: RunSummary, varied: Sequence[str]) -> RunRow:
    shares = s.tokens.shares()
    all_ = next((c for c in s.classes if c.hit_class == "all"), None)
    memory = kv_memory(run.config)
    return RunRow(
        run_id=run.run_id, name=run.name, status=run.status, kind=run.kind, sweep_id=run.sweep_id,
        changes={k: run.config.get(k) for k in varied}, num_finished=s.num_finished,
        input_tokens=s.tokens.input_tokens, reuse_share=s.reused_token_share,
        device_share=shares["device"], host_share=shares["host"], storage_share=shares["storage"],
        recompute_share=shares["recomputed"],
        ttft_p50_ns=all_.ttft_p50_ns if all_ else None, ttft_p90_ns=all_.ttft_p90_ns if all_ else None,
        ttft_p99_ns=all_.ttft_p99_ns if all_ else None,
        ttft_by_class=tuple(c for c in s.classes if c.hit_class != "all"),
        loadback_bytes=s.load_back.bytes, loadback_exposed_ns=s.load_back.exposed_ns,
        num_evictions=sum(e.num_events for e in s.evictions), evicted_tokens=sum(e.tokens for e in s.evictions),
        gpu_busy_share=gpu_busy_share(con, run.run_id, parse(run).ranks), memory_bytes=memory_bytes(run.config),
        memory_rank_bytes=None if memory is None else memory.rank_bytes,
        num_ranks=memory.ranks if memory is not None else parse(run).ranks,
        ranks=rank_summary(con, run))


# --by NAME -> (key, ascending). Lower first for costs and times, higher first for reuse.
SORT_KEYS: dict[str, tuple[Callable[[RunRow], Any], bool]] = {
    "name": (lambda r: r.name, True),
    "ttft_p50": (lambda r: r.ttft_p50_ns, True),
    "ttft_p90": (lambda r: r.ttft_p90_ns, True),
    "ttft_p99": (lambda r: r.ttft_p99_ns, True),
    "reuse": (lambda r: r.reuse_share, False),
    "recompute": (lambda r: r.recompute_share, True),
    "loadback_bytes": (lambda r: r.loadback_bytes, True),
    "loadback_exposed": (lambda r: r.loadback_exposed_ns, True),
    "evictions": (lambda r: r.num_evictions, True),
    "gpu_busy": (lambda r: r.gpu_busy_share, True),
    "memory": (lambda r: r.memory_bytes, True),
}


def check_sort_key(by: str | None) -> str | None:
    if by is None or by in SORT_KEYS:
        return by
    from tierdiag.errors import unknown_name

    raise unknown_name("--by metric", by, SORT_KEYS)


@dataclass(frozen=True)
class Comparison:
    rows: tuple[RunRow, ...]
    varied: tuple[str, ...]  # option keys that differ between the runs
    by: str | None  # the sort key, None: the order the runs were given (sweeps: creation)
    sweep_id: str | None  # when the runs are one sweep

    def to_json(self) -> dict:
        return {"sweep_id": self.sweep_id, "by": self.by, "varied": list(self.varied),
                "runs": jsonify(list(self.rows))}


def compare_runs(con: duckdb.DuckDBPyConnection, runs: Sequence[RunInfo], *, by: str | None = None,
                 sweep_id: str | None = None) -> Comparison:
    check_sort_key(by)
    varied = varied_options([r.config for r in runs])
    # summary's numbers (a row shows no diagnosis): stored with the run, else computed
    rows = [_row(con, r, RunFacts(con, r).summary_numbers(), varied) for r in runs]
    if by is not None:
        key, ascending = SORT_KEYS[by]
        present = [r for r in rows if key(r) is not None]
        rows = sorted(present, key=key, reverse=not ascending) + [r for r in rows if key(r) is None]
    return Comparison(rows=tuple(rows), varied=varied, by=by, sweep_id=sweep_id)


def sweep_runs(con: duckdb.DuckDBPyConnection, sweep: str, *, db_label: str = "the database") -> tuple[str, list[RunInfo]]:
    """The runs of a sweep (id or unique id prefix), oldest first."""
    runs = list_runs(con)
    if not runs:
        raise no_runs_error(db_label)
    ids = sorted({r.sweep_id for r in runs if r.sweep_id})
    match = [s for s in ids if s == sweep] or [s for s in ids if s.startswith(sweep)]
    if len(match) != 1:
        known = ", ".join(ids[-5:]) if ids else "none"
        what = "matches several sweeps" if len(match) > 1 else "is not a sweep"
        raise StoreError(f"{sweep!r} {what} in {db_label}; sweeps: {known}")
    return match[0], [r for r in runs if r.sweep_id == match[0]]


# --- one request in two runs -------------------------------------------------------------------

@dataclass(frozen=True)
class RequestDelta:
    req_id: str
    hit_class_a: str | None
    hit_class_b: str | None
    ttft_a_ns: int | None
    ttft_b_ns: int | None
    delta_ns: int | None  # b - a: negative is a gain (faster in b)
    cause_a: str | None  # primary cause (None: rejected)
    cause_b: str | None
    # The data-parallel rank that served it in each run, where either run has more than one
    # (None in both otherwise, and then no JSON key: a one-rank comparison reads as before).
    rank_a: int | None = None
    rank_b: int | None = None

    def to_json(self) -> dict:
        d = dataclass_json(self)
        if self.rank_a is None and self.rank_b is None:
            del d["rank_a"], d["rank_b"]
        return d


@dataclass(frozen=True)
class VerdictChange:
    from_cause: str  # 'rejected' where the request has no verdict
    to_cause: str
    num_requests: int


@dataclass(frozen=True)
class RequestComparison:
    run_a: str
    name_a: str
    run_b: str
    name_b: str
    num_common: int  # req_ids in both runs
    num_only_a: int
    num_only_b: int
    num_faster: int  # finished in both, lower TTFT in b
    num_slower: int
    num_changed: int  # verdict (primary cause) differs
    gains: tuple[RequestDelta, ...]  # largest TTFT decreases first
    losses: tuple[RequestDelta, ...]  # largest increases first
    changed: tuple[RequestDelta, ...]  # changed verdicts, largest |delta| first
    transitions: tuple[VerdictChange, ...]  # from -> to counts, most frequent first
    top: int
    num_input_mismatch: int = 0  # pairs whose input lengths differ: not the same request (a warning)

    def to_json(self) -> dict:
        return dataclass_json(self)


def _delta(r: RequestPair) -> RequestDelta:
    return RequestDelta(req_id=r.req_id, hit_class_a=r.class_a, hit_class_b=r.class_b,
                        ttft_a_ns=r.ttft_a, ttft_b_ns=r.ttft_b, delta_ns=r.delta,
                        cause_a=r.cause_a, cause_b=r.cause_b, rank_a=r.rank_a, rank_b=r.rank_b)


def compare_requests(con: duckdb.DuckDBPyConnection, a: RunInfo, b: RunInfo, *, top: int = DEFAULT_TOP) -> RequestComparison:
    if top < 1:
        raise ConfigError(f"--top {top} must be at least 1")
    # A run of more than one rank shows which rank served each request (deployment: its config's dp).
    pairs = RequestPairs(con, a.run_id, b.run_id, ranks_a=deployment(a) is not None,
                         ranks_b=deployment(b) is not None)
    counts = pairs.counts()
    common, mismatch = counts.common, counts.mismatch
    if mismatch and 2 * (common - mismatch) <= common:
        raise ConfigError(
            f"runs {a.run_id} ({a.name}) and {b.run_id} ({b.name}) are not of the same trace: {mismatch:,} of "
            f"{common:,} requests paired by id have different input lengths",
            hint="compare --requests pairs one trace's requests across runs; replay the same trace")
    if mismatch:
        sys.stderr.write(f"tierdiag: warning: {mismatch:,} of {common:,} requests paired by id have different "
                         f"input lengths in runs {a.run_id} and {b.run_id}: those pairs are unrelated requests\n")
    found = pairs.lists(top)
    return RequestComparison(
        run_a=a.run_id, name_a=a.name, run_b=b.run_id, name_b=b.name, num_common=common,
        num_only_a=counts.n_a - common, num_only_b=counts.n_b - common,
        num_faster=counts.faster, num_slower=counts.slower,
        num_changed=counts.changed, gains=tuple(map(_delta, found.gains)),
        losses=tuple(map(_delta, found.losses)), changed=tuple(map(_delta, found.changed)),
        transitions=tuple(VerdictChange(f.cause_a, f.cause_b, f.requests) for f in found.flows), top=top,
        num_input_mismatch=mismatch)


# --- an observed run against its twins ----------------------------------------------------------

@dataclass(frozen=True)
class TwinAgreement:
    """One twin of an observed run: the request-by-request agreement (observed_twin.py), the TTFT
    error per server hit class (twin_error.py) and the clock the twin ran on."""

    agreement: Agreement
    twin_error: TwinError
    clock: str  # one line: the presets' clock, or calibrated on which observed run
    profile_source: dict | None  # the twin's recorded profile (None: the presets')

    def to_json(self) -> dict:
        # The agreement's keys as they were before twins had clocks, and beside them these.
        return {**self.agreement.to_json(), "clock": self.clock, "profile_source": self.profile_source,
                "twin_error": self.twin_error.to_json()}


@dataclass(frozen=True)
class TwinComparison:
    """`compare OBSERVED TWIN TWIN2 ...`: each twin's error against the same observed run."""

    observed_run_id: str
    observed_run_name: str
    twins: tuple[TwinAgreement, ...]  # in the order given

    def to_json(self) -> dict:
        return {"observed_run_id": self.observed_run_id, "observed_run_name": self.observed_run_name,
                "twins": [t.to_json() for t in self.twins]}


def observed_and_twins(runs: Sequence[RunInfo]) -> tuple[RunInfo, list[RunInfo]] | None:
    """(observed, replays in the order given) when exactly one of two or more runs is observed."""
    observed = [r for r in runs if not view_of(r).engine_parts]
    if len(runs) < 2 or len(observed) != 1:
        return None
    return observed[0], [r for r in runs if r is not observed[0]]


def twin_agreement(con: duckdb.DuckDBPyConnection, observed: RunInfo, twin: RunInfo, *,
                   top: int | None = None) -> TwinAgreement:
    source = twin.config.get("profile_source")
    return TwinAgreement(agreement=agreement(con, observed, twin, top=top),
                         twin_error=twin_error(con, observed.run_id, twin.run_id), clock=twin_clock(twin.config),
                         profile_source=dict(source) if source else None)


def compare_twins(con: duckdb.DuckDBPyConnection, observed: RunInfo, twins: Sequence[RunInfo], *,
                  top: int | None = None) -> TwinAgreement | TwinComparison:
    """One twin: its agreement (`compare OBSERVED TWIN`, as before, with its error and clock);
    several: each one's, so a calibrated twin's error shows beside the preset twin's."""
    rows = tuple(twin_agreement(con, observed, t, top=top) for t in twins)
    if len(rows) == 1:
        return rows[0]
    return TwinComparison(observed.run_id, observed.name, rows)
