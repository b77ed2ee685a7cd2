"""Profiles for `replay --profile` (TOML key `profile`): what replaces the presets' clock.

Two kinds, told apart by their content:
- a *fitted* profile (TOML, `tierdiag calibrate --from OBSERVED_RUN`): every clock parameter of
  the cost model, fitted to a server's requests or kept from the presets where the fit could
  not determine it, with where it came from (`[fit]`: source run, usable requests, intervals,
  held-out error). It names the model and GPU presets it was fitted against: the replay must use
  the same ones (their layer count and KV bytes per token turn the fitted times into bytes);
- a *copy-kernel* profile (JSON, `tierdiag calibrate`): the link numbers measured here.

The clock, in the cost model's terms (engine/costmodel.py)::

    prefill batch = max(Σ a·n + b·n·(p + n/2), floor) + overhead     n computed, p attended prefix
    decode step   = d0 + d1 · running context tokens
    load-back     = transfer overhead + bytes / h2d bandwidth (+ per-page and per-run costs)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tierdiag.config.presets import GPUS, MODELS, gpu_preset, model_preset
from tierdiag.config.schema import Choice, Float, KeyedConfigError, Schema, check_values
from tierdiag.paths import refuse_endless_input, write_output

PROFILE_FORMAT = "tierdiag-profile/1"
# The presets' constants that are not in a model or GPU preset (the cost model reads them here).
BATCH_OVERHEAD_NS = 1_000_000  # scheduling + kernel launches per prefill batch
DECODE_STEP_OVERHEAD_NS = 20_000  # one decode step's launches, beside reading weights and KV

# name -> (unit, what it is). Order = the order written and shown.
CLOCK_PARAMS: dict[str, tuple[str, str]] = {
    "prefill_ns_per_token": ("ns", "prefill, linear term: per computed token"),
    "prefill_ns_per_token_pair": ("ns", "prefill, attention term: per computed token x attended token"),
    "prefill_floor_ns": ("ns", "least time of a prefill batch (reading the weights once)"),
    "batch_overhead_ns": ("ns", "per prefill batch (scheduling, launches)"),
    "decode_step_ns": ("ns", "decode step with no context (weights read, launches)"),
    "decode_ns_per_context_token": ("ns", "decode step, per running context token (KV read)"),
    "h2d_bytes_per_s": ("B/s", "host->device link for load-backs"),
    "transfer_overhead_ns": ("ns", "per load-back transfer"),
    "d2h_bytes_per_s": ("B/s", "device->host link for backups"),
}
# Each clock parameter's bounds, declared once: times in ns from 0, bandwidths in bytes/s from
# 1 MB/s to 1 PB/s. At their bounds, one operation on the longest request a trace may hold (2^24
# tokens: its prefill attending 2^24 cached tokens, its copy over the slowest link, a decode step
# over a 2^24-token context) stays under 2^60 ns (~36 years), where the clock leaves 2^62 ns
# after the last arrival (trace/reader.py MAX_ARRIVAL_NS); every preset's clock is inside them
# (the slowest: llama3-70b on the cpu preset, 141 ms a token, 2,621 ns a token pair). Both are tested
# (tests/reliability/test_config_boundary.py).
_NS = 1e12  # one batch's floor or overhead, a decode step, a transfer's overhead: 1,000 s
CLOCK_BOUNDS: dict[str, Any] = {
    "prefill_ns_per_token": Float(0.0, 1e9, what="time in ns", cli=False),
    "prefill_ns_per_token_pair": Float(0.0, 2650.0, what="time in ns", cli=False),
    "prefill_floor_ns": Float(0.0, _NS, what="time in ns", cli=False),
    "batch_overhead_ns": Float(0.0, _NS, what="time in ns", cli=False),
    "decode_step_ns": Float(0.0, _NS, what="time in ns", cli=False),
    "decode_ns_per_context_token": Float(0.0, 1e6, what="time in ns", cli=False),
    "h2d_bytes_per_s": Float(1e6, 1e15, what="bandwidth in bytes/s", cli=False),
    "transfer_overhead_ns": Float(0.0, _NS, what="time in ns", cli=False),
    "d2h_bytes_per_s": Float(1e6, 1e15, what="bandwidth in bytes/s", cli=False),
}
assert list(CLOCK_BOUNDS) == list(CLOCK_PARAMS)
# A fitted profile's [clock] table: every parameter, nothing else.
CLOCK_SCHEMA = Schema("FittedClock", CLOCK_BOUNDS)
# A fitted profile's presets.
PRESETS_SCHEMA = Schema("ProfilePresets", {"model": Choice(MODELS, noun="preset", cli=False),
                                            "gpu": Choice(GPUS, noun="preset", cli=False)})
# The link numbers a copy-kernel profile (JSON, `tierdiag calibrate`) sets; its other keys are
# what calibrate measured beside them, not read.
_JSON_KEYS = ("h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_overhead_ns")
JSON_SCHEMA = Schema("CopyKernelProfile", {k: CLOCK_BOUNDS[k] for k in _JSON_KEYS}, strict_keys=False)


def preset_clock(model: str, gpu: str) -> dict[str, float]:
    """The clock the presets give `model` on `gpu` (the cost model's roofline, term by term)."""
    m, g = model_preset(model), gpu_preset(gpu)
    flops_per_s = g.flops_per_s * g.mfu
    return {
        "prefill_ns_per_token": 2.0 * m.num_params / flops_per_s * 1e9,
        "prefill_ns_per_token_pair": 4.0 * m.num_layers * m.hidden_size / flops_per_s * 1e9,
        "prefill_floor_ns": m.weight_bytes / g.hbm_bytes_per_s * 1e9,
        "batch_overhead_ns": float(BATCH_OVERHEAD_NS),
        "decode_step_ns": m.weight_bytes / g.hbm_bytes_per_s * 1e9 + DECODE_STEP_OVERHEAD_NS,
        "decode_ns_per_context_token": m.kv_bytes_per_token / g.hbm_bytes_per_s * 1e9,
        "h2d_bytes_per_s": g.link_bytes_per_s,
        "transfer_overhead_ns": float(g.transfer_overhead_ns),
        "d2h_bytes_per_s": g.link_bytes_per_s,
    }


@dataclass(frozen=True)
class Profile:
    """A `--profile` file read and checked: the clock parameters it sets and where they came from."""

    path: str
    kind: str  # "fitted" (TOML, calibrate --from) | "copy_kernels" (JSON, calibrate)
    clock: dict[str, float]  # the parameters it sets (a fitted profile: all of them)
    model: str | None = None  # fitted: the presets it was fitted against
    gpu: str | None = None
    fit: dict[str, Any] = field(default_factory=dict)  # fitted: provenance ([fit] table)
    sha256: str = ""

    def provenance(self) -> dict[str, Any]:
        """What a run records of the profile it replayed with (config_json `profile_source`)."""
        d: dict[str, Any] = {"path": self.path, "kind": self.kind, "sha256": self.sha256}
        if self.kind == "fitted":
            keep = ("source_run", "source_run_name", "source_db", "usable_batches", "usable_requests",
                    "heldout_prefill_median_rel_error", "heldout_prefill_p90_rel_error", "kept_from_preset")
            d.update({"model": self.model, "gpu": self.gpu}, **{k: self.fit[k] for k in keep if k in self.fit})
        return d


def provenance_line(source: Mapping[str, Any] | None) -> str | None:
    """One line for `runs`/`summary`: which clock a run was replayed with (None: the presets')."""
    if not source:
        return None
    if source.get("kind") != "fitted":
        return f"clock: link numbers measured by `tierdiag calibrate` ({source.get('path')})"
    err = source.get("heldout_prefill_median_rel_error")
    p90 = source.get("heldout_prefill_p90_rel_error")
    held = (f"held-out prefill error median {err:.1%}, p90 {p90:.1%}" if isinstance(err, (int, float))
            and isinstance(p90, (int, float)) else "no held-out error (too few usable requests)")
    kept = source.get("kept_from_preset") or []
    return (f"clock: calibrated on observed run {source.get('source_run')} "
            f"({source.get('usable_requests', 0):,} usable requests; {held}"
            + (f"; {len(kept)} parameter{'s' if len(kept) != 1 else ''} kept from the preset" if kept else "")
            + ")")


def _bad_file(p: Path, problem: str, hint: str | None = None) -> KeyedConfigError:
    """The profile's own content is wrong: bad input (exit 3) wherever the profile was named,
    `--profile FILE: ...` or `--config C: profile FILE: ...`."""
    return KeyedConfigError(("profile",), lambda n: f"{n('profile')} {p}: {problem}", hint, file_error=True)


def _check(schema: Schema, p: Path, values: Any, prefix: str = "") -> None:
    """`values` (a table of the profile) against `schema`, errors naming the profile and key."""
    if not isinstance(values, dict):
        raise _bad_file(p, f"{prefix.rstrip('.') or 'the profile'} must be a table, got {type(values).__name__}")
    for k in values:
        if not isinstance(k, str) or (schema.struct.__struct_config__.forbid_unknown_fields and k not in schema.fields):
            raise _bad_file(p, f"unknown key {prefix}{k}; known: {', '.join(prefix + f for f in schema.fields)}")
    missing = [k for k in schema.fields if k not in values]
    if missing:
        raise _bad_file(p, f"no {prefix}{missing[0]} (it must be {schema.fields[missing[0]].expected()})")
    try:
        check_values(schema, values)
    except KeyedConfigError as exc:
        raise _bad_file(p, exc.render(lambda k: prefix + k)) from None


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile of either kind, every value checked against its declaration (CLOCK_BOUNDS)
    before any run exists: a missing or unreadable file names the option or config key that
    named it; a bad value names the profile and its key (exit 3)."""
    p = Path(path)
    refuse_endless_input(p, what="calibrate profile", option="--profile")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise KeyedConfigError(("profile",), lambda n: f"{n('profile')} {p}: no such file",
                               "write one with `tierdiag calibrate`") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise KeyedConfigError(("profile",), lambda n: f"{n('profile')} {p}: cannot read it ({reason})") from None
    # Imported here, as a profile is read: a replay without one never loads tomllib (its
    # regular expressions compiled at import) nor libcrypto.
    import hashlib
    import tomllib

    sha = hashlib.sha256(data).hexdigest()
    if data.lstrip()[:1] == b"{":
        return _json_profile(p, data, sha)
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _bad_file(p, f"is not a calibrate profile (neither JSON nor TOML: {exc})") from None
    if raw.get("format") != PROFILE_FORMAT:
        raise _bad_file(p, f"is not a calibrate profile (format {raw.get('format')!r:.60}, expected {PROFILE_FORMAT!r})",
                        "write one with `tierdiag calibrate --from RUN`")
    if "clock" not in raw:
        raise _bad_file(p, "no [clock] table")
    _check(CLOCK_SCHEMA, p, raw["clock"], "clock.")
    _check(PRESETS_SCHEMA, p, {k: raw[k] for k in ("model", "gpu") if k in raw})
    clock = {name: float(raw["clock"][name]) for name in CLOCK_PARAMS}
    fit = raw.get("fit") if isinstance(raw.get("fit"), dict) else {}
    return Profile(path=str(p), kind="fitted", clock=clock, model=raw["model"], gpu=raw["gpu"], fit=fit, sha256=sha)


def _json_profile(p: Path, data: bytes, sha: str) -> Profile:
    import json

    try:
        prof = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _bad_file(p, f"is not a calibrate profile (not JSON: {exc})") from None
    _check(JSON_SCHEMA, p, prof)
    clock = {"h2d_bytes_per_s": float(prof["h2d_bytes_per_s"]), "d2h_bytes_per_s": float(prof["d2h_bytes_per_s"]),
             "transfer_overhead_ns": float(prof["transfer_overhead_ns"])}  # the cost model takes whole ns
    return Profile(path=str(p), kind="copy_kernels", clock=clock, sha256=sha)


def check_profile(path: str | None, model: str, gpu: str) -> Profile | None:
    """The profile at `path`, checked against the replay's presets (None: no profile)."""
    if path is None:
        return None
    prof = load_profile(path)
    if prof.kind == "fitted" and (prof.model, prof.gpu) != (model, gpu):
        raise KeyedConfigError(
            ("profile", "model", "gpu"),
            lambda n: f"{n('profile')} {path} was fitted for model {prof.model} on gpu {prof.gpu}, but the replay "
                      f"uses {model} on {gpu}",
            lambda n: f"pass {n('model')} {prof.model} {n('gpu')} {prof.gpu} (or leave both out: the profile sets them)")
    return prof


def profile_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with model and gpu taken from a fitted profile where they were not given."""
    path = values.get("profile")
    if not path or ("model" in values and "gpu" in values):
        return values
    prof = load_profile(path)
    if prof.kind != "fitted":
        return values
    return {"model": prof.model, "gpu": prof.gpu, **values}


def write_profile(path: str | os.PathLike, *, model: str, gpu: str, clock: Mapping[str, float],
                  fit: Mapping[str, Any]) -> Path:
    """Write a fitted profile atomically (a reader never sees half a file)."""
    import tomli_w  # the TOML writer (tomllib only reads)

    doc = {"format": PROFILE_FORMAT, "model": model, "gpu": gpu,
           "clock": {k: float(clock[k]) for k in CLOCK_PARAMS}, "fit": dict(fit)}
    head = ("# tierdiag calibrate --from: the cost model's clock fitted to an observed run.\n"
            "# Use: tierdiag replay TRACE --profile THIS_FILE (or profile = \"THIS_FILE\" in --config).\n"
            "# [clock] units: ns, or bytes per second for *_bytes_per_s; [fit] says which were fitted.\n")
    p = Path(path)
    # The one output writer: exclusive temporary file, atomic rename, FIFO/device streamed.
    write_output(p, (head + tomli_w.dumps(doc)).encode("utf-8"), what="-o/--out")
    return p
