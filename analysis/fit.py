"""A paper's testbed fitted to the paper's own baseline numbers; its claims predicted at the fit.

A paper states its baseline's numbers (published.yaml rows with ``role: baseline``: DeepSpeed-MoE's
all-to-all times on Lina's testbed, GShard's steps/s, Megatron-LM's PFLOP/s) and leaves its testbed and
workload partly unstated (moe_core.schema.points.Unstated: a chosen value and a plausible range, with
the evidence beside each declaration). Rather than judge a claim at hand-chosen values, or over the
whole plausible box (ranges of x9), the suite pins the unstated values where the simulated baseline
reproduces the published baseline, and predicts the claims there:

* **Response surfaces.** Each number is simulated at the chosen values and at every setting of the
  sensitivity design (moe_core.schema.points.sensitivity_settings: each parameter alone at each end of
  its range, and the corners of the box). :class:`Surface` interpolates the number between those runs:
  a quadratic in the parameters' unit coordinates (0 at the low end, 1 at the high end, on a log scale
  where the range is positive), in the log of the number where it is positive, with each term only
  where the runs identify it (a square needs three levels of its parameter, a product a run that moves
  both). It reproduces every run exactly where the design identifies it (along a count run at each of
  its whole values, GShard's groups of tokens per core, it is the least-squares quadratic through
  them), and costs nothing to evaluate, so the fit needs no simulation beyond the design's.
* **The fit** (:func:`fit_testbed`) minimises the mean squared log error of the baseline rows
  (one-sided for a published bound), plus a weak pull toward the chosen values (PRIOR_WEIGHT), over
  the parameters they depend on, within the box: a Latin
  hypercube of LHS_STARTS starts, the REFINED best refined by L-BFGS-B; a count (sequences, groups of
  tokens) then at the better whole value either side, the other parameters refined again, so the fit
  is a setting the simulator runs. Parameters no baseline depends on stay at their chosen values.
  Claims never enter it (analysis.compare hands it baseline rows only).
* **Leave-one-out**: each baseline row predicted by the fit to the other rows.
* **The baseline-consistent set**: the settings of a Latin hypercube of SET_SAMPLES over the whole box
  (counts rounded to whole values), and the fit, at which every baseline row agrees with its
  published number within the row's own tolerance (the verdict's rule, :func:`within`). A claim's
  range spans this set only; when it is empty the baseline is not reproduced, and
  :attr:`Fit.unreached` names the row furthest from its number and the parameter that moves it most.
* **Simulated at the fit.** A surface is still an interpolation between runs, so the workflow
  simulates each paper again at its fitted setting (:meth:`Fit.run_setting`) and analysis.compare
  reads those runs: a number's ``reproduced`` and a baseline row's residual are the simulator's at the fit
  (:meth:`Fit.simulated`), the surface's value beside them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.stats import qmc

from moe_core.schema.points import Unstated

LHS_STARTS = 256  # Latin hypercube starts of the fit
REFINED = 4  # the best starts refined by L-BFGS-B
SET_SAMPLES = 4096  # Latin hypercube samples the baseline-consistent set is drawn from
SEED = 0  # every design is seeded: the same tables give the same fit
WEAK_WIDTH = 1.5  # a verdict whose range spans more than this factor (high / low) is weak
TINY = 1e-12  # a floor for logs of non-positive predictions
# A weak pull toward the chosen values (whose evidence is written beside each declaration): moving a
# parameter across its whole range costs what a 3% log error on every baseline row does. Where the
# baselines barely move with a parameter, the fit keeps its chosen value instead of drifting to an end.
PRIOR_WEIGHT = 1e-3
# How a number's value at the fit was found (analysis.compare's ``reproduced_by``): simulated at the
# fitted setting, the surface at the fit (the run there gives no such number), or the chosen values (no fit)
SIMULATED_AT_FIT, SURFACE_AT_FIT, CHOSEN_VALUES = "simulated at the fit", "surface at the fit", "chosen values"


def within(ratio, tolerance, bound: str | None = None):
    """Whether reproduced / published = ``ratio`` agrees with a published number (elementwise for
    arrays): within ``tolerance`` of a point, or on the right side of a ``bound`` less the tolerance."""
    ratio = np.asarray(ratio, dtype=float)
    if bound == "lower":
        return ratio >= 1 - tolerance
    if bound == "upper":
        return ratio <= 1 + tolerance
    return np.abs(ratio - 1) <= tolerance


@dataclass(frozen=True)
class Axis:
    """One unstated parameter as a coordinate of the fit: 0 at its range's low end, 1 at its high end,
    on a log scale where the range is positive (rates, batches, latencies span decades)."""

    key: str
    low: float
    high: float
    chosen: float
    integer: bool = False  # a count (a batch of sequences, NICs): simulated at a whole value
    evidence: str = ""  # why the chosen value and the range (moe_core.schema.points.Unstated)

    @classmethod
    def of(cls, param: Unstated) -> Axis:
        return cls(param.key, param.low, param.high, param.chosen, param.integer, param.evidence)

    @property
    def log(self) -> bool:
        return self.low > 0

    def unit(self, x):
        """The unit coordinate of parameter value(s) ``x``."""
        if self.log:
            return (np.log(x) - np.log(self.low)) / (np.log(self.high) - np.log(self.low))
        return (np.asarray(x, dtype=float) - self.low) / (self.high - self.low)

    def value(self, z):
        """The parameter value(s) at unit coordinate(s) ``z``."""
        if self.log:
            return np.exp(np.log(self.low) + np.asarray(z) * (np.log(self.high) - np.log(self.low)))
        return self.low + np.asarray(z) * (self.high - self.low)


def axes_of(params: Iterable[Unstated]) -> list[Axis]:
    """The fit's coordinates: one per unstated parameter, in declaration order."""
    return [Axis.of(p) for p in params]


class Surface:
    """One number as a function of the unstated parameters, through its runs (module docstring).

    ``runs``: (setting, value) pairs, a setting being {config key: value} of the parameters it moves
    off their chosen values (the chosen run: {}). Keys outside ``axes`` are an error.
    """

    def __init__(self, runs: list[tuple[dict[str, float], float]], axes: list[Axis]):
        index = {a.key: i for i, a in enumerate(axes)}
        unknown = {key for setting, _ in runs for key in setting} - set(index)
        if unknown:
            raise ValueError(f"runs set {sorted(unknown)}, which are not unstated parameters {sorted(index)}")
        self.axes = axes
        self.origin = np.array([a.unit(a.chosen) for a in axes], dtype=float)
        offsets = np.zeros((len(runs), len(axes)))  # (runs, k): unit coordinates less the chosen ones
        for r, (setting, _) in enumerate(runs):
            for key, x in setting.items():
                offsets[r, index[key]] = axes[index[key]].unit(x) - self.origin[index[key]]
        values = np.array([v for _, v in runs], dtype=float)
        self.log = bool((values > 0).all())
        self.terms = _identified_terms(offsets)
        target = np.log(values) if self.log else values
        self.coef, *_ = np.linalg.lstsq(_features(offsets, self.terms), target, rcond=None)
        # the quadratic as constant + offsets . slope + offsets . curvature . offsets / 2 (its gradient:
        # slope + offsets @ curvature), the symmetric curvature holding a square's coefficient twice
        self.constant, self.slope, self.curvature = 0.0, np.zeros(len(axes)), np.zeros((len(axes), len(axes)))
        for term, c in zip(self.terms, self.coef):
            if not term:
                self.constant = c
            elif len(term) == 1:
                self.slope[term[0]] += c
            elif len(term) == 2:
                self.curvature[term[0], term[1]] += c
                self.curvature[term[1], term[0]] += c
        # the parameters the number moves with: a term's coefficient above rounding (runs that differ)
        scale = 1.0 if self.log else max(float(np.abs(target).max()), 1e-300)
        moving = [term for term, c in zip(self.terms, self.coef) if abs(c) > 1e-9 * scale]
        self.varied = sorted({i for term in moving for i in term})

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """The number at unit coordinates ``z`` ((n, k) -> (n,); (k,) -> a float)."""
        z = np.asarray(z, dtype=float)
        flat = z.reshape(-1, len(self.axes)) - self.origin
        out = self.constant + flat @ self.slope + 0.5 * np.einsum("ni,ij,nj->n", flat, self.curvature, flat)
        out = np.exp(out) if self.log else out
        return float(out[0]) if z.ndim == 1 else out

    def log_gradient(self, z: np.ndarray) -> np.ndarray:
        """The gradient of the number's log at unit coordinates ``z`` ((n, k) -> (n, k)): the fit's
        optimiser takes it exactly instead of by finite differences (k + 1 evaluations a step)."""
        flat = np.asarray(z, dtype=float).reshape(-1, len(self.axes)) - self.origin
        grad = self.slope + flat @ self.curvature
        if self.log:
            return grad
        with np.errstate(divide="ignore", invalid="ignore"):  # a number at or below zero has no log
            return grad / self(flat + self.origin)[:, None]


def _identified_terms(offsets: np.ndarray) -> list[tuple[int, ...]]:
    """The quadratic's terms the runs identify: the constant; each parameter's slope where it moves,
    its square where it takes three levels or more, and each product where a run moves both."""
    k = offsets.shape[1]
    moved = offsets != 0
    terms: list[tuple[int, ...]] = [()]
    for i in range(k):
        levels = len(np.unique(np.round(offsets[:, i], 12)))
        terms += [(i,)] if levels >= 2 else []
        terms += [(i, i)] if levels >= 3 else []
    terms += [(i, j) for i in range(k) for j in range(i + 1, k) if (moved[:, i] & moved[:, j]).any()]
    return terms


def _features(offsets: np.ndarray, terms: list[tuple[int, ...]]) -> np.ndarray:
    """(n, len(terms)): each term's product of coordinates (the constant: 1)."""
    return np.column_stack([np.prod(offsets[:, list(term)], axis=1) for term in terms])


@dataclass(frozen=True)
class Target:
    """A baseline row the fit reproduces: its surface and its published number."""

    surface: Surface
    published: float
    tolerance: float = 0.25
    bound: str | None = None

    def log_error(self, z: np.ndarray) -> np.ndarray:
        """log(reproduced / published) at ``z`` ((n, k) -> (n,)); zero on the right side of a bound."""
        error = np.log(np.maximum(self.surface(z), TINY * self.published) / self.published)
        if self.bound == "lower":
            return np.minimum(error, 0.0)
        if self.bound == "upper":
            return np.maximum(error, 0.0)
        return error

    def log_error_gradient(self, z: np.ndarray) -> np.ndarray:
        """The gradient of :meth:`log_error` ((n, k) -> (n, k)): zero where the error is clipped (a bound
        met, or the surface below the floor of its log)."""
        value = self.surface(z)
        live = value > TINY * self.published
        if self.bound == "lower":
            live &= value < self.published
        elif self.bound == "upper":
            live &= value > self.published
        return np.where(live[:, None], self.surface.log_gradient(z), 0.0)

    def agrees(self, z: np.ndarray) -> np.ndarray:
        return within(self.surface(z) / self.published, self.tolerance, self.bound)


@dataclass
class Fit:
    """A paper's testbed fitted to its baseline rows (module docstring): the unit coordinates ``z`` of
    the best setting, its mean squared log error, each row's ratio at the fit and its leave-one-out
    prediction, the baseline-consistent settings (m, k) and, when there are none, what is unreached."""

    axes: list[Axis]
    z: np.ndarray
    loss: float
    pinned: list[str]
    ratios: dict[str, float]
    loo: dict[str, float | None]
    consistent: np.ndarray
    unreached: str | None = None
    targets: dict[str, Target] = field(default_factory=dict, repr=False)
    surface_ratios: dict[str, float] = field(default_factory=dict)  # each row's ratio on the surface

    def __post_init__(self):
        self.surface_ratios = dict(self.ratios)

    @property
    def setting(self) -> dict[str, float]:
        """The fitted value of every parameter (those no baseline pins at their chosen values)."""
        return {a.key: float(a.value(zi)) for a, zi in zip(self.axes, self.z)}

    def setting_text(self) -> str:
        return ", ".join(f"{key}={value:.3g}" for key, value in self.setting.items() if key in self.pinned)

    def run_setting(self) -> dict[str, float]:
        """The setting the workflow simulates the paper at (every unstated parameter, counts rounded
        to whole ones, each value as the recorded setting writes it: 6 significant digits)."""
        return {
            a.key: float(round(float(v))) if a.integer else float(f"{v:g}")
            for a, v in ((a, self.setting[a.key]) for a in self.axes)
        }

    def simulated(self, key: str, value: float) -> None:
        """Baseline row ``key`` as simulated at :meth:`run_setting`: its ratio replaces the surface's."""
        self.ratios[key] = value / self.targets[key].published

    def predict(self, surface: Surface) -> float:
        return surface(self.z)

    def span(self, surface: Surface) -> tuple[float, float] | None:
        """A number's (low, high) over the baseline-consistent set; None when the set is empty."""
        if not len(self.consistent):
            return None
        values = surface(self.consistent)
        return float(values.min()), float(values.max())

    def rows(self) -> list[dict[str, Any]]:
        """The fit as a table: a row per parameter (fitted, chosen and plausible values, whether a
        baseline pins it, its span over the baseline-consistent set) and per baseline row (published,
        at the fit, residual, leave-one-out prediction and error)."""
        consistent = len(self.consistent)
        common = {"loss": self.loss, "consistent_settings": consistent, "unreached": self.unreached}
        rows = []
        for i, axis in enumerate(self.axes):
            span = (
                [axis.value(self.consistent[:, i].min()), axis.value(self.consistent[:, i].max())]
                if consistent
                else [None] * 2
            )
            rows.append(
                {
                    "kind": "parameter",
                    "name": axis.key,
                    "fitted": self.setting[axis.key],
                    "chosen": axis.chosen,
                    "low": axis.low,
                    "high": axis.high,
                    "pinned": axis.key in self.pinned,
                    "evidence": axis.evidence,
                    "consistent_low": span[0],
                    "consistent_high": span[1],
                    **common,
                }
            )
        for key, target in self.targets.items():
            loo = self.loo[key]
            rows.append(
                {
                    "kind": "baseline",
                    "name": key,
                    "published": target.published,
                    "fitted": self.ratios[key] * target.published,
                    "residual": self.ratios[key] - 1,
                    "surface": self.surface_ratios[key] * target.published,
                    "loo": loo,
                    "loo_error": None if loo is None else loo / target.published - 1,
                    **common,
                }
            )
        return rows


def latin_hypercube(k: int, n: int, seed: int = SEED) -> np.ndarray:
    """(n, k) unit coordinates, a seeded Latin hypercube (a single empty setting when k = 0)."""
    return qmc.LatinHypercube(d=k, seed=seed).random(n) if k else np.zeros((1, 0))


def _loss(targets: Iterable[Target], z: np.ndarray) -> np.ndarray:
    """Mean squared log error of ``targets`` at the settings ``z`` (n, k) -> (n,)."""
    return np.mean([t.log_error(z) ** 2 for t in targets], axis=0)


def _loss_gradient(targets: list[Target], z: np.ndarray) -> np.ndarray:
    """The gradient of :func:`_loss` at ``z`` ((n, k) -> (n, k))."""
    return np.mean([2 * t.log_error(z)[:, None] * t.log_error_gradient(z) for t in targets], axis=0)


def best_setting(targets: list[Target], axes: list[Axis], seed: int = SEED) -> np.ndarray:
    """The unit coordinates minimising the targets' mean squared log error, plus PRIOR_WEIGHT times the
    squared distance from the chosen values, over the parameters the targets depend on (the others at
    their chosen values): LHS starts, the best refined by L-BFGS-B."""
    origin = np.array([a.unit(a.chosen) for a in axes], dtype=float)
    free = sorted({i for t in targets for i in t.surface.varied})
    if not free:
        return origin

    def at(u: np.ndarray) -> np.ndarray:
        z = np.tile(origin, (len(u), 1))
        z[:, free] = u
        return z

    def objective(u: np.ndarray) -> np.ndarray:
        return _loss(targets, at(u)) + PRIOR_WEIGHT * np.sum((u - origin[free]) ** 2, axis=1)

    def value_and_gradient(u: np.ndarray) -> tuple[float, np.ndarray]:
        z = at(u[None, :])
        gradient = _loss_gradient(targets, z)[0, free] + 2 * PRIOR_WEIGHT * (u - origin[free])
        return float(objective(u[None, :])[0]), gradient

    starts = np.vstack([origin[free], latin_hypercube(len(free), LHS_STARTS, seed)])
    bounds = [(0.0, 1.0)] * len(free)
    refined = [
        minimize(value_and_gradient, s, method="L-BFGS-B", jac=True, bounds=bounds)
        for s in starts[np.argsort(objective(starts))[:REFINED]]
    ]
    relaxed = min(refined, key=lambda result: result.fun).x
    # A count is simulated at a whole value (a batch of whole sequences, whole groups of tokens): the
    # fit is the best of the relaxed optimum's counts rounded down and up, the other parameters
    # refined again at each, so that its numbers are the surface's at the setting the workflow runs.
    counts = [j for j, i in enumerate(free) if axes[i].integer]
    rates = [j for j in range(len(free)) if j not in counts]
    candidates = []
    for whole in itertools.product(*[_whole_neighbours(axes[free[j]], relaxed[j]) for j in counts]):
        u = relaxed.copy()
        u[counts] = whole
        if counts and rates:

            def at_counts(v: np.ndarray, u=u) -> tuple[float, np.ndarray]:
                w = u.copy()
                w[rates] = v
                value, gradient = value_and_gradient(w)
                return value, gradient[rates]

            u[rates] = minimize(at_counts, u[rates], method="L-BFGS-B", jac=True, bounds=[(0.0, 1.0)] * len(rates)).x
        candidates.append(u)
    return at(min(candidates, key=lambda u: objective(u[None, :])[0])[None, :])[0]


def _whole_neighbours(axis: Axis, z: float) -> list[float]:
    """The unit coordinates of the whole values either side of count ``axis`` at ``z``, in its range."""
    value = float(axis.value(z))
    wholes = {min(max(v, axis.low), axis.high) for v in (np.floor(value), np.ceil(value))}
    return [float(axis.unit(v)) for v in sorted(wholes)]


def _whole_counts(axes: list[Axis], z: np.ndarray) -> np.ndarray:
    """Settings ``z`` ((n, k) unit coordinates) with every count rounded to a whole value."""
    z = np.array(z, dtype=float)
    for i, axis in enumerate(axes):
        if axis.integer:
            z[:, i] = axis.unit(np.clip(np.round(axis.value(z[:, i])), axis.low, axis.high))
    return z


def fit_testbed(targets: dict[str, Target], axes: list[Axis], seed: int = SEED) -> Fit:
    """The fit of ``targets`` (baseline rows by id, never a claim) over ``axes``: best setting,
    ratios, leave-one-out predictions and the baseline-consistent set (module docstring)."""
    rows = list(targets.values())
    z = best_setting(rows, axes, seed)
    loo = {
        key: target.surface(best_setting([t for k, t in targets.items() if k != key], axes, seed))
        if len(targets) > 1
        else None
        for key, target in targets.items()
    }
    samples = np.vstack([z, _whole_counts(axes, latin_hypercube(len(axes), SET_SAMPLES, seed + 1))])
    agree = np.all([t.agrees(samples) for t in rows], axis=0) if rows else np.ones(len(samples), bool)
    fit = Fit(
        axes=axes,
        z=z,
        loss=float(_loss(rows, z[None, :])[0]) if rows else 0.0,
        pinned=[axes[i].key for i in sorted({i for t in rows for i in t.surface.varied})],
        ratios={key: t.surface(z) / t.published for key, t in targets.items()},
        loo=loo,
        consistent=samples[agree],
        targets=targets,
    )
    fit.unreached = None if len(fit.consistent) else _unreached(fit, samples)
    return fit


def _unreached(fit: Fit, samples: np.ndarray) -> str:
    """The baseline row furthest from its number at the fit, the span the plausible box gives it and
    the parameter that moves it most: why no plausible setting reproduces the baseline."""
    key, target = max(fit.targets.items(), key=lambda kv: abs(kv[1].log_error(fit.z[None, :])[0]))
    values = target.surface(samples)
    swings = {}
    for i in target.surface.varied:
        ends = np.tile(fit.z, (2, 1))
        ends[:, i] = (0.0, 1.0)
        swings[fit.axes[i].key] = float(np.ptp(np.log(np.maximum(target.surface(ends), TINY))))
    text = (
        f"{key}: published {target.published:g}, the plausible ranges give {values.min():.3g}-{values.max():.3g}"
        f" ({fit.ratios[key]:.2f}x at the fit)"
    )
    return text + (f"; {max(swings, key=swings.get)} moves it most" if swings else "; no unstated parameter moves it")


def range_width(low: float, high: float) -> float:
    """How wide a reproduced range is, as the ratio of its ends; infinite when it spans zero."""
    if low > 0:
        return high / low
    return low / high if high < 0 else float("inf")


def weak(low: float, high: float) -> bool:
    """Whether a range is too wide to decide a verdict (wider than WEAK_WIDTH)."""
    return range_width(low, high) > WEAK_WIDTH
