"""The rules in which SGLang's releases differ, by name, and how a config names some of them
"switched back": a replay under a release with a few of its rules taken from the release
before it. `tierdiag replay TRACE --sglang 0.5.9,0.5.23` replays the newer release once per
rule with that rule alone switched back, to isolate what each rule moves (app/upgrade.py).

A rule is one or more fields of engine/rules.py's `RuleSet` that only make sense together (the
prefetch room is a share *and* the pool it is a share of). engine/rules.py builds the mixed rule
set; tests/engine/test_rule_names.py checks that every field the releases differ in has a name
here. A field with none still differs between the two releases' runs, but no run isolates it
(the upgrade view says so rather than crediting its effect to another rule).

No torch, no engine: names and validation only (the config layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tierdiag.errors import ConfigError

# Newest first (config.engine.SGLANG_RULES is this tuple): the release "before" one is the
# next in this tuple.
RELEASES = ("0.5.23", "0.5.9")
# Each release's prefetch policy when the config sets none (its RuleSet's prefetch_policy_default;
# config/names.py PrefetchPolicy's values: "timeout", "best_effort").
SGLANG_PREFETCH_POLICY = {"0.5.23": "timeout", "0.5.9": "best_effort"}
# Each release's host pool layout (`hicache_mem_layout` default; its RuleSet's host_layout).
# Here, not in config/engine.py, so that engine/rules.py (read by summary and explain) does not
# load the config's schema and presets (issue 41: start-up).
SGLANG_HOST_LAYOUT = {"0.5.23": "page_first", "0.5.9": "layer_first"}
# Whether an explicit `--max-running-requests` is capped at half the device pool (its RuleSet's
# max_running_capped_by_pool; resolve_max_running_requests below): 0.5.23
# `KVCacheConfigurator.resolve_max_num_reqs` caps it, 0.5.9 `init_memory_pool` sizes the
# ReqToTokenPool to it as given.
SGLANG_MAX_RUNNING_CAPPED_BY_POOL = {"0.5.23": True, "0.5.9": False}
# resolve_max_num_reqs's estimate when no cap is given: 512 requests a context's worth of device
# tokens, clamped to [2048, 4096] (the same numbers in 0.5.9's init_memory_pool)
MAX_RUNNING_PER_CONTEXT = 512
MAX_RUNNING_ESTIMATE_RANGE = (2048, 4096)


def resolve_max_running_requests(explicit: int | None, device_tokens: int, context_len: int,
                                 capped_by_pool: bool) -> int:
    """SGLang's `max_running_requests` for one scheduler (a data-parallel rank behind a router:
    no attention-DP division), from the device pool in tokens and the context length.

    0.5.23 `KVCacheConfigurator.resolve_max_num_reqs(token_capacity)`: none given,
    `min(clamp(int(token_capacity / context_len * 512), 2048, 4096), token_capacity // 2)`;
    given, `min(max(1, N // attn_dp_size), token_capacity // 2)`. The ReqToTokenPool gets that
    many rows (`_build_default_req_pool(size=max_num_reqs)`, row 0 padding beside them) and the
    scheduler's `get_worker_info` reads it back; `pp_max_micro_batch_size` defaults to it.
    0.5.9 `ModelRunner.init_memory_pool` + `__init__`: none given, the same estimate with
    `min(max_total_num_tokens // 2, pool size)` after it; given, N as it is (the pool is N rows,
    `min(N // dp_size, pool size)` with dp_size 1)."""
    half = device_tokens // 2
    if explicit is not None:
        return min(explicit, half) if capped_by_pool else explicit
    lo, hi = MAX_RUNNING_ESTIMATE_RANGE
    estimated = max(min(int(device_tokens / context_len * MAX_RUNNING_PER_CONTEXT), hi), lo)
    return min(estimated, half)


@dataclass(frozen=True)
class RuleName:
    """One rule of the upgrade view: the RuleSet fields switched back together, and its name."""

    name: str  # the key used in `sglang_switched_back`, the view and --json
    fields: tuple[str, ...]  # engine/rules.py RuleSet fields switched back together
    title: str  # a few words for the view (docs/engine.md's table names it the same way)


RULE_NAMES: dict[str, RuleName] = {r.name: r for r in (
    RuleName("eviction_amount", ("eviction_amount",), "eviction amount"),
    RuleName("admission_overhead_pages", ("admission_overhead_pages",), "admission overhead page"),
    RuleName("chunk_later_requests", ("chunk_later_requests",), "chunk shape"),
    RuleName("hits_past_inserted", ("hits_past_inserted",), "hit counts"),
    RuleName("lpm_counts_host_hit", ("lpm_counts_host_hit",), "LPM key"),
    RuleName("split_upper_created_at_split", ("split_upper_created_at_split",), "split, creation time"),
    RuleName("insert_priority_before_split", ("insert_priority_before_split",), "split, priority"),
    RuleName("stamp_path_after_walk", ("stamp_path_after_walk",), "access stamps"),
    RuleName("unevict_counts_hit", ("unevict_counts_hit",), "refill by insert"),
    RuleName("reclaim_host_duplicates", ("reclaim_host_duplicates",), "host pressure under write_back"),
    RuleName("write_back_drop_spares_pinned", ("write_back_drop_spares_pinned",),
             "write-back drop of a pinned subtree"),
    RuleName("split_cached_prefix", ("split_cached_prefix",), "tier split"),
    # Issue 43's rules of 0.5.23 (docs/engine.md): alloc_paged_token_slots_extend's one page a
    # request once a batch, checkpoint_into_tree's second insert at priority + 1, a decode out of
    # memory alone aborted rather than raised, the waiting-prefix refresh.
    RuleName("batch_alloc_page_per_request", ("batch_alloc_page_per_request",), "batch allocation slack"),
    RuleName("finish_reinserts_prompt", ("finish_reinserts_prompt",), "priority re-insert at finish"),
    RuleName("backups_flush_per_batch", ("backups_flush_per_batch",), "backups merged a batch"),
    RuleName("backup_chains_ancestors", ("backup_chains_ancestors",), "backup of unbacked ancestors"),
    RuleName("decode_oom_aborts", ("decode_oom_aborts",), "decode out of memory"),
    RuleName("waiting_prefix_refresh", ("waiting_prefix_refresh_interval", "waiting_prefix_refresh_max"),
             "waiting-prefix refresh"),
    RuleName("prefetch_capacity", ("prefetch_capacity_share", "prefetch_capacity_of_host_minus_device"),
             "prefetch in flight"),
    RuleName("prefetch_gate_on_best_match", ("prefetch_gate_on_best_match",), "prefetch gate"),
    RuleName("prefetch_alloc_hit_only", ("prefetch_alloc_hit_only",), "prefetch host memory"),
    # Read by the config (EngineConfig.resolved_prefetch_policy), not the engine: switched back,
    # an unset prefetch_policy resolves to the earlier release's default.
    RuleName("prefetch_policy_default", ("prefetch_policy_default",), "default prefetch policy"),
    # SGLang's max_running_requests cap (docs/engine.md, "Running requests"): an
    # explicit value capped at half the device pool (read by the config, EngineConfig.
    # resolved_max_running_requests), and where the scheduler tests it.
    RuleName("max_running_capped_by_pool", ("max_running_capped_by_pool",), "explicit running cap"),
    RuleName("max_running_check_returns_early", ("max_running_check_returns_early",), "running cap check"),
    RuleName("prefetch_timer_at_first_poll", ("prefetch_timer_at_first_poll",), "timeout clock"),
    RuleName("prefetch_retry", ("prefetch_retry_interval_passes", "prefetch_retry_max_attempts"),
             "storage re-queries"),
    RuleName("prefetch_assume_stored", ("prefetch_assume_stored",), "known hit on re-query"),
    RuleName("insert_host_refills_host", ("insert_host_refills_host",), "host copy refilled by a read"),
    RuleName("storage_acks_per_pass", ("storage_acks_per_pass",), "storage acks a pass"),
    # Recorded in the run's config only (EngineConfig.to_json): it moves nothing in the model.
    RuleName("host_layout", ("host_layout",), "host layout"),
)}
# RuleSet fields that are not rules: what the release is called and how explain words it.
NOT_RULES = ("version", "vocabulary", "doc")


def release_before(version: str) -> str | None:
    """The release whose rules `version`'s switched-back rules are (None: the oldest)."""
    i = RELEASES.index(version)
    return RELEASES[i + 1] if i + 1 < len(RELEASES) else None


def switched_back_names(text: str | None) -> tuple[str, ...]:
    """`sglang_switched_back`'s rule names, in the order given; () for None or "". Unknown,
    repeated or empty names are a ConfigError naming the key (exit 2; 3 from a --config file)."""
    if text is None or text == "":
        return ()
    if not isinstance(text, str):
        raise ConfigError(f"sglang_switched_back {text!r} must be a string of rule names")
    names = tuple(n.strip() for n in text.split(","))
    for n in names:
        if not n:
            raise ConfigError(f"sglang_switched_back {text!r}: an empty rule name "
                              f"(a comma-separated list of: {', '.join(RULE_NAMES)})"[:400])
        if n not in RULE_NAMES:
            close = [k for k in RULE_NAMES if n.lower() in k or k in n.lower()]
            raise ConfigError(f"sglang_switched_back: unknown rule {n[:60]!r}; known: {', '.join(RULE_NAMES)}",
                              hint=f"did you mean {close[0]}?" if close else None)
    seen = set()
    for n in names:
        if n in seen:
            raise ConfigError(f"sglang_switched_back names rule {n} twice")
        seen.add(n)
    return names


def check_switched_back(text: str | None, version: str) -> tuple[str, ...]:
    """The names, checked against the release: the oldest has nothing to switch back to."""
    names = switched_back_names(text)
    if names and release_before(version) is None:
        raise ConfigError(f"sglang_switched_back needs a release with one before it; SGLang {version} is the "
                          f"oldest rule set", hint=f"use --sglang {RELEASES[0]}")
    return names


def rule_release(version: str, switched_back: tuple[str, ...], rule: str) -> str:
    """The release whose value of `rule` a run under `version` with `switched_back` follows."""
    return release_before(version) or version if rule in switched_back else version


def parse_releases(text: str) -> tuple[str, ...]:
    """`--sglang`'s value: one release, or two (OLD,NEW in either order) for the upgrade view.
    Each element is checked as a single `--sglang` is (EngineConfig's names); the same one
    twice, more than two, or an empty element is a ConfigError (exit 2)."""
    if not isinstance(text, str):
        raise ConfigError(f"--sglang {text!r} must be a release or two, comma-separated")
    parts = [p.strip() for p in text.split(",")]
    shown = text if len(text) <= 80 else text[:77] + "..."
    if len(parts) > 2:
        raise ConfigError(f"--sglang {shown!r}: at most two releases (OLD,NEW), got {len(parts)}")
    for p in parts:
        if not p:
            raise ConfigError(f"--sglang {shown!r}: an empty release name; known: {', '.join(RELEASES)}")
        if p not in RELEASES:
            raise ConfigError(f"--sglang {shown!r}: unknown release {p[:40]!r}; known: {', '.join(RELEASES)}")
    if len(parts) == 2 and parts[0] == parts[1]:
        raise ConfigError(f"--sglang {shown!r} names SGLang {parts[0]} twice",
                          hint=f"an upgrade needs two releases, e.g. --sglang {RELEASES[1]},{RELEASES[0]}")
    return tuple(parts)


def ordered(releases: Sequence[str]) -> tuple[str, str]:
    """(OLD, NEW) of two releases, whichever order they were given in."""
    old, new = sorted(releases, key=RELEASES.index, reverse=True)
    return old, new
