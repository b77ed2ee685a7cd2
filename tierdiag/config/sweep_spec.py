"""`--set KEY=V1,V2 ...` -> the configurations of a sweep, every one validated before any replay.

Keys are the replay options' TOML names (the keys of `--config`, dashes allowed); values are
parsed by the type of the EngineConfig field. Integers take binary size suffixes, because pool
sizes are written that way (`4M` tokens = 4,194,304, the number DESIGN's advice examples use):

    k = 2**10, M = 2**20, G = 2**30        (case-insensitive; `1.5M` is allowed when exact)

Every mistake is a ConfigError (exit 2) naming the --set it came from: an unknown key (the known
ones listed), a value of the wrong type, an empty list or value, a key given twice, a value
repeated in one list, or a combination the EngineConfig itself refuses.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tierdiag.config.engine import CONFIG_KEYS, CONFIG_SCHEMA, EngineConfig
from tierdiag.config.schema import INT64_MAX, KeyedConfigError, check_values, key_name, option_name
from tierdiag.errors import ConfigError, TierdiagError

SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([kmgt])?$", re.IGNORECASE)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


@dataclass(frozen=True)
class SetOption:
    """One `--set KEY=V1,V2`: the key and its parsed values, with the spellings the user wrote
    (run names use those: `host_tokens=4M` reads better than `host_tokens=4194304`)."""

    key: str
    values: tuple[Any, ...]
    spellings: tuple[str, ...]


@dataclass(frozen=True)
class SweepPlan:
    """The combinations of a sweep, in product order (the first --set varies slowest)."""

    options: tuple[SetOption, ...]
    configs: tuple[tuple[str, EngineConfig], ...]  # (run name, config)

    @property
    def varied_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.options if len(o.values) > 1)


def parse_size(text: str) -> int:
    """'512k' -> 524288, '4M' -> 4194304, '2048' -> 2048. ValueError when not a whole number."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(text)
    number, suffix = m.groups()
    scale = SIZE_SUFFIXES[suffix.lower()] if suffix else 1
    if "." in number:
        whole, frac = number.split(".")
        value = int(whole) * scale + int(frac) * scale // 10 ** len(frac)
        if int(frac) * scale % 10 ** len(frac):
            raise ValueError(text)
        return value
    return int(number) * scale


def size_option(option: str, text: str, *, lo: int = 1, hi: int = INT64_MAX) -> int:
    """A size option's value (`--host-memory 2T`): a whole number with an optional suffix, from
    `lo` to `hi` (int64 at most, what the engine and the store compute with); ConfigError (exit
    2) naming the option otherwise."""
    try:
        value = parse_size(text)
    except ValueError:
        raise ConfigError(f"{option} {text!r} is not a size (e.g. 512G, 2T)") from None
    if not lo <= value <= hi:
        top = "2^63 - 1" if hi == INT64_MAX else f"{hi:,}"
        raise ConfigError(f"{option} {text!r} must be from {lo:,} to {top}")
    return value


def _parse_value(key: str, text: str) -> Any:
    """The text of one `--set` value, read by the kind the key is declared with (config/schema.py);
    its bounds are checked by the caller, against the same declaration."""
    spec = CONFIG_SCHEMA.fields[key]
    low = text.strip().lower()
    if spec.kind is bool:
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("true or false")
    if spec.kind is int:
        try:
            return parse_size(text)
        except ValueError:
            raise ValueError("a whole number, optionally with a k/M/G suffix (512k, 4M, 1G)") from None
    if spec.kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("a number") from None
    return text.strip()


def parse_set(text: str) -> SetOption:
    """One `--set` argument -> SetOption (ConfigError on any mistake)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=V1,V2,...", hint="e.g. --set host_tokens=2M,8M")
    raw_key, _, raw_values = text.partition("=")
    key = raw_key.strip().replace("-", "_")
    if key not in CONFIG_KEYS:
        raise ConfigError(f"--set {text!r}: unknown key {raw_key.strip()!r}; known: {', '.join(sorted(CONFIG_KEYS))}")
    spellings = tuple(v.strip() for v in raw_values.split(","))
    if not raw_values.strip():
        raise ConfigError(f"--set {text!r}: no values for {key}", hint=f"e.g. --set {key}=V1,V2")
    if any(not s for s in spellings):
        raise ConfigError(f"--set {text!r}: empty value in the list for {key}")
    values = []
    for s in spellings:
        try:
            values.append(_parse_value(key, s))
        except ValueError as exc:
            raise ConfigError(f"--set {text!r}: {key} value {s!r} must be {exc}") from None
        try:
            check_values(CONFIG_SCHEMA, {key: values[-1]}, key_name)
        except KeyedConfigError as exc:
            raise ConfigError(f"--set {text!r}: {exc.message}", hint=exc.hint) from None
    seen: dict[Any, str] = {}
    for s, v in zip(spellings, values):
        if v in seen:
            raise ConfigError(f"--set {text!r}: {key} value {s!r} repeats {seen[v]!r}")
        seen[v] = s
    return SetOption(key=key, values=tuple(values), spellings=spellings)


def run_name(options: Sequence[SetOption], picks: Sequence[int]) -> str:
    """'host_tokens=4M,write_policy=write_back': the options that vary, as the user spelled them.

    A sweep where nothing varies names its one run after every key it set."""
    varied = [(o, i) for o, i in zip(options, picks) if len(o.values) > 1] or list(zip(options, picks))
    return ",".join(f"{o.key}={o.spellings[i]}" for o, i in varied)


def plan_sweep(base: EngineConfig, sets: Sequence[str]) -> SweepPlan:
    """The validated combinations of `sets` over `base` (the --config file, or the defaults).

    Every EngineConfig is built here, so a value the engine refuses (a pool smaller than a page,
    an unknown policy) fails before the first replay starts, naming the combination."""
    if not sets:
        raise ConfigError("nothing to sweep: give at least one --set KEY=V1,V2", hint="e.g. --set host_tokens=2M,8M")
    options: list[SetOption] = []
    for text in sets:
        option = parse_set(text)
        if any(o.key == option.key for o in options):
            raise ConfigError(f"--set {option.key} given twice", hint=f"list every value in one --set {option.key}=V1,V2")
        options.append(option)
    base_values = {f.name: getattr(base, f.name) for f in dataclasses.fields(EngineConfig)}
    configs = []
    for picks in itertools.product(*(range(len(o.values)) for o in options)):
        name = run_name(options, picks)
        values = dict(base_values)
        values.update({o.key: o.values[i] for o, i in zip(options, picks)})
        try:
            cfg = EngineConfig(**values)
        except KeyedConfigError as exc:  # the keys --set gave named as it wrote them, the others as options
            set_keys = {o.key for o in options}
            bad = exc.renamed(lambda k: k if k in set_keys else option_name(k))
            raise type(bad)(f"--set combination {name}: {bad.message}", hint=bad.hint) from None
        except TierdiagError as exc:
            raise ConfigError(f"--set combination {name}: {exc.message}", hint=exc.hint) from None
        configs.append((name, cfg))
    return SweepPlan(options=tuple(options), configs=tuple(configs))


def config_changes(config: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a recorded config (config_json) whose value differs from `reference`."""
    return {k: v for k, v in config.items() if k in reference and reference[k] != v}
