"""`calibrate --from`'s terminal view: the fitted clock, what was kept and why, the held-out check."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from tierdiag.config.profile import CLOCK_PARAMS
from tierdiag.diagnose.twin.calibrate import HOLDOUT_SPLIT, WIDE_REL_HALF_WIDTH, Calibration
from tierdiag.report.terminal import new_table, plain


def _value(v: float, unit: str) -> str:
    if unit == "B/s":
        return f"{v / 1e9:,.3f} GB/s"
    if v >= 1e6:
        return f"{v / 1e6:,.3f} ms"
    if v >= 1e3:
        return f"{v / 1e3:,.3f} us"
    return f"{v:,.4g} ns"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def render_calibration(c: Calibration, console: Console, *, profile_path: str) -> None:
    u = c.usable
    console.print(Text.assemble(
        "clock fitted to ", plain(f"{c.source_kind} run {c.source_run} ({c.source_run_name})", "bold"),
        plain(f" under {c.geometry.model} on {c.geometry.gpu} (layers, KV bytes; kept values come from them)")))
    excluded = "; ".join(f"{n:,} {why}" for why, n in u.excluded.items())
    console.print(plain(f"usable: {u.prefill_requests:,} of {u.num_requests:,} timed requests for prefill "
                        f"({len(u.prefill.observed_ns):,} batches that ran alone, up to 4 requests)"
                        + (f"; left out: {excluded}" if excluded else "")
                        + f"; {len(u.decode_ns):,} for decode (decoded alone)"))
    t = new_table("clock (± : 95 % interval, from the Jacobian at the solution)")
    for col in ("parameter", "value", "±", "how"):
        t.add_column(col, justify="left" if col in ("parameter", "how") else "right", no_wrap=col != "how")
    for name in CLOCK_PARAMS:
        p = c.params[name]
        unit = CLOCK_PARAMS[name][0]
        if p.fitted:
            hw = p.rel_half_width
            wide = hw is not None and hw > WIDE_REL_HALF_WIDTH
            t.add_row(name, _value(p.value, unit), _pct(hw), plain(f"fitted, {p.support} points" + (" · wide" if wide else ""),
                                                                  "yellow" if wide else ""))
        else:
            t.add_row(name, _value(p.value, unit), "", plain("kept from the preset", "yellow"))
    console.print(t)
    for name in c.kept:
        console.print(plain(f"  {name} kept: {c.params[name].reason}", "dim"))
    h, hp, hd = c.heldout_prefill, c.heldout_prefill_preset, c.heldout_decode
    if h.num_points:
        console.print(plain(f"held-out check (fitted on the first {HOLDOUT_SPLIT:.0%} by arrival, measured on the "
                            f"other {h.num_points:,} batches): prefill error median {_pct(h.median_rel_error)}, "
                            f"p90 {_pct(h.p90_rel_error)} (the presets': median {_pct(hp.median_rel_error)}, "
                            f"p90 {_pct(hp.p90_rel_error)})"))
    if hd.num_points:
        console.print(plain(f"decode, held out ({hd.num_points:,} requests that decoded alone): error median "
                            f"{_pct(hd.median_rel_error)}, p90 {_pct(hd.p90_rel_error)}"))
    if c.wide:
        scatter = c.prefill_fit.scatter
        console.print(plain(f"wide intervals (more than ±{WIDE_REL_HALF_WIDTH:.0%}): {', '.join(c.wide)}; the "
                            f"timings scatter {_pct(scatter)} (median) around the model — noise the model does "
                            "not explain; more usable requests narrow them", "yellow"))
    for w in c.warnings:
        console.print(plain(f"warning: {w}", "yellow"))
    console.print(plain(f"fit took {c.fit_s * 1e3:,.0f} ms · profile written to {profile_path}  "
                        f"(use: tierdiag replay TRACE --profile {profile_path})"))
