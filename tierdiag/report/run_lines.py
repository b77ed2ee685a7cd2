"""What a run is, in the lines `summary`, `runs` and the report head it with: its pools as
recorded and the SGLang rules it followed (its KV memory per rank: diagnose.comparison.compare.run_kv_memory)."""

from __future__ import annotations

POOL_TIERS = ("device", "host", "storage")


def pool_sizes(config: dict, data_plane: dict) -> dict[str, dict[str, int | None]]:
    """A run's pools as recorded: tier -> tokens and modelled bytes (None when the run did not
    record its KV size per token). Tiers of size 0 (no storage tier) are left out."""
    kv = data_plane.get("kv_bytes_per_token")
    kv = kv if isinstance(kv, int) and not isinstance(kv, bool) else None
    return {tier: {"tokens": config[f"{tier}_tokens"], "bytes": config[f"{tier}_tokens"] * kv if kv else None}
            for tier in POOL_TIERS
            if isinstance(config.get(f"{tier}_tokens"), int) and config[f"{tier}_tokens"] > 0}


def rules_line(run) -> str | None:
    """`sglang 0.5.23`: the SGLang release whose rules a replay followed (`sglang_rules`); a replay
    recorded before rule sets existed followed 0.5.9's, and says so. None for an imported run (a
    server's own numbers: no engine rules)."""
    from tierdiag.config.releases import RELEASES, release_before
    from tierdiag.diagnose.read.run import parse

    run = parse(run)
    version = run.rules
    if version is None:
        return None
    back = run.switched_back  # `replay --sglang OLD,NEW`'s runs of one rule switched back
    if back and version in RELEASES and release_before(version):
        return f"sglang {version} with {back.replace(',', ', ')} as {release_before(version)}"
    return f"sglang {version}" + ("" if run.rules_recorded else " (recorded before rule sets)")

