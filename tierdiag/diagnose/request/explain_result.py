"""`explain`'s typed result: the four steps' evidence, the TTFT decomposition and the
`Explanation` both the terminal view and `--json` are rendered from (DESIGN.md §3, §5)."""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.config.names import Cause
from tierdiag.diagnose.request.claims import Claim
from tierdiag.diagnose.request.context import QueueAttribution, RequestContext
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.request.tokens import TokenSplit
from tierdiag.units import ns_to_ms, share


@dataclass(frozen=True)
class HostHitEvidence:
    hit_class: str | None
    input_tokens: int
    device_hit_tokens: int
    host_hit_length: int  # host tokens loaded back and used (SGLang's name)
    storage_hit_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    new_tokens: int
    host_match_tokens: int
    storage_match_tokens: int
    loadback_skipped_reason: str | None
    loadback_skipped_tokens: int
    storage_skipped_reason: str | None
    load_back_threshold_tokens: int | None


@dataclass(frozen=True)
class PrefixEvidence:
    prefix_indices_len: int
    device_original_tokens: int
    restored_tokens: int
    restored_share: float | None
    cache_protected_len: int
    extend_input_len: int


@dataclass(frozen=True)
class TransferRow:
    """Times (t_start_ns, t_end_ns) since the run's first arrival, as every view's clock."""

    transfer_id: int
    kind: str
    t_start_ns: int
    t_end_ns: int
    pages: int
    runs: int
    bytes: int
    queued_ns: int | None
    wall_ns: int | None


@dataclass(frozen=True)
class LoadBackEvidence:
    loaded_tokens: int
    loadback_bytes: int
    loadback_pages: int
    loadback_runs: int
    loadback_ns: int
    achieved_bytes_per_s: float | None
    link_peak_bytes_per_s: float | None
    link_peak_share: float | None
    small_transfer: bool
    fragmented: bool
    exposed_ns: int
    overlapped_ns: int
    queued_ns: int
    storage_bytes: int
    storage_fetch_ns: int
    storage_wait_ns: int
    window_ns: int
    window_loadbacks: int
    window_loadback_bytes: int
    window_loadbacks_per_s: float | None
    run_loadbacks_per_s: float | None
    window_loadback_bytes_per_s: float | None
    run_loadback_bytes_per_s: float | None
    ttft_ns: int | None
    ttft_if_device_resident_ns: int | None
    recompute_instead_ns: int | None
    transfers: tuple[TransferRow, ...]


@dataclass(frozen=True)
class EvictionEvent:
    eviction_id: int
    t_ns: int  # since the run's first arrival
    tier: str
    action: str
    node_tokens: int
    prefix_tokens: int  # of this request's prefix
    cause_req_id: str | None
    owner_req_id: str | None
    pool_used_tokens: int | None
    pool_capacity_tokens: int | None
    pool_used_share: float | None
    locked_tokens: int | None


@dataclass(frozen=True)
class EvictionEvidence:
    num_events: int
    device_evicted_tokens: int  # of its prefix, pushed off the device (demoted + dropped)
    demoted_tokens: int
    dropped_tokens: int
    host_deleted_tokens: int
    evicted_by: tuple[str, ...]
    events: tuple[EvictionEvent, ...]
    device_capacity_tokens: int | None
    host_capacity_tokens: int | None
    # Compared with the pools the prefix fell out of: device, plus host when host deleted it.
    compared_capacity_tokens: int | None
    reuse_distance_tokens: int | None
    reuse_distance_share: float | None  # reuse distance / compared capacity
    window_ns: int
    window_device_evictions: int
    window_device_evicted_tokens: int
    window_device_evictions_per_s: float | None
    run_device_evictions_per_s: float | None
    rereferenced_share: float | None
    thrashing: bool
    thrashing_when_evicted: bool = False  # thrashing, and an eviction of its prefix inside the window


@dataclass(frozen=True)
class Step:
    step: int
    name: str
    finding: str
    evidence: HostHitEvidence | PrefixEvidence | LoadBackEvidence | EvictionEvidence
    # The finding's sentences as claims, where a step builds it from them (the routing step,
    # diagnose/dp/routing.py); the four steps' findings are plain text (their claims are the verdict's).
    claims: tuple[Claim, ...] = ()

    def to_json(self) -> dict:
        d = {"step": self.step, "name": self.name, "finding": self.finding,
             "evidence": dataclass_json(self.evidence)}
        if self.claims:
            d["claims"] = [c.to_json() for c in self.claims]
        return d


@dataclass(frozen=True)
class Decomposition:
    """TTFT = queue + storage_wait + loadback_exposed + recompute + compute (ns)."""

    ttft_ns: int
    ideal_ttft_ns: int
    excess_ns: int
    queue_ns: int
    storage_wait_ns: int
    loadback_exposed_ns: int
    recompute_ns: int
    compute_ns: int

    def shares_of_ttft(self) -> dict[str, float | None]:
        return {
            Cause.QUEUEING: share(self.queue_ns, self.ttft_ns),
            Cause.STORAGE_FETCH: share(self.storage_wait_ns, self.ttft_ns),
            Cause.LOAD_BACK: share(self.loadback_exposed_ns, self.ttft_ns),
            Cause.RECOMPUTE: share(self.recompute_ns, self.ttft_ns),
            Cause.COMPUTE: share(self.compute_ns, self.ttft_ns),
        }

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["share_of_ttft"] = self.shares_of_ttft()
        return d


@dataclass(frozen=True)
class Explanation:
    run_id: str
    run_name: str
    req_id: str
    seq: int | None
    status: str
    reject_reason: str | None
    hit_class: str | None
    arrival_ns: int | None  # since the run's first arrival (run_start_ns), like every time below
    ttft_ns: int | None
    tokens: TokenSplit
    steps: tuple[Step, ...]
    primary_cause: str | None
    headline: str
    verdict: str
    decomposition: Decomposition | None
    ttft_if_device_resident_ns: int | None
    recompute_instead_ns: int | None
    evicted_by: tuple[str, ...]
    ttft_if_never_evicted_ns: int | None = None
    context: RequestContext | None = None
    queue_attribution: QueueAttribution | None = None
    advice: tuple = ()  # advice.Advice items (the run's, verified for this request when measured)
    claims: tuple[Claim, ...] = ()  # the verdict's sentences after its first, in order
    # The run's first arrival in the store's virtual time: where the times above count from (a
    # trace sliced from a longer one starts late); add it back to match the store's *_ns columns.
    run_start_ns: int = 0
    # The SGLang release whose rules the run followed, and its words for the contract's names
    # (step names and evidence keys stay the contract's; the terminal shows these words).
    sglang_rules: str | None = None
    vocabulary: dict[str, str] | None = None

    def word(self, name: str) -> str:
        """The run's SGLang word for a contract name (a step name, an evidence key)."""
        return (self.vocabulary or {}).get(name, name)

    def to_json(self) -> dict:
        """DESIGN.md §3 `explain --json`, extended (run_name, status, verdict, decomposition...) and
        §5 (context, queue_attribution_ms, advice)."""
        return {
            "run_id": self.run_id,
            "req_id": self.req_id,
            "class": self.hit_class,
            "ttft_ms": ns_to_ms(self.ttft_ns),
            "tokens": self.tokens.to_json(),
            "steps": [s.to_json() for s in self.steps],
            "primary_cause": self.primary_cause,
            "counterfactual": {
                "ttft_if_device_resident_ms": ns_to_ms(self.ttft_if_device_resident_ns),
                "recompute_instead_ms": ns_to_ms(self.recompute_instead_ns),
                "ttft_if_never_evicted_ms": ns_to_ms(self.ttft_if_never_evicted_ns),
            },
            "evicted_by": list(self.evicted_by),
            "run_name": self.run_name,
            "seq": self.seq,
            "status": self.status,
            "reject_reason": self.reject_reason,
            "arrival_ms": ns_to_ms(self.arrival_ns),
            "run_start_ms": ns_to_ms(self.run_start_ns),
            "headline": self.headline,
            "verdict": self.verdict,
            "decomposition": self.decomposition.to_json() if self.decomposition else None,
            "context": self.context.to_json() if self.context else None,
            "queue_attribution_ms": self.queue_attribution.to_json() if self.queue_attribution else None,
            # Proposed and confirmed items are advice; tried ones that did not help (DESIGN §6) apart.
            "advice": [a.to_json() for a in self.advice if a.advised],
            "tried_not_advised": [a.to_json() for a in self.advice if not a.advised],
            "claims": [c.to_json() for c in self.claims],
            "sglang_rules": self.sglang_rules,
            "vocabulary": dict(self.vocabulary or {}),
        }
