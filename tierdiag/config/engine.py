"""One frozen, validated configuration for a replay. A TOML file or CLI options fill it.

Validation happens before any work: every error names the option and what would be valid.
"""

from __future__ import annotations

import dataclasses
import math
import re
import os
import tomllib
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from tierdiag.errors import ConfigError, ConfigFileError, unknown_name
from tierdiag.config.policies import EVICTION_POLICIES as _EVICTION_REGISTRY
from tierdiag.config.presets import GPUS, MODELS, gpu_preset, model_preset
from tierdiag.config.profile import check_profile, profile_defaults
from tierdiag.config.router import check_router_keys

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
EVICTION_POLICIES = tuple(_EVICTION_REGISTRY)
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
SCHEDULE_POLICIES = ("fcfs", "lpm", "hrrn", "shortest-prefill-first")
# The SGLang releases that have each queue policy (engine/queue_policy.py's registry says the
# same, checked at its import): a policy its release lacks is refused here, before a run exists.
SCHEDULE_POLICY_RELEASES = {"fcfs": ("0.5.9", "0.5.23"), "lpm": ("0.5.9", "0.5.23"),
                            "hrrn": ("0.5.23",), "shortest-prefill-first": ("0.5.23",)}
# Host pools past this are a what-if (large servers carry 1-2 TiB): warned, not refused.
HOST_MEMORY_SANE_BYTES = 2 << 40
NARROWEST_PAGE_BYTES = 8  # one int64 a page: the least the data plane can verify
TIMINGS = ("modelled", "measured")
# Every integer option is stored and computed with as int64 (DuckDB BIGINT, numpy): one past it
# is refused here, whether it came from an option, `--set` or a --config file.
INT64_MAX = 2**63 - 1
# Bounds on --time-scale: arrivals are int64 ns after scaling (the trace reader bounds them
# before), and a factor past these is a typo, not a workload. Checked with the rest of the
# config, so a sweep refuses `--set time_scale=1e30,1` before its first replay.
MAX_TIME_SCALE = 1e6
MIN_TIME_SCALE = 1e-9
VERIFY_MODES = ("all", "sample", "off")
# How session turns arrive (engine/arrivals.py): `trace` at their timestamps (open loop),
# `closed` at their predecessor's finish + think_ms. None (the default): closed, which for a
# trace without sessions is the same as trace.
ARRIVALS = ("trace", "closed")
# The SGLang releases whose rules the engine follows (engine/rules.py: one RuleSet each), the
# default first: 0.5.23, the release `import sglang` reads.
SGLANG_RULES = ("0.5.23", "0.5.9")
# Each release's prefetch policy when the config sets none (engine/rules.py asserts the same).
SGLANG_PREFETCH_POLICY = {"0.5.23": "timeout", "0.5.9": "best_effort"}
# Each release's host pool layout (`hicache_mem_layout` default; engine/rules.py asserts the same).
SGLANG_HOST_LAYOUT = {"0.5.23": "page_first", "0.5.9": "layer_first"}


@dataclass(frozen=True)
class EngineConfig:
    model: str = "llama3-8b"
    gpu: str = "h200"
    # None: derived from the presets (device: what is left of GPU memory after weights at a
    # 0.88 static fraction, like SGLang's mem_fraction_static; host: 2x device, HiCache's ratio).
    device_tokens: int | None = None
    host_tokens: int | None = None
    storage_tokens: int = 0  # 0 = no storage tier
    page_size: int = 64
    block_size: int = 512  # tokens per hash id in Mooncake traces
    write_policy: str = "write_through"
    eviction_policy: str = "lru"
    load_back_threshold: int = 10
    prefetch_policy: str | None = None  # None: the release's default (SGLANG_PREFETCH_POLICY)
    schedule_policy: str = "fcfs"  # fcfs | lpm | hrrn | shortest-prefill-first (engine/queue_policy.py)
    prefetch_threshold: int = 256
    max_prefill_tokens: int = 16384
    layerwise_overlap: bool = True
    timing: str = "modelled"
    profile: str | None = None  # `tierdiag calibrate` profile: JSON (link) or TOML (--from: the whole clock)
    time_scale: float = 1.0  # multiply trace inter-arrival times (2.0 = half the request rate)
    seed: int = 0
    verify: str = "sample"  # byte-for-byte check of load-backs: all | sample | off
    data_plane_mib: int = 64  # memory for the real device+host pools; width shrinks to fit
    mem_fraction_static: float = 0.88
    storage_dir: str | None = None  # default: a folder beside the database
    arrivals: str | None = None  # trace | closed; None: closed where the trace has sessions
    max_context_tokens: int | None = None  # None: the model preset's context (--max-context)
    sglang_rules: str = SGLANG_RULES[0]  # whose rules the engine follows (engine/rules.py)
    # tlru's settings, in tokens (SGLang's --radix-eviction-policy-config threshold and
    # next_prompt_estimate); None: unset (0). Only with eviction_policy = "tlru".
    tlru_threshold: int | None = None
    tlru_next_prompt_estimate: int | None = None
    # SGLang 0.5.23's SGLANG_ENABLE_WAITING_PREFIX_REFRESH (on by default): every 32nd scheduling
    # pass refreshes the LRU recency of the first 128 waiting requests' cached prefixes. 0.5.9
    # has no such refresh; there the key changes nothing.
    waiting_prefix_refresh: bool = True
    # SGLang's --enable-mixed-chunk (off by default, as there): a prefill batch carries a decode
    # step of the running requests instead of waiting for the GPU to run one on its own.
    enable_mixed_chunk: bool = False
    # Data-parallel ranks behind one router (engine/deployment.py; docs/contract.md "Deployments").
    # The router keys are engine/routing/config.py RouterConfig's fields, its defaults the SGLang
    # model gateway's command line.
    dp: int = 1
    router: str = "round_robin"
    router_cache_threshold: float = 0.3
    router_balance_abs_threshold: int = 64
    router_balance_rel_threshold: float = 1.5
    router_eviction_interval_s: float = 60.0
    router_max_tree_tokens: int = 2**26
    router_cache_miss: str = "smallest_tree"
    router_prefix_hash_tokens: int = 256
    router_prefix_hash_load_factor: float = 1.25

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
                raise ConfigError(f"--{f.name.replace('_', '-')} {value} is out of range (at most {INT64_MAX:,})")
        if self.model not in MODELS:
            raise unknown_name("--model preset", self.model, MODELS)
        if self.gpu not in GPUS:
            raise unknown_name("--gpu preset", self.gpu, GPUS)
        for opt, value, known in (
            ("--write-policy", self.write_policy, WRITE_POLICIES),
            ("--eviction-policy", self.eviction_policy, EVICTION_POLICIES),
            ("--prefetch-policy", self.prefetch_policy or "best_effort", PREFETCH_POLICIES),
            ("--schedule-policy", self.schedule_policy, SCHEDULE_POLICIES),
            ("--timing", self.timing, TIMINGS),
            ("--verify", self.verify, VERIFY_MODES),
            ("--arrivals", self.arrivals or "closed", ARRIVALS),
            ("--sglang", self.sglang_rules, SGLANG_RULES),
        ):
            if value not in known:
                raise unknown_name(opt, value, known)
        self._check_tlru()
        have = SCHEDULE_POLICY_RELEASES[self.schedule_policy]
        if self.sglang_rules not in have:
            raise ConfigError(f"--schedule-policy {self.schedule_policy} is not in SGLang {self.sglang_rules} (it has "
                              + ", ".join(n for n, r in SCHEDULE_POLICY_RELEASES.items() if self.sglang_rules in r) + ")",
                              hint=f"use --sglang {have[-1]}")
        ps = self.page_size
        if ps <= 0 or ps & (ps - 1):
            raise ConfigError(f"--page-size {ps} must be a power of two")
        if self.block_size <= 0 or self.block_size % ps:
            raise ConfigError(f"--block-size {self.block_size} must be a positive multiple of --page-size {ps}")
        if self.device_tokens is not None and self.device_tokens < 2 * ps:
            raise ConfigError(f"--device-tokens {self.device_tokens} is smaller than two pages ({2 * ps} tokens)")
        if self.host_tokens is not None and self.host_tokens < ps:
            raise ConfigError(f"--host-tokens {self.host_tokens} is smaller than one page ({ps} tokens)")
        # HiCache's host pool must be at least the device pool (memory_pool_host.py,
        # HostKVCache.__init__: "The host memory should be larger than the device memory with the
        # current protocol"; hicache_ratio > 1). SGLang rounds the host pool up by one page, so an
        # equal size passes there, and here.
        if self.resolved_host_tokens() < self.resolved_device_tokens():
            raise ConfigError(f"--host-tokens {self.resolved_host_tokens():,} is smaller than the device pool "
                              f"({self.resolved_device_tokens():,} tokens); HiCache needs host >= device",
                              hint="raise --host-tokens (SGLang's hicache_ratio must be at least 1)")
        if self.storage_tokens < 0 or (0 < self.storage_tokens < ps):
            raise ConfigError(f"--storage-tokens {self.storage_tokens} must be 0 (off) or at least one page ({ps})")
        for opt, value in (("--load-back-threshold", self.load_back_threshold),
                           ("--prefetch-threshold", self.prefetch_threshold), ("--seed", self.seed)):
            if value < 0:
                raise ConfigError(f"{opt} {value} must not be negative")
        if self.max_prefill_tokens < ps:
            raise ConfigError(f"--max-prefill-tokens {self.max_prefill_tokens} is smaller than one page ({ps})")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"--time-scale {self.time_scale} must be a positive, finite number")
        if not MIN_TIME_SCALE <= self.time_scale <= MAX_TIME_SCALE:
            raise ConfigError(f"--time-scale {self.time_scale:g} is out of range "
                              f"({MIN_TIME_SCALE:g} to {MAX_TIME_SCALE:g})")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ConfigError(f"--max-context {self.max_context_tokens} must be at least 1 token")
        check_router_keys(self)
        if self.data_plane_mib < 1:
            raise ConfigError(f"--data-plane-mib {self.data_plane_mib} must be at least 1")
        ram = _physical_memory_bytes()
        if ram and self.data_plane_mib << 20 > ram:
            raise ConfigError(f"--data-plane-mib {self.data_plane_mib} is more than this machine's memory "
                              f"({ram >> 20:,} MiB)")
        if not 0 < self.mem_fraction_static <= 1:
            raise ConfigError(f"mem_fraction_static {self.mem_fraction_static} must be in (0, 1]")
        check_profile(self.profile, self.model, self.gpu)
        if self.resolved_device_tokens() < 2 * ps:
            raise ConfigError(f"model {self.model} does not fit on gpu {self.gpu}: no room left for the KV cache",
                              hint="pass --device-tokens")
        # The real pools shrink to fit --data-plane-mib: row width first, then layers, down to
        # one 8-byte word a page (dataplane.plan_data_plane). Pools with more pages than even that
        # allows are refused now, naming the options, rather than overrunning the budget.
        pages = (self.resolved_device_tokens() + self.resolved_host_tokens()) // ps
        narrowest = pages * NARROWEST_PAGE_BYTES
        if narrowest > self.data_plane_mib << 20:
            raise ConfigError(f"--device-tokens/--host-tokens: {pages:,} pages need at least "
                              f"{-(-narrowest >> 20):,} MiB of real pool memory, more than --data-plane-mib "
                              f"{self.data_plane_mib}", hint="raise --data-plane-mib, or use smaller pools or a larger --page-size")

    def _check_tlru(self) -> None:
        """SGLang 0.5.23 `kv_cache_hook` / `get_eviction_strategy`: tlru's settings are
        non-negative token counts, a key its policy does not take fails at startup, and
        threshold must exceed next_prompt_estimate ("otherwise no tokens are ever TEL-safe and
        T-LRU is exactly LRU"). Both unset keeps the engine's tlru of before (0 and 0: LRU's
        order), which SGLang refuses at startup (docs/engine.md)."""
        given = {opt: v for opt, v in (("--tlru-threshold", self.tlru_threshold),
                                       ("--tlru-next-prompt-estimate", self.tlru_next_prompt_estimate)) if v is not None}
        for opt, value in given.items():
            if type(value) is not int:
                raise ConfigError(f"{opt} {value!r} must be an integer (tokens)")
            if value < 0:
                raise ConfigError(f"{opt} {value} must not be negative (tokens)")
        if not given:
            return
        if self.eviction_policy != "tlru":
            raise ConfigError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to --eviction-policy "
                              f"tlru only, not {self.eviction_policy} "
                              "(SGLang's --radix-eviction-policy-config fails on a key its policy does not take)")
        threshold, estimate = self.tlru_threshold or 0, self.tlru_next_prompt_estimate or 0
        if threshold <= estimate:
            raise ConfigError(f"--tlru-threshold {threshold} must be greater than --tlru-next-prompt-estimate "
                              f"{estimate}: otherwise no tokens are ever TEL-safe and tlru is exactly lru")

    def resolved_eviction_policy(self):
        """The eviction policy with its settings (tlru's threshold and next_prompt_estimate)."""
        from tierdiag.config.policies import configured_eviction_policy

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

    def resolved_prefetch_policy(self) -> str:
        return self.prefetch_policy or SGLANG_PREFETCH_POLICY[self.sglang_rules]

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
        return found

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["device_tokens"] = self.resolved_device_tokens()
        d["host_tokens"] = self.resolved_host_tokens()
        d["max_context_tokens"] = self.resolved_max_context()
        d["prefetch_policy"] = self.resolved_prefetch_policy()  # the one the run used
        # SGLang's hicache_mem_layout default of the release (engine/rules.py `host_layout`)
        d["host_layout"] = SGLANG_HOST_LAYOUT[self.sglang_rules]
        if self.profile is not None:  # what the clock came from, kept with the run (config/profile.py)
            d["profile_source"] = check_profile(self.profile, self.model, self.gpu).provenance()
        return d


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None


CONFIG_KEYS = tuple(f.name for f in fields(EngineConfig))


def _accepted_types(name: str) -> tuple[type, ...]:
    """The TOML value types a key accepts, from the field's annotation (TOML has no null)."""
    hint = typing.get_type_hints(EngineConfig)[name]
    args = typing.get_args(hint) or (hint,)
    accepted = tuple(a for a in args if a is not type(None))
    return accepted + ((int,) if float in accepted else ())  # `time_scale = 2` means 2.0


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _check_type(path: Path, key: str, name: str, value: Any) -> None:
    accepted = _accepted_types(name)
    # bool is an int subclass; `page_size = true` is a mistake, not 1.
    ok = isinstance(value, accepted) and (bool in accepted or not isinstance(value, bool))
    if not ok:
        want = " or ".join(dict.fromkeys(_TYPE_WORDS.get(t, t.__name__) for t in accepted))
        raise ConfigFileError(f"--config {path}: {key} must be {want}, got {type(value).__name__} {value!r}"[:300])


def load_config(path: str | Path | None, overrides: Mapping[str, Any],
                defaults: Mapping[str, Any] | None = None) -> EngineConfig:
    """TOML file first, then CLI options that were given (None means not given). `defaults`:
    values below both, where the caller knows better than the built-in default (a twin's `dp`).

    Everything is checked before any work starts: a file that cannot be read, is not TOML, has
    an unknown key or a value of the wrong type is a ConfigFileError naming the file and key.
    """
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
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
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name not in CONFIG_KEYS:
                known = ", ".join(sorted(CONFIG_KEYS))
                raise ConfigFileError(f"--config {p}: unknown key {key!r}; known: {known}")
            _check_type(p, key, name, value)
            values[name] = value
    from_file = set(values)
    values = {**(defaults or {}), **values}
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return EngineConfig(**profile_defaults(values))  # a fitted profile names its model and GPU
    except TypeError as exc:
        raise ConfigError(f"bad configuration: {exc}") from None
    except ConfigError as exc:
        # A bad value written in the file is a bad --config file (exit 3), like a wrong type;
        # one given on the command line stays a bad option value (exit 2).
        named = {m.replace("-", "_") for m in re.findall(r"--([a-z][a-z-]*)", exc.message)}
        named |= set(re.findall(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b", exc.message)) & set(CONFIG_KEYS)  # router_* keys
        blamed = named & (from_file - {k for k, v in overrides.items() if v is not None})
        if path is None or isinstance(exc, ConfigFileError) or not blamed:
            raise
        raise ConfigFileError(f"--config {path}: {exc.message}", hint=exc.hint) from None
