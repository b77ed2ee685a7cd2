"""How far a replayed twin's TTFTs are from its server's, and which clock the twin ran on.

Read by `compare OBSERVED TWIN [TWIN2 ...]` (a preset twin's error beside a calibrated one's),
`explain` of an observed request (its own twin's error: how far to trust steps 3-4) and the
tests of `calibrate --from`. No numpy, no scipy: `compare` and `explain` start light.

    twin_error(con, observed, twin) -> TwinError: per server hit class and "all", median and p90
                                       (nearest rank) of |twin - server| in ms and relative; and
                                       the same per the server's data-parallel rank (`dp_rank`)
    twin_clock(run)                 -> one line: the presets' clock, or calibrated on which run
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierdiag.config.profile import provenance_line
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.diagnose.read.observed import twin_pairs


@dataclass(frozen=True)
class ClassError:
    hit_class: str  # the server's class of the request (device_hit | tiered_hit | miss), or "all"
    num_requests: int
    median_abs_ms: float | None
    p90_abs_ms: float | None
    median_rel: float | None
    p90_rel: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RankError:
    """The twin's error over the requests one data-parallel rank of the server served."""

    dp_rank: int  # the server's rank (its export's dp_rank)
    num_requests: int
    median_abs_ms: float | None
    p90_abs_ms: float | None
    median_rel: float | None
    p90_rel: float | None
    same_rank: int  # of them, requests the twin's router also sent to this rank

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TwinError:
    observed_run: str
    twin_run: str
    classes: tuple[ClassError, ...]  # "all" first, then by class
    unmatched: int  # observed requests with a TTFT and no finished twin with one
    ranks: tuple[RankError, ...] = ()  # by the server's dp_rank, in rank order; () where it names none

    def by_class(self) -> dict[str, ClassError]:
        return {c.hit_class: c for c in self.classes}

    def by_rank(self) -> dict[int, RankError]:
        return {r.dp_rank: r for r in self.ranks}

    def to_json(self) -> dict:
        return {"observed_run": self.observed_run, "twin_run": self.twin_run, "unmatched": self.unmatched,
                "classes": [c.to_json() for c in self.classes], "ranks": [r.to_json() for r in self.ranks]}


def twin_error(con, observed_run: str, twin_run: str) -> TwinError:
    """TTFT error of `twin_run` against `observed_run`, request by request (same req_id): median and
    p90 (nearest rank) of |twin - server| in ms and relative to the server's TTFT, for every
    request and per the server's hit class. Requests without a TTFT on either side are left out."""
    rows = twin_pairs(con, observed_run, twin_run)
    pairs = [(c or "unknown", o, t, orank, trank) for c, o, t, orank, trank in rows if t is not None]
    classes = [("all", pairs)] + [(k, [p for p in pairs if p[0] == k]) for k in sorted({p[0] for p in pairs})]

    def stats(ps: list) -> tuple:
        ab = sorted(abs(p[2] - p[1]) / 1e6 for p in ps)
        rel = sorted(abs(p[2] - p[1]) / p[1] for p in ps)
        return (len(ps), nearest_rank(ab, 0.5, presorted=True), nearest_rank(ab, 0.9, presorted=True),
                nearest_rank(rel, 0.5, presorted=True), nearest_rank(rel, 0.9, presorted=True))

    ranks = sorted({p[3] for p in pairs if p[3] is not None})
    by_rank = tuple(RankError(r, *stats(ps), sum(p[4] == r for p in ps))
                    for r in ranks for ps in [[p for p in pairs if p[3] == r]])
    return TwinError(observed_run, twin_run, tuple(ClassError(k, *stats(ps)) for k, ps in classes),
                     len(rows) - len(pairs), by_rank)


def twin_clock(config: dict[str, Any]) -> str:
    """Which clock a replay ran on, from its recorded config: the presets' (model on GPU), or the
    profile it was replayed with (config/profile.py's provenance line)."""
    line = provenance_line(config.get("profile_source"))
    if line is not None:
        return line
    return f"clock: the presets' ({config.get('model') or 'model not recorded'} on {config.get('gpu') or 'gpu not recorded'})"
