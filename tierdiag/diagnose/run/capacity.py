"""Capacity first: was the prefill GPU offered more work than it can do, whatever the cache did?

Each finished request offers its *ideal* prefill (`ideal_ttft_ns`: the cost model's price of
its genuinely new tokens, every reused or once-cached token device-resident, no queueing, so
recompute is excluded and a perfect cache could not lower it) at its arrival. Over a window of
W ns the GPU can do W ns of prefill; the offered load of the window is the ideal work arriving in
it over W::

    arrivals  |  x  x xx  x     x  xxxxxxx x  x   |
    window    [t, t + W)  slides by W / STEPS from the first arrival to W before the last
    load(t) = sum(ideal of arrivals in [t, t + W)) / W        > 1: the queue must grow

Where load > 1 the backlog grows by (load - 1) x W however well the cache works, so a queue
there is not the cache's doing and no cache setting removes it: only a lower rate (the replay's
`time_scale`) or more GPUs do.

A data-parallel run (`dp` ranks) can do N x W ns of prefill in a window: its loads are per rank,
the work over N x W, as if the router spread the arrivals evenly (a router that does not is seen
in the per-rank views, not here).

W is WINDOW_SERVICES of the run's median ideal prefill: long enough that one large request is
not "overload" on its own, short enough that hours of idle between bursts do not average a burst
away (a run-wide mean would).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.read.quantile import nearest_rank_index

from tierdiag.diagnose.read.run_context import ideal_arrivals

# The window holds this many median requests' worth of prefill.
WINDOW_SERVICES = 32
STEPS = 8  # window positions per window length
# Overload is named when the offered load exceeds the GPU in at least this share of the run.
MATERIAL_SHARE = 0.1
# The rate advised leaves the windows at the material quantile this loaded (headroom below 1).
TARGET_LOAD = 0.9


@dataclass(frozen=True)
class Capacity:
    """Offered prefill against one GPU over sliding windows (module doc)."""

    window_ns: int
    span_ns: int  # first to last arrival (the window positions cover it)
    overloaded_share: float  # of the positions, those whose offered load exceeds 1
    overload_factor: float | None  # mean offered load over the overloaded positions (e.g. 3.4)
    peak_load: float  # the largest window load
    material_load: float  # the load exceeded in MATERIAL_SHARE of the positions (their 90th percentile)
    mean_load: float  # offered work over the span (diluted by idle: for reference only)
    offered_ns: int  # total ideal prefill offered
    num_ranks: int = 1  # data-parallel ranks the loads are per (each load is per rank)

    @property
    def overloaded(self) -> bool:
        return self.overloaded_share >= MATERIAL_SHARE and (self.overload_factor or 0) > 1

    def time_scale_for(self, current: float) -> float:
        """The replay's time_scale under which overload is no longer material: the load that
        MATERIAL_SHARE of the windows exceed brought to TARGET_LOAD (arrivals spread by the
        factor, the work in a window falls by it). Not the peak: one burst would ask for a rate
        that idles the GPU the rest of the run."""
        return current * max(self.material_load / TARGET_LOAD, 1.0)


def _material(load) -> float:
    """The window load at the 1 - MATERIAL_SHARE quantile by nearest rank (quantile.py, the one
    percentile definition: a window's own load), as `nearest_rank(load.tolist(), q)` but by a
    partition: up to a million positions sorted as Python floats were most of this (issue 41)."""
    import numpy as np

    i = nearest_rank_index(len(load), 1 - MATERIAL_SHARE)
    return float(np.partition(load, i)[i])


def run_capacity(con: duckdb.DuckDBPyConnection, rid: str, num_ranks: int = 1, arrivals=None) -> Capacity | None:
    """None when no finished request has an ideal (an observed run, an empty one). `num_ranks`:
    the run's data-parallel ranks (loads per rank, module doc). `arrivals`: `ideal_arrivals`'s
    result from the caller (folded while recording: run/context_rows.py); None: queried."""
    import numpy as np

    r = ideal_arrivals(con, rid) if arrivals is None else arrivals
    arrival = np.asarray(r.arrival_ns, dtype=np.int64)
    ideal = np.asarray(r.ideal_ttft_ns, dtype=np.float64)
    if not len(arrival) or ideal.sum() <= 0:
        return None
    window = max(int(WINDOW_SERVICES * float(np.median(ideal))), 1)
    lo, hi = int(arrival[0]), int(arrival[-1])
    span = hi - lo
    step = max(window // STEPS, span // 1_000_000 + 1, 1)  # at most a million positions
    # Positions t = lo, lo + step, ... while the window [t, t + W] lies within the arrivals (a
    # window past the last arrival would count the run's end as idle); one window when the
    # arrivals span less than W.
    t = lo + np.arange(max(span - window, 0) // step + 1, dtype=np.int64) * step
    cum = np.concatenate([[0.0], np.cumsum(ideal)])
    work = cum[np.searchsorted(arrival, t + window, side="left")] - cum[np.searchsorted(arrival, t, side="left")]
    ranks = max(int(num_ranks), 1)
    load = work / (window * ranks)
    over = load > 1
    return Capacity(
        window_ns=window, span_ns=span, overloaded_share=float(over.mean()),
        overload_factor=float(load[over].mean()) if over.any() else None, peak_load=float(load.max()),
        # Nearest rank (quantile.py), the one percentile definition: a window's own load.
        material_load=_material(load),
        mean_load=float(ideal.sum() / (max(span, window) * ranks)), offered_ns=int(ideal.sum()), num_ranks=ranks)
