"""The text view of a replay (app.replay.ReplayResult): its closing table, the clock it ran on,
where its storage files are, and the `next:` hints. `--json` prints the result's own view."""

from __future__ import annotations

from tierdiag.cli.common import db_option
from tierdiag.cli.sink import renders
from tierdiag.config.engine import EngineConfig
from tierdiag.config.presets import MODELS, model_preset
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct, fmt_pool


def _fmt_tokens(n: int, total: int) -> str:
    return f"{n:,} ({fmt_pct(n / total)})" if total else f"{n:,}"


def _storage_line(s) -> str:
    """Where the storage tier's page files are and how big: they outlive the replay."""
    size = fmt_bytes(s.storage_bytes)
    if s.storage_dir is None:
        return f"storage tier: {size} of page files in a temporary folder, removed (nothing was recorded)"
    return f"storage tier: {size} of page files in {s.storage_dir}"


def reject_line(kind: str, n: int, cfg: EngineConfig) -> str:
    """One kind of rejection, its count and the option that changes it (engine.scheduler.reject_kind)."""
    if kind == "context_length":
        context = cfg.resolved_max_context()
        by_context: dict[int, list[str]] = {}
        for m in MODELS.values():
            if m.max_context_tokens > context:
                by_context.setdefault(m.max_context_tokens, []).append(m.name)
        presets = "".join(f" or --model {'|'.join(names)} ({c:,})" for c, names in sorted(by_context.items()))
        whose = "the --max-context" if cfg.max_context_tokens is not None else f"{cfg.model}'s"
        return f"context_length {n:,}: over {whose} {context:,}-token context · --max-context N{presets}"
    if kind == "session_ended":
        return f"session_ended {n:,}: later turns of those sessions (a closed-loop session ends at a rejected turn)"
    if kind == "device_memory":
        return f"device_memory {n:,}: larger than the whole device pool · --device-tokens N"
    return f"{kind} {n:,}"


REJECT_ORDER = ("context_length", "device_memory", "session_ended")  # causes before what follows from them


@renders("tierdiag.app.replay.ReplayResult")
def render_replay(s, out, *, cfg: EngineConfig) -> None:
    from rich.table import Table
    from rich.text import Text

    total = s.input_tokens
    from tierdiag.report.terminal import plain, requests_line

    table = Table(title=plain(f"replay {s.run_name}: {requests_line(s.num_requests + s.num_rejected, s.num_rejected)}"
                              + f" in {s.wall_s:.1f} s wall ({fmt_ms(s.virtual_s * 1e9)} virtual)"), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    kv = model_preset(cfg.model).kv_bytes_per_token
    table.add_row("pools", f"device {fmt_pool(cfg.resolved_device_tokens(), kv)}, "
                           f"host {fmt_pool(cfg.resolved_host_tokens(), kv)}"
                  + (f", storage {fmt_pool(cfg.storage_tokens, kv)}" if cfg.storage_tokens else ""))
    table.add_row("input tokens", f"{total:,}")
    table.add_row("device hit", _fmt_tokens(s.device_tokens, total))
    table.add_row("host hit (loaded back)", _fmt_tokens(s.host_tokens, total))
    table.add_row("storage hit (fetched)", _fmt_tokens(s.storage_tokens, total))
    table.add_row("computed", _fmt_tokens(s.computed_tokens, total)
                  + (f", of which {s.recomputed_tokens:,} were cached once" if s.recomputed_tokens else ""))
    lb = f"{s.load_backs:,} ({s.load_back_bytes / 2**30:,.1f} GiB)"
    if s.load_back_p50_ms is not None:
        lb += f", p50 {fmt_ms(s.load_back_p50_ms * 1e6)}, p99 {fmt_ms(s.load_back_p99_ms * 1e6)}"
    table.add_row("load-backs", lb)
    kinds = sorted(s.rejected, key=lambda k: REJECT_ORDER.index(k) if k in REJECT_ORDER else len(REJECT_ORDER))
    for i, kind in enumerate(kinds):
        table.add_row("" if i else "rejected", reject_line(kind, s.rejected[kind], cfg))
    table.add_row("skipped", ", ".join(f"{k}: {v:,}" for k, v in sorted(s.skipped.items())) or "none")
    table.add_row("evictions", ", ".join(f"{k}: {v:,}" for k, v in sorted(s.evictions.items())) or "none")
    if s.ttft_p50_ms is not None:
        table.add_row("TTFT", "  ".join(f"{q} {fmt_ms(v * 1e6)}" for q, v in (
            ("p50", s.ttft_p50_ms), ("p90", s.ttft_p90_ms), ("p99", s.ttft_p99_ms))))
    table.add_row("GPU busy in prefill", f"{fmt_pct(s.prefill_busy_share)} of the run's {fmt_ms(s.virtual_s * 1e9)} "
                                         "(first arrival to last finish)")
    dp = s.data_plane
    if dp.get("reduced_width"):
        table.add_row("data plane", f"reduced width: {dp['page_bytes']:,} B/page real vs "
                                    f"{dp['modelled_page_bytes']:,} B/page modelled (timing from the cost model)")
    table.caption = "sizes in GiB (2^30 bytes) · percentiles by nearest rank, as in `tierdiag summary`"
    out.print(table)
    if cfg.profile:  # which clock the times come from
        from tierdiag.config.profile import provenance_line

        out.print(provenance_line(cfg.to_json()["profile_source"]), markup=False, highlight=False)
    if s.prefill_busy_share > 0.95:
        from tierdiag.cli.common import err

        err.print("tierdiag: note: the GPU was saturated by prefill, so TTFT is mostly queueing; "
                  "--time-scale 2 halves the request rate to study the cache rather than the overload")
    if cfg.storage_tokens:
        out.print(plain(_storage_line(s)))
    if s.run_id:
        out.print(Text.assemble("recorded run ", plain(s.run_id, "bold"), " in ", plain(s.db_path)))
        db = db_option(s.db_path)
        from tierdiag.cli.hints import slowest_request  # a real id: the hint runs as printed

        req = slowest_request(s.db_path, s.run_id)
        explain = f"   ·   tierdiag explain {req}{db}" if req else ""
        out.print(plain(f"next: tierdiag slow{db}{explain}   ·   tierdiag report{db}"))
