"""Numbers with units, one spelling for every view (findings, terminal, JSON).

Internally everything stays in the store's units (ns, bytes, tokens); these turn them into
what a person reads. JSON gets milliseconds as floats (`ns_to_ms`), text gets `fmt_*`.
"""

from __future__ import annotations

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def ns_to_ms(ns: int | float | None) -> float | None:
    return None if ns is None else round(ns / NS_PER_MS, 6)


def fmt_ms(ns: int | float | None) -> str:
    """Virtual time, auto-scaled: µs for tiny test models, ms, s, then minutes past 2 min and
    hours past 3 h.

    Zero is written one way, "0 ms"; a non-zero time too small to show is "< 0.01 µs", never a
    "0.00 µs" beside a "0 ms"."""
    if ns is None:
        return "-"
    ms = ns / NS_PER_MS
    a = abs(ms)
    if a == 0:
        return "0 ms"
    if a >= 3 * 3_600_000:
        return f"{ms / 3_600_000:,.1f} h"
    if a >= 120_000:  # "7.0 min", not "422,674.9 ms" or "422.67 s"
        return f"{ms / 60_000:,.1f} min"
    if a >= 1_000:
        return f"{ms / 1000:,.2f} s"
    if a >= 10:
        return f"{ms:,.1f} ms"
    if a >= 1:
        return f"{ms:.2f} ms"
    if a >= 0.01:
        return f"{ms:.3f} ms"
    if a * 1000 < 0.005:
        return "< 0.01 µs"
    return f"{ms * 1000:.2f} µs"


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} B"


def fmt_bandwidth(bytes_per_s: float | None) -> str:
    """Link bandwidth in decimal GB/s, the unit PCIe/NVLink peaks are quoted in."""
    if bytes_per_s is None:
        return "-"
    gb = bytes_per_s / 1e9
    return f"{gb:,.1f} GB/s" if gb >= 1 else f"{gb:.3f} GB/s"


def fmt_tokens(n: int | None) -> str:
    return "-" if n is None else f"{int(n):,}"


def fmt_pct(share: float | None) -> str:
    if share is None:
        return "-"
    pct = share * 100
    if pct == 0:
        return "0 %"
    if abs(pct) < 0.05:  # a sliver is not zero: never "0.0 %" beside a "0 %"
        return "< 0.1 %"
    if 99.5 <= pct < 100:  # nearly all is not all: never "100 %" beside a "0.5 %"
        return f"{pct:.1f} %" if pct < 99.95 else "> 99.9 %"
    return f"{pct:.0f} %" if abs(pct) >= 1 else f"{pct:.1f} %"


def fmt_rate(per_s: float | None, what: str = "") -> str:
    if per_s is None:
        return "-"
    suffix = f" {what}/s" if what else "/s"
    return f"{per_s:,.1f}{suffix}" if per_s >= 1 else f"{per_s:.3f}{suffix}"


def share(part: float | None, whole: float | None) -> float | None:
    """part/whole, None when undefined (never a ZeroDivisionError in a report)."""
    if part is None or not whole:
        return None
    return part / whole


def fmt_value(key: str, value) -> str:
    """Format an evidence value by the unit its JSON key ends with (`*_ms`, `*_bytes`, ...)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "-"
    if not isinstance(value, (int, float)):
        return str(value)
    if key.endswith("_ms") and (key.startswith("t_") or key.startswith("arrival")):
        # A moment, not a span: seconds to the ms, so two events a few ms apart stay apart.
        return f"{value / 1000:,.3f} s"
    if key.endswith("_ms"):
        return fmt_ms(value * NS_PER_MS)
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key.endswith("_bytes_per_s"):
        return fmt_bandwidth(value)
    if key.endswith("_share"):
        return fmt_pct(value)
    if key.endswith("_per_s"):
        return fmt_rate(value)
    if isinstance(value, float):
        return f"{value:,.3g}"
    return f"{value:,}"


def fmt_pool(tokens: int | None, kv_bytes_per_token: int | None) -> str:
    """A KV pool as tokens and binary GiB at the model's KV size: "821,632 tokens (100.3 GiB)"."""
    if tokens is None:
        return "-"
    if not kv_bytes_per_token:
        return f"{int(tokens):,} tokens"
    return f"{int(tokens):,} tokens ({fmt_bytes(tokens * kv_bytes_per_token)})"
