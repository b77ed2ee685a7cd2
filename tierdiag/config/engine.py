"""One frozen, validated configuration for a replay. A TOML file or CLI options fill it.

Validation happens before any work: each field is declared once below with its type and bounds
(config/schema.py checks them with msgspec), then __post_init__ checks how fields relate. Every
error names the option, or the --config file and key, and what would be valid.
"""

# No `from __future__ import annotations`: EngineConfig's fields are declared by their annotations
# (config/schema.py reads them back with typing.get_type_hints), and as text each was a ForwardRef
# compiled and evaluated at every start (~40 compiles, issue 41); evaluated here they cost nothing more.
import dataclasses
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from tierdiag.errors import ConfigError, ConfigFileError
from tierdiag.config.constants import MAX_TIME_SCALE, MIN_TIME_SCALE
from tierdiag.config.names import PrefetchPolicy, WritePolicy, values
from tierdiag.config.policies import EVICTION_POLICIES as _EVICTION_REGISTRY, configured_eviction_policy
from tierdiag.config.presets import GPUS, MODELS, gpu_preset, model_preset
from tierdiag.config.profile import check_profile, profile_defaults
from tierdiag.config.releases import (RELEASES, SGLANG_HOST_LAYOUT, SGLANG_MAX_RUNNING_CAPPED_BY_POOL,  # noqa: F401
                                      SGLANG_PREFETCH_POLICY, check_switched_back,  # - re-exported
                                      resolve_max_running_requests, rule_release)
from tierdiag.config.router import DEFAULTS as ROUTER_DEFAULTS, KEYS as ROUTER_KEYS
from tierdiag.config.schema import (Choice, Flag, Float, Int, KeyedConfigError, Schema, Text,
                                    check_values, key_name, option_name, register_options, show)

WRITE_POLICIES = values(WritePolicy)
EVICTION_POLICIES = tuple(_EVICTION_REGISTRY)
PREFETCH_POLICIES = values(PrefetchPolicy)
SCHEDULE_POLICIES = ("fcfs", "lpm", "hrrn", "shortest-prefill-first")
# Host pools past this are a what-if (large servers carry 1-2 TiB): warned, not refused.
HOST_MEMORY_SANE_BYTES = 2 << 40
NARROWEST_PAGE_BYTES = 8  # one int64 a page: the least the data plane can verify
TIMINGS = ("modelled", "measured")
# Every integer option is stored and computed with as int64 (DuckDB BIGINT, numpy): one past it
# is refused (schema.INT64_MAX), whether it came from an option, `--set` or a --config file.
# Lengths in tokens of one page or one hash block: at most the longest request (trace.reader's
# MAX_LENGTH_TOKENS, 2^24).
MAX_PAGE_TOKENS = 2**24
# The real pools' budget, in MiB (a PiB): the machine's memory refuses far less.
MAX_DATA_PLANE_MIB = 2**30
VERIFY_MODES = ("all", "sample", "off")
# How session turns arrive (engine/arrivals.py): `trace` at their timestamps (open loop),
# `closed` at their predecessor's finish + think_ms. None (the default): closed, which for a
# trace without sessions is the same as trace.
ARRIVALS = ("trace", "closed")
# The SGLang releases whose rules the engine follows (config/releases.py; engine/rules.py: one
# RuleSet each), the default first: 0.5.23, the release `import sglang` reads.
SGLANG_RULES = RELEASES
# What each release offers of the options that name something (one check per release for every
# option: a name its release lacks is refused before a run exists, exit 2, or 3 from --config).
# 0.5.9: `RadixCache.__init__`'s eviction_policy switch (radix_cache.py: lru, lfu, fifo, mru,
# filo, priority; slru and tlru came later, 0.5.23's `get_eviction_strategy`), and its queue
# policies fcfs and lpm (`SchedulePolicy`; hrrn and shortest-prefill-first are 0.5.23's).
# Write and prefetch policies and the routers are the same in both. engine/queue_policy.py's
# registry is checked against SCHEDULE_POLICY_RELEASES at its import.
RELEASE_OFFERS: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.23": {"eviction_policy": EVICTION_POLICIES, "schedule_policy": SCHEDULE_POLICIES},
    "0.5.9": {"eviction_policy": ("lru", "lfu", "fifo", "mru", "filo", "priority"),
              "schedule_policy": ("fcfs", "lpm")},
}
# The releases that have each queue policy, oldest first.
SCHEDULE_POLICY_RELEASES = {p: tuple(r for r in reversed(SGLANG_RULES) if p in RELEASE_OFFERS[r]["schedule_policy"])
                            for p in SCHEDULE_POLICIES}


@dataclass(frozen=True)
class EngineConfig:
    """A replay's whole configuration, every field checked against its declaration (module doc)."""

    # Each field: its type and bounds, declared once (config/schema.py). The option that sets it
    # is `--` + the key with dashes unless named; `cli=False`: a config key only.
    model: Choice(MODELS, noun="preset") = "llama3-8b"
    gpu: Choice(GPUS, noun="preset") = "h200"
    # None: derived from the presets (device: what is left of GPU memory after weights at a
    # 0.88 static fraction, like SGLang's mem_fraction_static; host: 2x device, HiCache's ratio).
    device_tokens: Int(1) | None = None
    host_tokens: Int(1) | None = None
    storage_tokens: Int(0) = 0  # 0 = no storage tier
    page_size: Int(1, MAX_PAGE_TOKENS, what="a power of two") = 64
    block_size: Int(1, MAX_PAGE_TOKENS) = 512  # tokens per hash id in Mooncake traces
    write_policy: Choice(WRITE_POLICIES) = WritePolicy.WRITE_THROUGH.value
    eviction_policy: Choice(EVICTION_POLICIES) = "lru"
    load_back_threshold: Int(0) = 10
    prefetch_policy: Choice(PREFETCH_POLICIES) | None = None  # None: the release's default (SGLANG_PREFETCH_POLICY)
    schedule_policy: Choice(SCHEDULE_POLICIES) = "fcfs"  # engine/queue_policy.py
    prefetch_threshold: Int(0) = 256
    max_prefill_tokens: Int(1) = 16384
    layerwise_overlap: Flag(option="--overlap/--no-overlap") = True
    timing: Choice(TIMINGS) = "modelled"
    profile: Text() | None = None  # `tierdiag calibrate` profile: JSON (link) or TOML (--from: the whole clock)
    # multiply trace inter-arrival times (2.0 = half the request rate)
    time_scale: Float(MIN_TIME_SCALE, MAX_TIME_SCALE) = 1.0
    seed: ROUTER_KEYS["seed"] = ROUTER_DEFAULTS["seed"]  # recorded; the random routers draw with it
    verify: Choice(VERIFY_MODES) = "sample"  # byte-for-byte check of load-backs: all | sample | off
    data_plane_mib: Int(1, MAX_DATA_PLANE_MIB) = 64  # memory for the real device+host pools; width shrinks to fit
    mem_fraction_static: Float(0.0, 1.0, lo_open=True, cli=False) = 0.88
    storage_dir: Text() | None = None  # default: a folder beside the database
    arrivals: Choice(ARRIVALS) | None = None  # trace | closed; None: closed where the trace has sessions
    max_context_tokens: Int(1, option="--max-context") | None = None  # None: the model preset's context
    # SGLang's --max-running-requests: requests running at once (one scheduler, each --dp rank);
    # None: derived as SGLang derives it from the device pool and the context length
    # (resolved_max_running_requests). 0.5.23 caps a given value at half the device pool.
    max_running_requests: Int(1) | None = None
    sglang_rules: Choice(SGLANG_RULES, option="--sglang") = SGLANG_RULES[0]  # whose rules (engine/rules.py)
    # Rules of sglang_rules taken from the release before it (comma-separated names of
    # config/releases.py RULE_NAMES; None: none): `replay --sglang OLD,NEW` isolates each rule.
    sglang_switched_back: Text(cli=False) | None = None
    # tlru's settings, in tokens (SGLang's --radix-eviction-policy-config threshold and
    # next_prompt_estimate); None: unset (0). Only with eviction_policy = "tlru".
    tlru_threshold: Int(0) | None = None
    tlru_next_prompt_estimate: Int(0) | None = None
    # SGLang 0.5.23's SGLANG_ENABLE_WAITING_PREFIX_REFRESH (on by default): every 32nd scheduling
    # pass refreshes the LRU recency of the first 128 waiting requests' cached prefixes. 0.5.9
    # has no such refresh; there the key changes nothing.
    waiting_prefix_refresh: Flag(cli=False) = True
    # SGLang's --enable-mixed-chunk (off by default, as there): a prefill batch carries a decode
    # step of the running requests instead of waiting for the GPU to run one on its own.
    enable_mixed_chunk: Flag(option="--enable-mixed-chunk") = False
    # Data-parallel ranks behind one router (engine/deployment.py; docs/contract.md "Deployments").
    # The router keys, their bounds and defaults (the SGLang model gateway's command line) are
    # config/router.py's: declared there once.
    dp: ROUTER_KEYS["dp"] = ROUTER_DEFAULTS["dp"]
    router: ROUTER_KEYS["router"] = ROUTER_DEFAULTS["router"]
    router_cache_threshold: ROUTER_KEYS["router_cache_threshold"] = ROUTER_DEFAULTS["router_cache_threshold"]
    router_balance_abs_threshold: ROUTER_KEYS["router_balance_abs_threshold"] = ROUTER_DEFAULTS["router_balance_abs_threshold"]
    router_balance_rel_threshold: ROUTER_KEYS["router_balance_rel_threshold"] = ROUTER_DEFAULTS["router_balance_rel_threshold"]
    router_eviction_interval_s: ROUTER_KEYS["router_eviction_interval_s"] = ROUTER_DEFAULTS["router_eviction_interval_s"]
    router_max_tree_tokens: ROUTER_KEYS["router_max_tree_tokens"] = ROUTER_DEFAULTS["router_max_tree_tokens"]
    router_cache_miss: ROUTER_KEYS["router_cache_miss"] = ROUTER_DEFAULTS["router_cache_miss"]
    router_prefix_hash_tokens: ROUTER_KEYS["router_prefix_hash_tokens"] = ROUTER_DEFAULTS["router_prefix_hash_tokens"]
    router_prefix_hash_load_factor: ROUTER_KEYS["router_prefix_hash_load_factor"] = ROUTER_DEFAULTS["router_prefix_hash_load_factor"]

    def __post_init__(self) -> None:
        for f in fields(self):  # a number computed with numpy (a proposal's size) is that number
            value = getattr(self, f.name)
            if type(value).__module__ == "numpy" and hasattr(value, "item"):
                object.__setattr__(self, f.name, value.item())
        check_values(CONFIG_SCHEMA, {f.name: getattr(self, f.name) for f in fields(self)})
        self._check_release()
        self._check_tlru()
        # One spelling recorded for one set of rules ("a, b" and "a,b"; "" and None).
        try:
            names = check_switched_back(self.sglang_switched_back, self.sglang_rules)
        except KeyedConfigError:
            raise
        except ConfigError as exc:
            message, hint = exc.message, exc.hint  # the lambda outlives `exc`
            raise KeyedConfigError(("sglang_switched_back", "sglang_rules"), lambda n: message, hint) from None
        object.__setattr__(self, "sglang_switched_back", ",".join(names) or None)
        ps = self.page_size
        if ps & (ps - 1):
            raise _bad(("page_size",), lambda n: f"{n('page_size')} {ps} must be a power of two")
        if self.block_size % ps:
            raise _bad(("block_size", "page_size"),
                       lambda n: f"{n('block_size')} {self.block_size} must be a positive multiple of {n('page_size')} {ps}")
        if self.device_tokens is not None and self.device_tokens < 2 * ps:
            raise _bad(("device_tokens", "page_size"), lambda n: f"{n('device_tokens')} {self.device_tokens} is smaller "
                       f"than two pages ({2 * ps} tokens)")
        if self.host_tokens is not None and self.host_tokens < ps:
            raise _bad(("host_tokens", "page_size"),
                       lambda n: f"{n('host_tokens')} {self.host_tokens} is smaller than one page ({ps} tokens)")
        # HiCache's host pool must be at least the device pool (memory_pool_host.py,
        # HostKVCache.__init__: "The host memory should be larger than the device memory with the
        # current protocol"; hicache_ratio > 1). SGLang rounds the host pool up by one page, so an
        # equal size passes there, and here.
        if self.resolved_host_tokens() < self.resolved_device_tokens():
            raise _bad(("host_tokens", "device_tokens"),
                       lambda n: f"{n('host_tokens')} {self.resolved_host_tokens():,} is smaller than the device pool "
                       f"({self.resolved_device_tokens():,} tokens); HiCache needs host >= device",
                       lambda n: f"raise {n('host_tokens')} (SGLang's hicache_ratio must be at least 1)")
        if 0 < self.storage_tokens < ps:
            raise _bad(("storage_tokens", "page_size"), lambda n: f"{n('storage_tokens')} {self.storage_tokens} must be "
                       f"0 (off) or at least one page ({ps})")
        if self.max_prefill_tokens < ps:
            raise _bad(("max_prefill_tokens", "page_size"), lambda n: f"{n('max_prefill_tokens')} "
                       f"{self.max_prefill_tokens} is smaller than one page ({ps})")
        ram = _physical_memory_bytes()
        if ram and self.data_plane_mib << 20 > ram:
            raise _bad(("data_plane_mib",), lambda n: f"{n('data_plane_mib')} {self.data_plane_mib} is more than this "
                       f"machine's memory ({ram >> 20:,} MiB)")
        check_profile(self.profile, self.model, self.gpu)
        if self.resolved_device_tokens() < 2 * ps:
            raise _bad(("model", "gpu", "mem_fraction_static"),
                       lambda n: f"model {self.model} does not fit on gpu {self.gpu} at {n('mem_fraction_static')} "
                       f"{self.mem_fraction_static}: no room left for the KV cache",
                       lambda n: f"pass {n('device_tokens')}")
        # The real pools shrink to fit --data-plane-mib: row width first, then layers, down to
        # one 8-byte word a page (dataplane.plan_data_plane). Pools with more pages than even that
        # allows are refused now, naming the options, rather than overrunning the budget.
        pages = (self.resolved_device_tokens() + self.resolved_host_tokens()) // ps
        narrowest = pages * NARROWEST_PAGE_BYTES
        if narrowest > self.data_plane_mib << 20:
            raise _bad(("device_tokens", "host_tokens", "data_plane_mib"),
                       lambda n: f"{n('device_tokens')}/{n('host_tokens')}: {pages:,} pages need at least "
                       f"{-(-narrowest >> 20):,} MiB of real pool memory, more than {n('data_plane_mib')} "
                       f"{self.data_plane_mib}",
                       lambda n: f"raise {n('data_plane_mib')}, or use smaller pools or a larger {n('page_size')}")

    def _check_release(self) -> None:
        """Every option that names something, against what the release offers (RELEASE_OFFERS)."""
        offers = RELEASE_OFFERS[self.sglang_rules]
        for key, names in offers.items():
            value = getattr(self, key)
            if value in names:
                continue
            have = [r for r in SGLANG_RULES if value in RELEASE_OFFERS[r][key]]
            raise _bad((key, "sglang_rules"),
                       lambda n, key=key, value=value: f"{n(key)} {value} is not in SGLang {self.sglang_rules} "
                       f"(it has {', '.join(offers[key])})",
                       lambda n, have=have: f"use {n('sglang_rules')} {have[0]}" if have else None)

    def _check_tlru(self) -> None:
        """SGLang 0.5.23 `kv_cache_hook` / `get_eviction_strategy`: tlru's settings are
        non-negative token counts (declared above), a key its policy does not take fails at
        startup, and threshold must exceed next_prompt_estimate ("otherwise no tokens are ever
        TEL-safe and T-LRU is exactly LRU"). Both unset keeps the engine's tlru of before (0 and
        0: LRU's order), which SGLang refuses at startup (docs/engine.md)."""
        given = tuple(k for k in ("tlru_threshold", "tlru_next_prompt_estimate") if getattr(self, k) is not None)
        if not given:
            return
        if self.eviction_policy != "tlru":
            raise _bad((*given, "eviction_policy"),
                       lambda n: f"{' and '.join(n(k) for k in given)} {'apply' if len(given) > 1 else 'applies'} to "
                       f"{n('eviction_policy')} tlru only, not {self.eviction_policy} "
                       "(SGLang's --radix-eviction-policy-config fails on a key its policy does not take)")
        threshold, estimate = self.tlru_threshold or 0, self.tlru_next_prompt_estimate or 0
        if threshold <= estimate:
            raise _bad(given, lambda n: f"{n('tlru_threshold')} {threshold} must be greater than "
                       f"{n('tlru_next_prompt_estimate')} {estimate}: otherwise no tokens are ever TEL-safe and tlru "
                       "is exactly lru")

    def resolved_eviction_policy(self):
        """The eviction policy with its settings (tlru's threshold and next_prompt_estimate)."""
        return configured_eviction_policy(self.eviction_policy, self.tlru_threshold or 0,
                                          self.tlru_next_prompt_estimate or 0)

    # --- derived sizes -------------------------------------------------------------------
    def resolved_device_tokens(self) -> int:
        if self.device_tokens is not None:
            return self.device_tokens - self.device_tokens % self.page_size
        m, g = model_preset(self.model), gpu_preset(self.gpu)
        free = g.memory_bytes * self.mem_fraction_static - m.weight_bytes
        tokens = int(max(free, 0) // m.kv_bytes_per_token)
        return tokens - tokens % self.page_size

    def resolved_max_context(self) -> int:
        """The longest request (input + output tokens) served: --max-context, else the model's."""
        if self.max_context_tokens is not None:
            return self.max_context_tokens
        return model_preset(self.model).max_context_tokens

    def resolved_max_running_requests(self) -> int:
        """SGLang's `max_running_requests` for this config's device pool and context
        (config.releases.resolve_max_running_requests; rule max_running_capped_by_pool)."""
        capped = SGLANG_MAX_RUNNING_CAPPED_BY_POOL[self._rule_release("max_running_capped_by_pool")]
        return resolve_max_running_requests(self.max_running_requests, self.resolved_device_tokens(),
                                            self.resolved_max_context(), capped)

    def resolved_prefetch_policy(self) -> str:
        return self.prefetch_policy or SGLANG_PREFETCH_POLICY[self._rule_release("prefetch_policy_default")]

    def _rule_release(self, rule: str) -> str:
        """The release whose value of `rule` this config follows (sglang_switched_back)."""
        return rule_release(self.sglang_rules, check_switched_back(self.sglang_switched_back, self.sglang_rules), rule)

    def resolved_host_tokens(self) -> int:
        host = self.host_tokens if self.host_tokens is not None else 2 * self.resolved_device_tokens()
        return host - host % self.page_size

    def warnings(self) -> list[str]:
        """Legal but physically odd choices worth a line on stderr (the replay still runs)."""
        m, g = model_preset(self.model), gpu_preset(self.gpu)
        kv_bytes = self.resolved_device_tokens() * m.kv_bytes_per_token
        room = g.memory_bytes - m.weight_bytes
        gib = 1 << 30
        found = []
        if self.device_tokens is not None and kv_bytes > room:
            found.append(f"--device-tokens {self.device_tokens:,} of {self.model} KV is {kv_bytes / gib:,.1f} GiB, more "
                         f"than the {room / gib:,.1f} GiB a {self.gpu} ({g.memory_bytes / gib:,.1f} GiB) has beside "
                         "the weights: a what-if, not a real GPU")
        host_bytes = self.resolved_host_tokens() * m.kv_bytes_per_token
        if host_bytes > HOST_MEMORY_SANE_BYTES:
            found.append(f"--host-tokens {self.resolved_host_tokens():,} of {self.model} KV is {host_bytes / gib:,.1f} GiB, "
                         f"more than the {HOST_MEMORY_SANE_BYTES >> 40} TiB of memory a host has: a what-if, not a real "
                         "server")
        running = self.resolved_max_running_requests()
        if self.max_running_requests is not None and running < self.max_running_requests:
            # resolve_max_num_reqs's own warning ("max_running_requests was reduced from the
            # requested %d to %d ... due to the available KV cache capacity")
            found.append(f"--max-running-requests {self.max_running_requests:,} is reduced to {running:,}, half the "
                         f"device pool ({self.resolved_device_tokens():,} tokens), as SGLang {self.sglang_rules} does")
        return found

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["device_tokens"] = self.resolved_device_tokens()
        d["host_tokens"] = self.resolved_host_tokens()
        d["max_context_tokens"] = self.resolved_max_context()
        # the cap the run used, and the one it was given (None: derived from its pools and context)
        d["max_running_requests"] = self.resolved_max_running_requests()
        d["max_running_requests_given"] = self.max_running_requests
        d["prefetch_policy"] = self.resolved_prefetch_policy()  # the one the run used
        # SGLang's hicache_mem_layout default of the release (engine/rules.py `host_layout`)
        d["host_layout"] = SGLANG_HOST_LAYOUT[self._rule_release("host_layout")]
        if self.profile is not None:  # what the clock came from, kept with the run (config/profile.py)
            d["profile_source"] = check_profile(self.profile, self.model, self.gpu).provenance()
        return d


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None


def _bad(keys: tuple[str, ...], render, hint=None) -> KeyedConfigError:
    return KeyedConfigError(keys, render, hint)


CONFIG_KEYS = tuple(f.name for f in fields(EngineConfig))
# The declarations above, as one msgspec schema: a value of any key, from any source, is checked
# against it (check_values), before EngineConfig's own checks of how keys relate.
CONFIG_SCHEMA = Schema.of_class(EngineConfig)
register_options(CONFIG_SCHEMA)


def load_config(path: str | Path | None, overrides: Mapping[str, Any],
                defaults: Mapping[str, Any] | None = None, *, defaults_origin: str | None = None) -> EngineConfig:
    """TOML file first, then CLI options that were given (None means not given). `defaults`:
    values below both, where the caller knows better than the built-in default (a twin's `dp`),
    `defaults_origin` saying where they came from (for the error when one is out of range).

    Everything is checked before any work starts. A file that cannot be read, is not TOML, has
    an unknown key or a bad value is a ConfigFileError (exit 3) naming the file and key; a bad
    option value is a ConfigError (exit 2) naming the option. A check of several keys blames the
    file when a key it involves came from the file (and no option overrode it).
    """
    values: dict[str, Any] = {}
    if path is not None:
        values = _read_config_file(Path(path))
    given = {k: v for k, v in overrides.items() if v is not None}
    from_file = set(values) - set(given)
    from_defaults = set(defaults or {}) - set(values) - set(given)

    def name(key: str) -> str:  # what a key is called where its value came from
        return key if key in from_file else option_name(key)

    check_values(CONFIG_SCHEMA, given)  # a bad option value: exit 2, naming the option
    if from_defaults:
        try:
            check_values(CONFIG_SCHEMA, {k: defaults[k] for k in from_defaults})
        except KeyedConfigError as exc:
            key = exc.keys[0]
            raise ConfigError(f"{option_name(key)} {show(defaults[key])} was taken from "
                              f"{defaults_origin or 'the default'}, but it must be {CONFIG_SCHEMA.fields[key].expected()}",
                              hint=f"pass {option_name(key)} to choose") from None
    merged = {**{k: defaults[k] for k in from_defaults}, **values, **given}
    try:
        return EngineConfig(**profile_defaults(merged))  # a fitted profile names its model and GPU
    except KeyedConfigError as exc:
        if path is not None and (from_file & set(exc.keys)):
            raise exc.renamed(name, prefix=f"--config {path}: ", file=True) from None
        raise exc.renamed(name) from None


def _read_config_file(p: Path) -> dict[str, Any]:
    """The keys of a --config file, each checked against its declaration (exit 3 naming the key)."""
    import tomllib  # here: a replay without --config never compiles its regular expressions

    from tierdiag.paths import refuse_endless_input

    refuse_endless_input(p, what="TOML file", option="--config")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigFileError(f"--config {p}: no such file") from None
    except IsADirectoryError:
        raise ConfigFileError(f"--config {p}: is a folder, not a TOML file") from None
    except OSError as exc:
        raise ConfigFileError(f"--config {p}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"--config {p}: not UTF-8 text (is it a TOML file?)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"--config {p}: not valid TOML ({exc})") from None
    if isinstance(raw.get("replay"), dict):  # a [replay] table, or top-level keys
        table = raw.pop("replay")
        if raw:
            key = next(iter(raw))
            raise ConfigFileError(f"--config {p}: unknown key {key!r} beside the [replay] table",
                                  hint="put every option inside [replay]")
        raw = table
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in CONFIG_KEYS:
            known = ", ".join(sorted(CONFIG_KEYS))
            raise ConfigFileError(f"--config {p}: unknown key {key!r}; known: {known}")
        values[name] = value
    try:
        check_values(CONFIG_SCHEMA, values, key_name)
    except KeyedConfigError as exc:
        raise exc.renamed(key_name, prefix=f"--config {p}: ", file=True) from None
    return values
