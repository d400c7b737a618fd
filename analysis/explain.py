"""Why a verdict, in words: a plain first sentence for every row (:func:`first_sentence`), then, for a
row that differs, what the records say about the difference (:func:`reason`).

The first sentence says whether the number holds, at what setting (the paper's testbed fitted to its
baseline rows, analysis.fit, or the chosen values where the paper gives no baseline on the testbed), and
over what range (the baseline-consistent settings', flagged weak when wider than x1.5). For a
``differs`` row the numbers follow, from the chosen values' records and the sensitivity runs
(moe_core.schema.points.sensitivity_settings: each parameter at each end of its range, and the corners):

* **needs**: the value of the most influential parameter (the one whose one-at-a-time runs move the
  number most) at which the number would equal the published one, read off the piecewise-linear curve
  through its runs (extrapolated past the range's ends), and whether that value lies in its range.
* the simulated step's terms at the chosen setting (each term's share of the step, mean over the points
  the number comes from), and each term's **implied factor**: by how much that term alone would have to
  be scaled, in every point the number comes from, for the reproducer to give the published number
  (term_factors). The term whose factor is nearest 1 is the smallest departure that explains the
  published number; a term that must grow or shrink several times over, while nothing plausible moves
  it, says the step physics of that term is what the comparison doubts.

The implied factors are first order: a term's time is scaled, the metrics that are parts of it scale
with it, the sums that hold it move by the same milliseconds and the shares are recomputed
(scale_term); what the term overlaps with stays as simulated. The reproducer itself is rerun on the
scaled records, so the factor follows however it turns the terms into its number (a share, a speedup,
a mean over models); a number that does not read the step terms gets none.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from analysis.fit import SIMULATED_AT_FIT, SURFACE_AT_FIT
from moe_core.records.step_metrics import MOE_TERMS, a2a_shares
from moe_core.schema.points import UNSTATED_PARAMS, parse_setting

# The additive terms of a simulated or measured training step (moe_core.sim.timeline metrics; their sum is
# step_ms), in words.
STEP_TERMS = {
    "dense_ms": "dense compute",
    "gate_ms": "gate",
    "expert_ms": "experts",
    "a2a_ms": "exposed all-to-all",
    "allreduce_exposed_ms": "exposed gradient all-reduce",
}
# What moves with a step term when its time is scaled (scale_term): metrics that are parts of it scale
# with it, and the sums that hold it move by the same milliseconds; then the shares are recomputed
# (the all-to-all's as moe_core.records.step_metrics defines them, the simulator's exposed-communication one).
TERM_PARTS = {"a2a_ms": ("dispatch_a2a_ms", "combine_a2a_ms", "a2a_fwd_ms", "a2a_bwd_ms")}
TERM_SUMS = {
    "step_ms": tuple(STEP_TERMS),
    "moe_layer_ms": MOE_TERMS,
    "exposed_comm_ms": ("a2a_ms", "allreduce_exposed_ms"),
}
A2A_SHARE_INPUTS = ("a2a_ms", "moe_layer_ms", "step_ms")  # moe_core.records.step_metrics.a2a_shares' arguments
MOE_SPANS = {"moe_layer_fwd_ms": "a2a_fwd_ms", "moe_layer_bwd_ms": "a2a_bwd_ms"}  # span -> its all-to-all part
RATES = ("steps_per_s", "tokens_per_s")  # per-step rates: they scale as 1 / step_ms
FACTOR_LIMITS = (1e-2, 1e2)  # implied factors outside these are reported as out of reach
SURFACE_NOTE = 0.1  # a run at the fit this far from the surface's value: the reason gives both
VERDICTS = ("consistent", "differs", "baseline-not-reproduced", "not-comparable", "not-reproduced")
JUDGED = VERDICTS[:3]  # the verdicts on a number; the other two say why no number is judged


def one_at_a_time(variants: dict[str, float]) -> dict[str, list[tuple[float, float]]]:
    """Config key -> [(parameter value, reproduced value)] of the sensitivity runs that move one
    parameter alone."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for text, value in variants.items():
        setting = parse_setting(text)
        if len(setting) == 1:
            ((key, x),) = setting.items()
            runs.setdefault(key, []).append((x, value))
    return runs


def solve_curve(points: list[tuple[float, float]], target: float) -> float | None:
    """The x at which the piecewise-linear curve through ``points`` (x, y) reaches ``target``: inside
    the points where a segment spans it, else along the nearer end segment; None if it never does
    (flat, or the end segments point away)."""
    points = sorted(points)
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if min(y0, y1) <= target <= max(y0, y1) and y0 != y1:
            return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))
    # outside: extrapolate the end segment on the side the target lies
    candidates = []
    for (x0, y0), (x1, y1) in ((points[0], points[1]), (points[-2], points[-1])):
        if y1 != y0:
            x = x0 + (target - y0) * (x1 - x0) / (y1 - y0)
            if x < xs.min() or x > xs.max():
                candidates.append(float(x))
    if not candidates or not np.isfinite(ys).all():
        return None
    return min(candidates, key=lambda x: min(abs(x - xs.min()), abs(x - xs.max())))


def needs(paper: str, value: float, published: float, variants: dict[str, float]) -> str | None:
    """What the most influential unstated parameter would need to be for ``published``, in words; None
    when no parameter was run one at a time."""
    runs = one_at_a_time(variants)
    params = UNSTATED_PARAMS.get(paper, {})
    runs = {key: r for key, r in runs.items() if key in params}
    if not runs:
        return None
    key = max(runs, key=lambda k: max(abs(v - value) for _, v in runs[k]))
    param = params[key]
    x = solve_curve([(param.chosen, value), *runs[key]], published)
    where = f"plausible range {param.low:g}-{param.high:g}, chosen {param.chosen:g}"
    if x is None or x <= 0:
        return f"{key}: no {'positive ' if x is not None else ''}value gives {published:g} ({where})"
    inside = "inside" if param.low <= x <= param.high else "outside"
    return f"{key}={x:.3g} gives {published:g} ({inside} its {where})"


def term_shares(records: pd.DataFrame, points: set[str]) -> dict[str, float]:
    """Each step term's share of the step (STEP_TERMS), mean over ``points`` that record them all."""
    rows = records[records["point"].isin(points) & records["metric"].isin([*STEP_TERMS, "step_ms"])]
    if rows.empty:
        return {}
    wide = rows.pivot_table(index="point", columns="metric", values="value")
    if not set(STEP_TERMS) | {"step_ms"} <= set(wide.columns):
        return {}
    wide = wide.dropna(subset=[*STEP_TERMS, "step_ms"])
    wide = wide[wide["step_ms"] > 0]
    if wide.empty:
        return {}
    return {term: float((wide[term] / wide["step_ms"]).mean()) for term in STEP_TERMS}


def scale_term(records: pd.DataFrame, points: set[str], term: str, factor: float) -> pd.DataFrame:
    """``records`` with the step term ``term`` (a STEP_TERMS metric) of ``points`` scaled by
    ``factor``, to first order (module docstring): its parts scale with it, the sums that hold it
    (step, MoE layer, exposed communication) move by the same milliseconds, the MoE layer's forward and
    backward spans by their all-to-all part's change (a2a) or in proportion to the layer (gate,
    experts), the shares are recomputed and the per-step rates (RATES) scale inversely with the
    step. Rows of other points, and other metrics, are unchanged."""
    return _with_values(records, points, _scaled(_point_metrics(records, points), term, factor))


def _point_metrics(records: pd.DataFrame, points: set[str]) -> pd.DataFrame:
    """One row per point of ``points``, a column per metric its records hold."""
    mine = records[records["point"].isin(points)]
    return mine.pivot_table(index="point", columns="metric", values="value", aggfunc="first")


def _scaled(wide: pd.DataFrame, term: str, factor: float) -> pd.DataFrame:
    """``wide`` (_point_metrics) with ``term`` scaled by ``factor`` as scale_term says; ``wide``
    itself when its points do not record the term."""
    if term not in wide:
        return wide
    new = wide.copy()
    delta = (factor - 1) * wide[term]
    for metric in (term, *TERM_PARTS.get(term, ())):
        if metric in new:
            new[metric] = wide[metric] * factor
    for total, parts in TERM_SUMS.items():
        if term in parts and total in new:
            new[total] = wide[total] + delta
    for span, a2a_part in MOE_SPANS.items():
        if span not in new:
            continue
        if term == "a2a_ms" and a2a_part in new:
            new[span] = wide[span] + (factor - 1) * wide[a2a_part]
        elif term in MOE_TERMS and "moe_layer_ms" in new:
            new[span] = wide[span] * new["moe_layer_ms"] / wide["moe_layer_ms"]
    if set(A2A_SHARE_INPUTS) <= set(new):
        shares = new.apply(lambda row: pd.Series(a2a_shares(*row[list(A2A_SHARE_INPUTS)])), axis=1)
        for share in set(shares.columns) & set(new):
            new[share] = shares[share]
    if {"exposed_comm_share", "exposed_comm_ms", "step_ms"} <= set(new):
        new["exposed_comm_share"] = new["exposed_comm_ms"] / new["step_ms"]
    for rate in RATES:
        if {rate, "step_ms"} <= set(new):
            new[rate] = wide[rate] * wide["step_ms"] / new["step_ms"]
    return new


def _with_values(records: pd.DataFrame, points: set[str], wide: pd.DataFrame) -> pd.DataFrame:
    """``records`` with each row of ``points`` taking its metric's value from ``wide``."""
    mine = records["point"].isin(points)
    scaled = wide.stack().rename("scaled").reset_index()
    rows = records[mine].reset_index().merge(scaled, on=["point", "metric"], how="left").set_index("index")
    out = records.copy()
    out.loc[rows.index, "value"] = rows["scaled"].fillna(rows["value"])
    return out


def implied_factor(quantity, published: float, value: float) -> float | None:
    """The factor f at which ``quantity(f)`` (the reproduced number with one term scaled by f;
    ``quantity(1) = value``) equals ``published``; None when the term does not move the number or no f
    in FACTOR_LIMITS gives it.

    A share or a speedup is a ratio of sums of terms, so along one term it is a Moebius function
    (a + b f) / (1 + d f): three evaluations fix it and give f in closed form; a mean over points is
    close to one, so the candidate is checked and refined by secant steps."""
    xs, ys = [0.5, 1.0, 2.0], [quantity(0.5), value, quantity(2.0)]
    if not np.isfinite(ys).all() or max(abs(y - value) for y in ys) <= 1e-9 * max(abs(value), 1e-12):
        return None
    system = np.array([[1.0, x, -x * y] for x, y in zip(xs, ys)])
    try:
        a, b, d = np.linalg.solve(system, np.array(ys))
        f = (published - a) / (b - d * published)
    except (np.linalg.LinAlgError, ZeroDivisionError, FloatingPointError):
        f = float("nan")
    for _ in range(6):
        if not np.isfinite(f) or not FACTOR_LIMITS[0] / 10 <= f <= FACTOR_LIMITS[1] * 10:
            f = _secant_start(xs, ys, published)
            if f is None:
                return None
        y = quantity(f)
        if not np.isfinite(y):
            return None
        if abs(y - published) <= 1e-3 * abs(published):
            return f if FACTOR_LIMITS[0] <= f <= FACTOR_LIMITS[1] else None
        xs, ys = [*xs, f], [*ys, y]
        (x0, y0), (x1, y1) = sorted(zip(xs, ys), key=lambda p: abs(p[1] - published))[:2]
        f = x1 + (published - y1) * (x1 - x0) / (y1 - y0) if y1 != y0 else float("nan")
    return None


def _secant_start(xs: list[float], ys: list[float], target: float) -> float | None:
    """A positive factor from the two evaluations nearest ``target``, in log space; None if flat."""
    (x0, y0), (x1, y1) = sorted(zip(xs, ys), key=lambda p: abs(p[1] - target))[:2]
    if y1 == y0:
        return None
    log_f = np.log(x1) + (target - y1) * (np.log(x1) - np.log(x0)) / (y1 - y0)
    return float(np.exp(log_f)) if np.isfinite(log_f) and abs(log_f) < 10 else None


def term_factors(
    requote: Callable[[pd.DataFrame], float], records: pd.DataFrame, points: set[str], published: float, value: float
) -> dict[str, float | None]:
    """Each step term's implied factor (implied_factor) for the number ``requote(records)`` gives from
    the ``points`` of ``records``; terms the number does not read are left out."""
    factors = {}
    wide = _point_metrics(records, points)  # once: every term and factor scales the same points
    for term in (t for t in STEP_TERMS if t in wide):
        cache: dict[float, float] = {}

        def quantity(f: float, term: str = term, cache: dict[float, float] = cache) -> float:
            if f not in cache:
                cache[f] = requote(_with_values(records, points, _scaled(wide, term, f)))
            return cache[f]

        if abs(quantity(2.0) - value) > 1e-9 * max(abs(value), 1e-12):
            factors[term] = implied_factor(quantity, published, value)
    return factors


def factors_text(factors: dict[str, float | None]) -> str:
    """The implied factors in words, the smallest departure first."""
    reached = sorted(((t, f) for t, f in factors.items() if f is not None), key=lambda tf: abs(np.log(tf[1])))
    parts = [f"{STEP_TERMS[t]} x{f:.2g}" for t, f in reached]
    unreached = [STEP_TERMS[t] for t, f in factors.items() if f is None]
    if unreached:
        low, high = FACTOR_LIMITS
        parts.append(f"{', '.join(unreached)}: no factor in {low:g}-{high:g}x")
    return ", ".join(parts)


def reason(
    value: float,
    published: float,
    swept: list[str],
    needed: str | None,
    shares: dict[str, float],
    factors: dict[str, float | None] | None = None,
) -> str:
    """The numbers behind a ``differs`` row at the chosen values (``value``; see the module docstring)."""
    parts = [f"at the chosen values ours is {value:.3g}, {value / published:.2f}x the published {published:g}"]
    parts.append(f"swept: {', '.join(swept)}" if swept else "no unstated parameter is swept for this number")
    if needed:
        parts.append(f"the most influential parameter: {needed}")
    if shares:
        terms = ", ".join(f"{STEP_TERMS[t]} {s:.0%}" for t, s in sorted(shares.items(), key=lambda kv: -kv[1]))
        parts.append(f"step at the chosen setting: {terms}")
    if factors:
        parts.append(f"the published number needs, one term alone: {factors_text(factors)}")
    elif shares:
        parts.append("the number does not move with the step terms")
    else:
        parts.append("the number is not built from a training step's terms")
    return "; ".join(parts)


def first_sentence(kind: str, entry: dict, columns: dict | None = None, fit=None, reason=None, details=None) -> str:
    """A row's reason: one plain sentence on whether the number holds, where and over what range, then
    ``details`` (:func:`reason`). ``kind`` is the verdict, ``columns`` the row's verdict columns
    (analysis.compare), ``fit`` the paper's testbed fit (analysis.fit.Fit, None without one) and
    ``reason`` why a row has no verdict."""
    if kind == "not-comparable":
        return f"not comparable: {reason}"
    if kind == "not-reproduced":
        return "not reproduced: no run of the suite gives this number yet"
    value, published = columns["reproduced"], entry["value"]
    ours = f"ours {value:.3g} against {published:g} {entry['unit']} ({value / published:.2f}x)"
    ours += _how_found(columns)
    if kind == "baseline-not-reproduced":
        return (
            "baseline not reproduced: no plausible setting brings every baseline row within tolerance "
            f"({fit.unreached}); at the closest fit {ours}."
        )
    baseline = entry["role"] == "baseline"
    verb = {("consistent", True): "reproduced", ("consistent", False): "holds"}.get((kind, baseline))
    verb = verb or ("baseline missed" if baseline else "does not hold")
    where = _fit_phrase(fit)
    low, high = columns["reproduced_low"], columns["reproduced_high"]
    span = "the baseline-consistent settings" if fit and len(fit.consistent) else "every sensitivity run"
    text = f"{verb}: {where}, {ours}; over {span} {low:.3g}-{high:.3g}"
    text += f" (weak: x{columns['range_width']:.2g} wide)" if columns["weak"] else ""
    if columns.get("loo") is not None:
        text += f"; fitted without this row, the testbed predicts {columns['loo']:.3g}"
    return f"{text}." + (f" {details}" if details else "")


def _how_found(columns: dict) -> str:
    """Where the value at the fit comes from, in words, when it is not plainly the run there: the
    surface's (the run at the fit gives no such number), or the run's far from what the surface said."""
    surface = columns.get("reproduced_surface")
    if columns.get("reproduced_by") == SURFACE_AT_FIT:
        return " (the surface through the sensitivity runs: the run at the fit gives no such number)"
    if columns.get("reproduced_by") == SIMULATED_AT_FIT and not np.isclose(
        columns["reproduced"], surface, rtol=SURFACE_NOTE
    ):
        return f" (simulated at the fit; the surface through the sensitivity runs said {surface:.3g})"
    return ""


def _fit_phrase(fit) -> str:
    """Where a number was predicted, in words: at the paper's testbed fit, or at the chosen values."""
    if fit is None:
        return "at the chosen values (the paper gives no baseline on this testbed to fit to)"
    errors = np.abs([ratio - 1 for ratio in fit.ratios.values()])
    pinned = f" ({fit.setting_text()})" if fit.pinned else ""
    rows = f"{len(errors)} baseline row" + ("s" if len(errors) != 1 else "")
    return f"with the testbed fitted to {rows} within {np.median(errors):.0%} (median){pinned}"


def swept_keys(variants: dict[str, float]) -> list[str]:
    """The unstated parameters the sensitivity runs set, in order of first appearance."""
    keys: dict[str, None] = {}
    for text in variants:
        keys.update(dict.fromkeys(parse_setting(text)))
    return list(keys)


def verdict_summary(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per paper, how many rows are consistent, differ, have a baseline no plausible setting reproduces,
    are not comparable and not reproduced, and how many of the judged ones are weak (a range wider than
    analysis.fit.WEAK_WIDTH): the same counts comparison.csv's ``verdict`` and ``weak`` columns give."""
    table = pd.crosstab(comparison["paper"], comparison["verdict"]).reindex(columns=list(VERDICTS), fill_value=0)
    table["total"] = table.sum(axis=1)
    table["weak"] = comparison["weak"].eq(True).groupby(comparison["paper"]).sum().reindex(table.index, fill_value=0)
    table.loc["all"] = table.sum()
    return table.reset_index().rename_axis(columns=None)
