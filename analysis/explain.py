"""Why a verdict: what the unstated parameters' sweep says about a published number, and a reason for
every ``differs`` row, computed from the records.

A paper's unstated parameters (moe_core.points.Unstated: a chosen value and a plausible range each) are
simulated one at a time at each end of their range and jointly at the corners of the ranges
(moe_core.points.sensitivity_settings). For one reproduced number, analysis.compare hands this module
the chosen run's value and each sensitivity run's (``{setting: value}``, settings as recorded):

* **explainable**: some setting inside the plausible ranges reproduces the published number (within
  the entry's tolerance, or the range straddles it): the paper and the suite can both be right, and
  the difference is the paper's unstated setting.
* **needs**: the value of the most influential parameter (the one whose one-at-a-time runs move the
  number most) at which the number would equal the published one, read off the piecewise-linear curve
  through its runs (extrapolated past the range's ends), and whether that value lies in its range.
* **reason** (``differs`` rows): the ratio, the swept range and whether it reaches the published
  number, what the most influential parameter would need, and the simulated step's terms at the chosen
  setting (each term's share of the step, mean over the points the number comes from), so a reader
  sees which term would have to move and whether anything plausible moves it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moe_core.points import UNSTATED_PARAMS, parse_setting

# The additive terms of a simulated or measured training step (moe_core.sim.step metrics; their sum is
# step_ms), in words.
STEP_TERMS = {
    "dense_ms": "dense compute",
    "gate_ms": "gate",
    "expert_ms": "experts",
    "a2a_ms": "exposed all-to-all",
    "allreduce_exposed_ms": "exposed gradient all-reduce",
}
VERDICTS = ("consistent", "explainable", "differs", "not-comparable", "not-reproduced")


def explainable(ratio_low: float, ratio_high: float, agrees) -> bool:
    """Whether a number whose sweep spans ``ratio_low``..``ratio_high`` x the published value can
    reproduce it: an end agrees (``agrees(ratio)``, the entry's verdict rule) or the span straddles 1."""
    return bool(agrees(ratio_low) or agrees(ratio_high) or ratio_low <= 1 <= ratio_high)


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


def reason(
    value: float,
    published: float,
    low: float,
    high: float,
    reaches: bool,
    swept: list[str],
    needed: str | None,
    shares: dict[str, float],
) -> str:
    """The reason of a ``differs`` row, from its numbers (see the module docstring)."""
    parts = [f"ours {value:.3g} is {value / published:.2f}x the published {published:g}"]
    if swept:
        verb = "reaches" if reaches else "does not reach"
        parts.append(f"the joint sweep of {', '.join(swept)} gives {low:.3g}-{high:.3g}, which {verb} it")
    else:
        parts.append("no unstated parameter is swept for this number")
    if needed:
        parts.append(f"the most influential parameter: {needed}")
    if shares:
        terms = ", ".join(f"{STEP_TERMS[t]} {s:.0%}" for t, s in sorted(shares.items(), key=lambda kv: -kv[1]))
        parts.append(f"step at the chosen setting: {terms}")
    return "; ".join(parts)


def swept_keys(variants: dict[str, float]) -> list[str]:
    """The unstated parameters the sensitivity runs set, in order of first appearance."""
    keys: dict[str, None] = {}
    for text in variants:
        keys.update(dict.fromkeys(parse_setting(text)))
    return list(keys)


def verdict_summary(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per paper, how many rows are consistent, explainable (differs, but inside the unstated
    parameters' ranges), differs (outside them), not comparable and not reproduced."""
    kind = comparison["verdict"].where(
        ~((comparison["verdict"] == "differs") & comparison["explainable"].eq(True)), "explainable"
    )
    table = pd.crosstab(comparison["paper"], kind).reindex(columns=list(VERDICTS), fill_value=0)
    table["total"] = table.sum(axis=1)
    table.loc["all"] = table.sum()
    return table.reset_index().rename_axis(columns=None)
