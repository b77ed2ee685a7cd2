"""`calibrate --from`: the cost model's clock fitted to an observed run's requests; the twin's error.

What a request's timings tell (an `observed` run, imported from SGLang's export; a replayed run
reads the same)::

    arrival ─ queue ─┬─ forward entry ──── prefill (+ exposed load-back) ──── first token ── decode ── finish
                     └ prefill_ns = first token - forward entry

- prefill: a request that did not queue and whose batch ran alone on the GPU (no other request's
  [forward entry, first token] overlaps it; requests of one batch share both stamps) is one
  *batch point*: its time is the cost model's batch time for its members' computed tokens, the
  prefixes they attend to, and their load-backs (host + storage tokens), overlapped layer by
  layer as the replay overlaps them. Batches of up to SMALL_BATCH requests are kept.
- decode: SGLang runs a decode step only when no prefill batch can be formed, one step for every
  running request at once, on the GPU's clock (the engine does the same): a request's first output
  token comes from its prefill, its other output - 1 come from decode steps, and step j
  (1..output - 1) reads the seq_len after its slot, input + j tokens, of this request. A step's
  time is `decode_step_ns` + `decode_ns_per_context_token` x the whole running batch's context,
  and a prefill batch that runs between two steps delays the rest. The export gives per request
  only its stamps (arrival, forward entry, first token, finish), not the steps it shared nor the
  others' context in them, so (finish - first token) is one point only for a request that
  decoded alone: no other request's busy span (forward entry, else arrival, to finish) on its
  data-parallel rank overlaps its decode window. Its time is then exactly
  (output - 1) x decode_step_ns + decode_ns_per_context_token x sum_j (input + j), and both
  parameters are fitted from such requests: the fixed part from their step counts, the
  per-token part from their prompt lengths (it is kept from the preset, and says so, when their
  prompts are too short for the KV read to show beside the noise). Requests that decoded beside
  others, and those with one output token (no step), are left out with the reason.

Held-out check: the points are fitted on the first HOLDOUT_SPLIT of them by arrival and the
error is measured on the rest; the profile holds exactly the parameters that were checked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from tierdiag.config.presets import model_preset
from tierdiag.config.profile import CLOCK_PARAMS, preset_clock
from tierdiag.diagnose.twin.fit import FitResult, ParamFit, relative_errors, robust_fit
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.diagnose.read.observed import calibration_columns
from tierdiag.diagnose.twin.twin_error import ClassError, TwinError, twin_error  # noqa: F401 - the twin's error, here for calibrate's callers
from tierdiag.engine.costmodel import RUN_OVERHEAD_NS, SEGMENT_OVERHEAD_NS

HOLDOUT_SPLIT = 0.7  # fit on the first 70 % by arrival, measure on the rest
SMALL_BATCH = 4
# SGLang's scheduler picks up an arrival within one loop iteration (well under this) when the GPU
# is idle: a longer queue_time waited behind other work, and its batch was likely not its own.
QUEUE_FREE_NS = 2_000_000
# Stamps of one batch's requests are written one after the other: within this they are one batch;
# beyond it, two events (the replay's are exact).
SAME_INSTANT_NS = 50_000
WIDE_REL_HALF_WIDTH = 0.05  # an interval wider than +-5 % is called wide

# In the order the fit would rather keep them free, when the data cannot tell two apart (one
# load-back size: bandwidth and per-transfer overhead are the same to it).
PREFILL_PARAMS = ("prefill_ns_per_token", "prefill_ns_per_token_pair", "h2d_bytes_per_s", "prefill_floor_ns",
                  "batch_overhead_ns", "transfer_overhead_ns")
DECODE_PARAMS = ("decode_step_ns", "decode_ns_per_context_token")
NOT_OBSERVABLE = {"d2h_bytes_per_s": "backups to host never show in a request's time"}


@dataclass(frozen=True)
class Geometry:
    """What of the replay's config the clock is fitted under (the profile's model and GPU)."""
    model: str
    gpu: str
    page_size: int = 64
    max_prefill_tokens: int = 16384
    layerwise_overlap: bool = True


@dataclass(frozen=True)
class PrefillPoints:
    """One entry per usable batch."""
    tokens: np.ndarray  # sum of computed tokens
    pairs: np.ndarray  # sum of computed x (prefix + computed / 2): the attention work
    loaded: np.ndarray  # [batch, member] host + storage tokens loaded back (0: none)
    observed_ns: np.ndarray
    arrival_ns: np.ndarray  # the batch's first arrival (held-out split)
    num_requests: np.ndarray


@dataclass(frozen=True)
class Usable:
    prefill: PrefillPoints
    decode_steps: np.ndarray  # output - 1 per request that decoded alone
    decode_context: np.ndarray  # the context tokens its steps read, summed over its steps
    decode_ns: np.ndarray  # finish - first token
    decode_arrival_ns: np.ndarray
    num_requests: int  # finished requests with the timings a fit needs
    prefill_requests: int
    excluded: dict[str, int]  # reason -> requests left out of the prefill fit
    decode_excluded: dict[str, int]


@dataclass(frozen=True)
class HeldOut:
    num_points: int
    median_rel_error: float | None
    p90_rel_error: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Calibration:
    source_run: str
    source_run_name: str
    source_db: str
    source_kind: str
    geometry: Geometry
    params: dict[str, ParamFit]  # every clock parameter, fitted or kept
    usable: Usable
    prefill_fit: FitResult
    decode_fit: FitResult
    heldout_prefill: HeldOut
    heldout_decode: HeldOut
    heldout_prefill_preset: HeldOut  # the presets' error on the same held-out points
    fit_s: float
    warnings: list[str] = field(default_factory=list)

    @property
    def clock(self) -> dict[str, float]:
        return {k: self.params[k].value for k in CLOCK_PARAMS}

    @property
    def kept(self) -> list[str]:
        return [k for k in CLOCK_PARAMS if not self.params[k].fitted]

    @property
    def wide(self) -> list[str]:
        return [k for k, p in self.params.items() if p.fitted and (p.rel_half_width or 0) > WIDE_REL_HALF_WIDTH]

    def profile_fit_table(self) -> dict:
        """The profile's [fit] table: provenance (TOML has no null: unknowns are left out)."""
        d = {"source_run": self.source_run, "source_run_name": self.source_run_name, "source_db": self.source_db,
             "source_kind": self.source_kind, "usable_requests": self.usable.prefill_requests,
             "usable_batches": int(len(self.usable.prefill.observed_ns)),
             "usable_decode_requests": int(len(self.usable.decode_ns)),
             "observed_requests": self.usable.num_requests, "holdout_split": HOLDOUT_SPLIT,
             "fitted": [k for k in CLOCK_PARAMS if self.params[k].fitted], "kept_from_preset": self.kept,
             "kept_reasons": {k: self.params[k].reason or "" for k in self.kept},
             "intervals_95": {k: [p.low, p.high] for k, p in self.params.items() if p.fitted},
             "page_size": self.geometry.page_size, "layerwise_overlap": self.geometry.layerwise_overlap}
        for name, h in (("heldout_prefill", self.heldout_prefill), ("heldout_decode", self.heldout_decode),
                        ("heldout_prefill_preset", self.heldout_prefill_preset)):
            d[f"{name}_points"] = h.num_points
            if h.median_rel_error is not None:
                d[f"{name}_median_rel_error"] = h.median_rel_error
                d[f"{name}_p90_rel_error"] = h.p90_rel_error
        for name, f in (("prefill", self.prefill_fit), ("decode", self.decode_fit)):
            if f.scatter is not None:
                d[f"{name}_scatter"] = f.scatter
        return d

    def to_json(self) -> dict:
        u = self.usable
        return {"source_run": self.source_run, "source_run_name": self.source_run_name, "source_db": self.source_db,
                "source_kind": self.source_kind, "model": self.geometry.model, "gpu": self.geometry.gpu,
                "geometry": dict(self.geometry.__dict__),
                "params": [self.params[k].to_json() | {"unit": CLOCK_PARAMS[k][0]} for k in CLOCK_PARAMS],
                "usable": {"observed_requests": u.num_requests, "prefill_requests": u.prefill_requests,
                           "prefill_batches": int(len(u.prefill.observed_ns)),
                           "decode_requests": int(len(u.decode_ns)),
                           "prefill_excluded": u.excluded, "decode_excluded": u.decode_excluded},
                "heldout": {"split": HOLDOUT_SPLIT, "prefill": self.heldout_prefill.to_json(),
                            "prefill_preset": self.heldout_prefill_preset.to_json(),
                            "decode": self.heldout_decode.to_json()},
                "scatter": {"prefill": self.prefill_fit.scatter, "decode": self.decode_fit.scatter},
                "kept_from_preset": self.kept, "wide": self.wide, "fit_s": self.fit_s, "warnings": self.warnings}


# --- the models, vectorised (engine/costmodel.py's, term by term; tests check them against it) ---


def prefill_model(points: PrefillPoints, g: Geometry):
    m = model_preset(g.model)
    layers, kvb, ps = m.num_layers, m.kv_bytes_per_token, g.page_size

    def model(c) -> np.ndarray:
        compute = np.maximum(c["prefill_ns_per_token"] * points.tokens + c["prefill_ns_per_token_pair"] * points.pairs,
                             c["prefill_floor_ns"]) + c["batch_overhead_ns"]
        h = points.loaded
        # CostModel.copy_ns per member, one run of slots each (the export does not say how many)
        per = np.where(h > 0, c["transfer_overhead_ns"] + kvb * h / c["h2d_bytes_per_s"] * 1e9
                       + layers * (SEGMENT_OVERHEAD_NS * h / ps + RUN_OVERHEAD_NS), 0.0)
        load = per.sum(axis=1)
        if not g.layerwise_overlap:
            return load + compute
        pl, pc = load / layers, compute / layers  # CostModel.overlapped_ns
        return np.where(load > 0, pl + (layers - 1) * np.maximum(pl, pc) + pc, compute)

    return model


def decode_model(steps: np.ndarray, context: np.ndarray):
    """A request's decode time: its steps, each CostModel.decode_step_ns of the context it reads."""
    def model(c) -> np.ndarray:
        return c["decode_step_ns"] * steps + c["decode_ns_per_context_token"] * context
    return model


# --- reading the run ---------------------------------------------------------------------------


def usable_points(con, run_id: str, g: Geometry) -> Usable:
    rows = calibration_columns(con, run_id)._asdict()
    # NULL -> NaN (float): a column the server did not report leaves its requests out below
    col = {k: v.astype(float).filled(np.nan) if np.ma.isMaskedArray(v) else np.asarray(v, dtype=float)
           for k, v in rows.items()}  # (an integer column cannot hold NaN: float first)
    n = len(col["arrival_ns"])
    arrival, first = col["arrival_ns"], col["first_token_ns"]
    entry = first - col["prefill_ns"]
    prefix = col["device_hit_tokens"] + col["host_hit_tokens"] + col["storage_hit_tokens"]
    computed = col["computed_tokens"]
    loaded = col["host_hit_tokens"] + col["storage_hit_tokens"]
    excluded: dict[str, int] = {}

    def out(reason: str, count: int) -> None:
        if count:
            excluded[reason] = excluded.get(reason, 0) + count

    timed = np.isfinite(entry) & (col["prefill_ns"] > 0) & np.isfinite(prefix)
    out("no prefill timing or tier split", int((~timed).sum()))
    # Batches: requests whose forward entry and first token are the same instants.
    idx = np.flatnonzero(timed)
    order = idx[np.lexsort((entry[idx], first[idx]))]
    groups: list[list[int]] = []
    for i in order:
        if groups and abs(first[i] - first[groups[-1][0]]) <= SAME_INSTANT_NS \
                and abs(entry[i] - entry[groups[-1][0]]) <= SAME_INSTANT_NS:
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    # A batch ran alone when no other request's prefill span overlaps its own.
    starts = np.array([entry[g_].min() for g_ in groups]) if groups else np.empty(0)
    ends = np.array([first[g_].max() for g_ in groups]) if groups else np.empty(0)
    # Sorted by start, a batch overlaps another iff one before it ends after it starts, or the
    # next one starts before it ends.
    by_start = np.argsort(starts, kind="stable")
    s_, e_ = starts[by_start], ends[by_start]
    ended_before = np.concatenate(([-math.inf], np.maximum.accumulate(e_)[:-1])) if len(e_) else e_
    next_start = np.concatenate((s_[1:], [math.inf])) if len(s_) else s_
    alone = np.ones(len(groups), dtype=bool)
    alone[by_start] = ~((ended_before > s_ + SAME_INSTANT_NS) | (next_start < e_ - SAME_INSTANT_NS))
    tokens, pairs, loads, obs, arr, sizes = [], [], [], [], [], []
    for gi, members in enumerate(groups):
        k = len(members)
        if not alone[gi]:
            out("prefill overlapped another request's (mixed or chunked batches)", k)
            continue
        if k > SMALL_BATCH:
            out(f"in a batch of more than {SMALL_BATCH}", k)
            continue
        if np.any(~(col["queue_ns"][members] <= QUEUE_FREE_NS)):
            out(f"queued (more than {QUEUE_FREE_NS / 1e6:g} ms before its batch)", k)
            continue
        if np.any(computed[members] > g.max_prefill_tokens):
            out(f"chunked (more than {g.max_prefill_tokens:,} computed tokens)", k)
            continue
        nn, pp = computed[members], prefix[members]
        tokens.append(nn.sum())
        pairs.append((nn * (pp + nn / 2)).sum())
        loads.append(loaded[members])
        obs.append(ends[gi] - starts[gi])
        arr.append(arrival[members].min())
        sizes.append(k)
    width = max((len(x) for x in loads), default=1)
    loaded_m = np.zeros((len(loads), width))
    for i, x in enumerate(loads):
        loaded_m[i, :len(x)] = x
    points = PrefillPoints(np.array(tokens, dtype=float), np.array(pairs, dtype=float), loaded_m,
                           np.array(obs, dtype=float), np.array(arr, dtype=float), np.array(sizes, dtype=int))

    # Decode (the engine's and SGLang's: steps on the GPU's clock, interleaved with prefill batches;
    # see the module's docstring): a request whose decode window no other request's busy span
    # overlaps ran its output - 1 steps alone, each reading its own KV only.
    finish, outputs, inputs = col["finish_ns"], col["output_tokens"], col["input_tokens"]
    d_ok = np.isfinite(finish) & np.isfinite(inputs) & np.isfinite(outputs) & (finish > first)
    decode_excluded: dict[str, int] = {}

    def d_out(reason: str, count: int) -> None:
        if count:
            decode_excluded[reason] = decode_excluded.get(reason, 0) + count

    d_out("no decode timing", int((~d_ok).sum()))
    one = d_ok & (outputs < 2)
    d_out("no decode step (one output token: it comes from prefill)", int(one.sum()))
    # Every request's busy span: from its forward entry (its arrival where the entry is not
    # known: it may have prefilled any time after) to its finish (its first token if unfinished).
    busy_start = np.where(np.isfinite(entry), entry, arrival)
    busy_end = np.where(np.isfinite(finish), finish, first)
    known = np.isfinite(busy_start) & np.isfinite(busy_end)
    idx = np.flatnonzero(d_ok & ~one)
    lo, hi = first[idx] + SAME_INSTANT_NS, finish[idx] - SAME_INSTANT_NS
    # Data-parallel ranks are GPUs of their own: where every request names its rank, only its
    # rank's requests share its steps; else every request might.
    rank = col["dp_rank"]
    groups_d = rank if np.isfinite(rank).all() else np.zeros(n)
    overlapping = np.zeros(len(idx), dtype=int)
    for r in np.unique(groups_d[idx]):
        on = groups_d == r
        starts_sorted, ends_sorted = np.sort(busy_start[known & on]), np.sort(busy_end[known & on])
        sel = groups_d[idx] == r
        # Spans overlapping (lo, hi): those starting before hi less those ending by lo (a span
        # that ends by lo < hi started before hi), the request's own among them.
        overlapping[sel] = (np.searchsorted(starts_sorted, hi[sel], side="left")
                            - np.searchsorted(ends_sorted, lo[sel], side="right"))
    alone_d = (overlapping == 1) & (hi > lo)
    d_out("decoded beside another request (batched steps or a prefill between them: the steps' context "
          "and count are not its own)", int((~alone_d).sum()))
    keep = idx[alone_d]
    steps = outputs[keep] - 1
    # Step j (1..output - 1) reads input + j tokens (the seq_len after the step's slot).
    context = steps * inputs[keep] + steps * (steps + 1) / 2
    return Usable(points, np.array(steps, dtype=float), np.array(context, dtype=float),
                  np.array(finish[keep] - first[keep], dtype=float), np.array(arrival[keep], dtype=float),
                  n, int(points.num_requests.sum()), excluded, decode_excluded)


# --- the fit -----------------------------------------------------------------------------------


def _split(arrival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(arrival, kind="stable")
    cut = math.ceil(HOLDOUT_SPLIT * len(order))
    return order[:cut], order[cut:]


def _subset(p: PrefillPoints, idx: np.ndarray) -> PrefillPoints:
    return PrefillPoints(p.tokens[idx], p.pairs[idx], p.loaded[idx], p.observed_ns[idx], p.arrival_ns[idx],
                         p.num_requests[idx])


def _heldout(predicted: np.ndarray, observed: np.ndarray) -> HeldOut:
    if not len(observed):
        return HeldOut(0, None, None)
    e = sorted(relative_errors(predicted, observed).tolist())
    return HeldOut(len(e), nearest_rank(e, 0.5, presorted=True), nearest_rank(e, 0.9, presorted=True))


def calibrate_run(con, run, g: Geometry, *, db_label: str) -> Calibration:
    """Fit the clock to `run` (a RunInfo) of the open store `con` under the presets in `g`."""
    t0 = time.perf_counter()
    preset = preset_clock(g.model, g.gpu)
    u = usable_points(con, run.run_id, g)
    pts = u.prefill

    train, test = _split(pts.arrival_ns)
    fit_pts = _subset(pts, train)
    p_preset = {k: preset[k] for k in PREFILL_PARAMS}
    model = prefill_model(fit_pts, g)
    # Starts besides the presets: the floor at the shortest batches seen (the floor holds a
    # batch's time flat whatever its tokens), and a link 4x slower or faster.
    starts = []
    no_load = fit_pts.loaded.sum(axis=1) == 0
    if no_load.any():
        floor = float(np.min(fit_pts.observed_ns[no_load])) - preset["batch_overhead_ns"]
        if floor > 0:
            starts.append({"prefill_floor_ns": floor})
    starts += [{"h2d_bytes_per_s": preset["h2d_bytes_per_s"] * f} for f in (0.25, 4.0)]
    has_load = bool((fit_pts.loaded > 0).any())
    no_support = {"h2d_bytes_per_s": "no usable request loaded tokens back from host",
                  "transfer_overhead_ns": "no usable request loaded tokens back from host"} if not has_load else {
        "h2d_bytes_per_s": "no usable request's load-back showed in its time (all hidden behind compute)",
        "transfer_overhead_ns": "too small to show in any usable request's time"}
    no_support["prefill_floor_ns"] = "no usable batch was short enough to run at the floor"
    pf = robust_fit(model, fit_pts.observed_ns, p_preset, list(PREFILL_PARAMS), starts, no_support)

    d_train, d_test = _split(u.decode_arrival_ns)
    d_preset = {k: preset[k] for k in DECODE_PARAMS}
    dm = decode_model(u.decode_steps[d_train], u.decode_context[d_train])
    df = robust_fit(dm, u.decode_ns[d_train], d_preset, list(DECODE_PARAMS),
                    no_support_reason={"decode_ns_per_context_token": "the KV read never showed in a decode time "
                                       "(the prompts of the requests that decoded alone too short)"})

    params: dict[str, ParamFit] = {**pf.params, **df.params}
    for k, why in NOT_OBSERVABLE.items():
        params[k] = ParamFit(k, preset[k], False, reason=why)
    test_pts = _subset(pts, test)
    values = {k: params[k].value for k in PREFILL_PARAMS}
    held = _heldout(prefill_model(test_pts, g)(values), test_pts.observed_ns)
    held_preset = _heldout(prefill_model(test_pts, g)(p_preset), test_pts.observed_ns)
    dvalues = {k: params[k].value for k in DECODE_PARAMS}
    held_d = _heldout(decode_model(u.decode_steps[d_test], u.decode_context[d_test])(dvalues), u.decode_ns[d_test])

    warnings = []
    if not len(pts.observed_ns):
        warnings.append("no usable prefill batch (every request queued, shared a larger batch, or lacks timings): "
                        "the prefill clock is the preset's")
    if held.num_points == 0 and len(pts.observed_ns):
        warnings.append("too few usable batches to hold any out: no held-out error")
    return Calibration(run.run_id, run.name, db_label, run.kind, g, {k: params[k] for k in CLOCK_PARAMS}, u, pf, df,
                       held, held_d, held_preset, time.perf_counter() - t0, warnings)
