"""A run's KV memory in modelled bytes (KvMemory): what `summary`, `runs`, `compare` and the report
state beside the pool sizes. A module of its own so that `summary` reads it without loading
compare.py's modules (start-up)."""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.diagnose.read.kind import view_of


@dataclass(frozen=True)
class KvMemory:
    """A run's KV capacity in modelled bytes, as SGLang allocates it: with `dp` data-parallel
    ranks each rank (a scheduler process beside its GPU) has its own device and host pools; the
    storage tier is one, shared by every rank (docs/contract.md "Deployments")."""

    ranks: int
    rank_bytes: int  # one rank's device + host pools
    storage_bytes: int  # the storage tier, once
    total_bytes: int  # ranks x rank_bytes + storage_bytes

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def words(self) -> str:
        """"240.0 GiB in all: 4 ranks x 60.0 GiB (each its own device + host pools)" (+ storage)."""
        from tierdiag.units import fmt_bytes

        storage = f" + {fmt_bytes(self.storage_bytes)} of storage, shared" if self.storage_bytes else ""
        if self.ranks == 1:
            return f"{fmt_bytes(self.total_bytes)}" + (f" (device + host {fmt_bytes(self.rank_bytes)}{storage})"
                                                      if storage else "")
        return (f"{fmt_bytes(self.total_bytes)} in all: {self.ranks} ranks × {fmt_bytes(self.rank_bytes)} "
                f"(each its own device + host pools){storage}")


def kv_memory(config: dict, kv_bytes_per_token: int | None = None) -> KvMemory | None:
    """The run's KV capacity per rank and in all (KvMemory), at `kv_bytes_per_token` (None: the
    model preset's); None where the model or the device pool is not known."""
    if not kv_bytes_per_token:
        from tierdiag.config.presets import MODELS

        model = MODELS.get(config.get("model") or "")
        kv_bytes_per_token = model.kv_bytes_per_token if model is not None else None
    if not kv_bytes_per_token or not isinstance(config.get("device_tokens"), int):
        return None
    ranks = config.get("dp")
    ranks = ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1 else 1
    rank = sum(int(config.get(f"{t}_tokens") or 0) for t in ("device", "host")) * kv_bytes_per_token
    storage = int(config.get("storage_tokens") or 0) * kv_bytes_per_token
    return KvMemory(ranks, rank, storage, ranks * rank + storage)


def run_kv_memory(run) -> KvMemory | None:
    """A recorded run's KvMemory at its recorded KV size per token; None for an imported run or
    one that did not record it."""
    kv = run.data_plane.get("kv_bytes_per_token") if isinstance(run.data_plane, dict) else None
    kv = kv if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 else None
    if kv is None or not view_of(run).engine_parts:
        return None
    return kv_memory(run.config, kv)
