"""Robust fits of the cost model's clock to measured times: pure numbers in, parameters out.

`scipy.optimize.least_squares` with the soft-L1 loss: a request the model cannot explain (a
retraction, a GC pause, a mixed batch we could not tell apart) weighs like its absolute error,
not its square, so a few do not drag the clock. (statsmodels' RLM would do for the linear decode
fit, but the prefill model is not linear: a floor, and the load-back overlapped layer by layer.)

Each parameter is fitted as a multiple of its preset value (all unknowns near 1, whatever their
units) on relative residuals (model / observed - 1: a 50 ms and a 5 s prefill count alike).

Intervals (95 %), as `scipy.optimize.curve_fit` makes them from a least_squares result: the
covariance is s^2 (J^T J)^-1 with J the Jacobian at the solution as least_squares returns it
(for a robust loss, already rescaled by the loss's weights: Gauss-Newton on the robust cost),
s^2 = 2 cost / (m - p), the pseudo-inverse through the SVD; half-width = t(0.975, m - p) * sd.

A parameter is *determined* when at least MIN_SUPPORT points move by SENSITIVITY or more when it
moves by its preset value, and its interval is narrower than the value itself; otherwise it is left at its
preset value and named with the reason, and the others are fitted again without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from scipy import optimize, stats

LOSS = "soft_l1"
F_SCALE = 0.02  # residuals (relative) beyond ~2 % weigh linearly, not quadratically
SENSITIVITY = 0.005  # a point "depends on" a parameter when moving it moves the point by >= 0.5 %
MIN_SUPPORT = 3
MAX_REL_HALF_WIDTH = 1.0  # an interval wider than the value itself does not determine it
CONFIDENCE = 0.95
RANK_TOLERANCE = 1e-6
LOWEST_MULTIPLE = 1e-9  # of the preset: 0 itself would divide by zero (a bandwidth)

Model = Callable[[Mapping[str, float]], np.ndarray]


@dataclass(frozen=True)
class ParamFit:
    name: str
    value: float
    fitted: bool
    low: float | None = None  # 95 % interval (fitted only)
    high: float | None = None
    support: int = 0  # points that depend on it
    reason: str | None = None  # why it was kept at the preset

    @property
    def rel_half_width(self) -> float | None:
        if self.low is None or self.high is None or not self.value:
            return None
        return (self.high - self.low) / 2 / abs(self.value)

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "fitted": self.fitted, "low": self.low, "high": self.high,
                "rel_half_width": self.rel_half_width, "support": self.support, "reason": self.reason}


@dataclass(frozen=True)
class FitResult:
    params: dict[str, ParamFit]
    num_points: int
    scatter: float | None  # median |relative residual| on the points fitted (the noise left)

    def values(self) -> dict[str, float]:
        return {k: p.value for k, p in self.params.items()}


def relative_errors(predicted: np.ndarray, observed: np.ndarray) -> np.ndarray:
    return np.abs(predicted - observed) / observed


def robust_fit(model: Model, observed: np.ndarray, preset: Mapping[str, float], free: list[str],
               starts: list[Mapping[str, float]] | None = None,
               no_support_reason: Mapping[str, str] | None = None) -> FitResult:
    """Fit the `free` parameters of `model` (the others stay at `preset`) to `observed` (> 0).

    `starts`: starting values to try besides the preset (the model has kinks: a floor, the
    overlap's max; the fit with the least robust cost wins). `no_support_reason`: what to say
    for a parameter no point depends on at all (e.g. "no usable request loaded from host")."""
    observed = np.asarray(observed, dtype=float)
    m = len(observed)
    no_support_reason = no_support_reason or {}
    free = [k for k in free if preset[k] > 0]
    kept: dict[str, ParamFit] = {}
    while True:
        if not free:
            break
        if m < len(free) + 2:  # no degrees of freedom left for an interval
            reason = "no usable point" if m == 0 else f"{m} usable point{'s' if m != 1 else ''}, too few"
            for k in free:
                kept[k] = ParamFit(k, preset[k], False, reason=reason)
            free = []
            break
        x, res = _solve(model, observed, preset, free, starts or [])
        values = {**preset, **{k: xk * preset[k] for k, xk in zip(free, x)}}
        support = _support(model, observed, values, preset, free)
        half = _half_widths(res, m, len(free))
        rels = [half[i] / x[i] if x[i] > 0 else math.inf for i in range(len(free))]
        thin = [i for i in range(len(free)) if support[i] < MIN_SUPPORT]
        loose = [i for i in range(len(free)) if not rels[i] < MAX_REL_HALF_WIDTH]
        # Drop one at a time: first the one fewest points depend on, else the loosest; ties go
        # to the later in `free` (the caller lists the parameters it would rather keep first).
        if thin:
            worst = min(thin, key=lambda i: (support[i], -i))
        elif loose:
            worst = max(loose, key=lambda i: (rels[i], i))
        else:
            worst = None
        if worst is None:
            fitted = {}
            for i, k in enumerate(free):
                hw = half[i] * preset[k]
                fitted[k] = ParamFit(k, values[k], True, values[k] - hw, values[k] + hw, int(support[i]))
            resid = model(values) / observed - 1
            return FitResult({k: fitted.get(k) or kept.get(k) or ParamFit(k, preset[k], False)
                              for k in preset}, m, float(np.median(np.abs(resid))) if m else None)
        k = free.pop(worst)
        s = int(support[worst])
        if s == 0 and k in no_support_reason:
            reason = no_support_reason[k]
        elif s < MIN_SUPPORT:
            reason = f"{s} usable point{'s' if s != 1 else ''} depend on it (need {MIN_SUPPORT})"
        else:
            reason = f"the data leave it undetermined (interval wider than the value, {s} points depend on it)"
        kept[k] = ParamFit(k, preset[k], False, support=s, reason=reason)
    resid = model(dict(preset)) / observed - 1 if m else np.empty(0)
    return FitResult({k: kept.get(k) or ParamFit(k, preset[k], False) for k in preset}, m,
                     float(np.median(np.abs(resid))) if m else None)


def _solve(model: Model, observed: np.ndarray, preset: Mapping[str, float], free: list[str],
           starts: list[Mapping[str, float]]):
    def residuals(x: np.ndarray) -> np.ndarray:
        return model({**preset, **{k: xk * preset[k] for k, xk in zip(free, x)}}) / observed - 1

    best = None
    x0s = [np.ones(len(free))] + [np.array([s.get(k, preset[k]) / preset[k] for k in free]) for s in starts]
    for x0 in x0s:
        x0 = np.clip(x0, 2 * LOWEST_MULTIPLE, None)
        res = optimize.least_squares(residuals, x0, loss=LOSS, f_scale=F_SCALE, bounds=(LOWEST_MULTIPLE, np.inf),
                                     x_scale="jac", method="trf")
        if best is None or res.cost < best.cost:
            best = res
    return best.x, best


def _support(model: Model, observed: np.ndarray, values: Mapping[str, float], preset: Mapping[str, float],
             free: list[str]) -> np.ndarray:
    """Per free parameter: how many points move by >= SENSITIVITY when it grows by its preset
    value, or shrinks by half that, or by half itself if less (both sides: a kink, the floor or the overlap, hides one;
    steps of the preset's size, so a parameter fitted to 0 is still probed)."""
    base = model(values)
    out = np.zeros(len(free), dtype=int)
    for i, k in enumerate(free):
        moved = np.zeros(len(observed), dtype=bool)
        for v in (values[k] + preset[k], max(values[k] - preset[k] / 2, values[k] / 2)):
            moved |= np.abs(model({**values, k: v}) - base) / observed >= SENSITIVITY
        out[i] = int(moved.sum())
    return out


def _half_widths(res, m: int, p: int) -> np.ndarray:
    """95 % half-widths of the multipliers (see the module's docstring)."""
    _, s, vt = np.linalg.svd(res.jac, full_matrices=False)
    # least_squares' Jacobian is by finite differences (relative error ~ sqrt(eps) ~ 1e-8): a
    # direction no better seen than that is not seen at all.
    threshold = RANK_TOLERANCE * (s[0] if len(s) else 0.0)
    if len(s) < p or (s <= threshold).any():  # a direction the data do not see: infinite there
        keep = s > threshold
        cov = (vt[keep].T / s[keep] ** 2) @ vt[keep]
        var = np.diag(cov).copy()
        unseen = np.abs(vt[~keep]).max(axis=0) > 1e-8 if (~keep).any() else np.zeros(p, dtype=bool)
        var[unseen] = np.inf
    else:
        var = np.diag((vt.T / s ** 2) @ vt)
    s_sq = 2 * res.cost / (m - p)
    t = stats.t.ppf((1 + CONFIDENCE) / 2, m - p)
    # A direction the data do not see stays infinitely wide even where the fit is exact (timings
    # the model matches to the ns: s_sq = 0, and inf * 0 would be NaN, with numpy's warning on
    # stderr); elsewhere the usual variance times scatter.
    unseen = np.isinf(var)
    return np.where(unseen, np.inf, t * np.sqrt(np.where(unseen, 0.0, var) * s_sq))
