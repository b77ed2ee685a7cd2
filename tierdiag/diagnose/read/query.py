"""Small helpers shared by summary / slow / explain / observed over what they read (no SQL: that
is in read/; no pandas, no torch)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from tierdiag.units import ns_to_ms


def link_peak_bytes_per_s(run) -> float | None:
    """The modelled host->device peak the run used (data_plane_json, else hardware_json)."""
    for source in (run.data_plane, run.hardware, run.config):
        value = source.get("link_bytes_per_s") if isinstance(source, dict) else None
        if value:
            return float(value)
    return None


def jsonify(obj: Any) -> Any:
    """Dataclasses -> dicts for --json: a field `x_ns` becomes `x_ms` (float), the rest as is.

    One rule for every typed result, so the JSON and the terminal (which formats by the key's
    unit suffix) always agree.
    """
    if is_dataclass(obj) and not isinstance(obj, type):
        return obj.to_json() if hasattr(obj, "to_json") else dataclass_json(obj)
    if isinstance(obj, (list, tuple)):
        return [jsonify(v) for v in obj]
    if isinstance(obj, dict):
        return {k: jsonify(v) for k, v in obj.items()}
    return obj


def dataclass_json(obj: Any) -> dict:
    """`jsonify` for a dataclass that defines to_json itself (avoids the to_json recursion)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name.endswith("_ns"):
            out[f.name[:-3] + "_ms"] = ns_to_ms(value)
        else:
            out[f.name] = jsonify(value)
    return out
