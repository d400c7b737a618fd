"""Our numbers next to the published ones: one row per registry entry and testbed, with a verdict.

A reproducer is ``f(records, samples) -> (value, setting_description)``, or None when the tables lack
the data it needs. Each paper's reproducers live in analysis/papers/<paper>.py and register with
analysis.registry's @reproducer under the name a published.yaml entry gives. compare() calls a
reproducer once per testbed (mode × backend × hardware), so measured and simulated numbers, or numbers
from different machines, are never pooled into one value.

Like for like: a number is judged only where the suite reproduced the paper's quantity in the paper's
setting. A row on another testbed than the entry's ``testbed`` (the paper's hardware profiles), or of an
entry whose ``not_comparable`` says why no run of the suite matches it, keeps its value but gets the
verdict ``not-comparable`` and the reason. A published bound (``bound: lower`` for "> 1.83x") is met by
anything above it, within the tolerance. A number that spans several of the paper's testbeds (a claim
over all its settings, ``across_testbeds``) is reproduced once over the records of all of them.

A paper's unstated parameters (moe_core.schema.points.Unstated, run by moe_core.schema.points.unstated_variants):
records of a sensitivity run carry the param ``unstated`` ("key=value" pairs joined by ","). Each number is
reproduced at the chosen values (records without it) and on each sensitivity run's records. Then the paper's
testbed is fitted to its baseline rows (``role: baseline``) on each of its simulated or measured testbeds
(analysis.fit; claims never enter the fit): every number's ``reproduced`` is its value at the fit
(``reproduced_chosen`` the chosen values'), ``reproduced_low``/``high`` span the baseline-consistent settings
only, ``loo`` is a baseline row's leave-one-out prediction and ``weak`` flags a range wider than
analysis.fit.WEAK_WIDTH. A claim whose paper's baseline no plausible setting reproduces is
``baseline-not-reproduced``, naming the row and the parameter. Where a paper has no baseline row on a
testbed, its numbers keep the chosen values and the whole sensitivity range. analysis.explain writes every
row's reason (a plain first sentence, then the numbers); main() also writes the per-paper counts
(``verdict_summary.csv``) and the fits (``testbed_fit.csv``) and prints them.

The surface a fit reads smooths over steps the simulator takes, so the workflow runs in two stages:
``--fitted-settings`` writes each paper's fitted testbed as a config layer, the paper's simulations run
again on it (rule ``at_fit``), and the comparison reads those runs (``--at-fit``): a fitted row's
``reproduced`` is then the simulator's at the fit (``reproduced_by``), ``reproduced_surface`` the surface's.

    python -m analysis.compare --records results/tables/records.csv --samples results/tables/samples.csv \
        --fitted-settings results/fits/gshard.yaml
    python -m analysis.compare --records results/tables/records.csv \
        --samples results/tables/samples.csv --out results/tables/comparison.csv \
        --at-fit results/tables/records_at_fit.csv results/tables/samples_at_fit.csv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

import analysis.papers  # noqa: F401  (registers every paper's reproducers)
from analysis import explain
from analysis.collect import TESTBED_COLUMNS, UNSTATED, select
from analysis.files import atomic_output, read_tables, write_csv
from analysis.fit import (
    CHOSEN_VALUES,
    SIMULATED_AT_FIT,
    SURFACE_AT_FIT,
    Fit,
    Surface,
    Target,
    axes_of,
    fit_testbed,
    range_width,
    weak,
    within,
)
from analysis.published import BASELINE, CLAIM, REGISTRY_PATH, load_registry
from analysis.registry import REPRODUCERS, MissingPointsError, Reproducer, noting_used_points
from moe_core.schema.points import UNSTATED_PARAMS, chosen_setting, parse_setting, setting_overrides, setting_text

COMPARISON_COLUMNS = [
    "id",
    "paper",
    "figure",
    "metric",
    "setting",
    "published",
    "unit",
    "status",
    "tolerance",
    "bound",
    "role",
    *TESTBED_COLUMNS,
    "reproduced",
    "reproduced_low",
    "reproduced_high",
    "range_width",
    "weak",
    "reproduced_chosen",
    "reproduced_surface",
    "reproduced_by",
    "fitted_setting",
    "loo",
    "unstated",
    "needs",
    "reproduced_setting",
    "points",
    "ratio",
    "verdict",
    "reason",
]
FIT_COLUMNS = [
    "paper",
    "mode",
    "backend",
    "kind",
    "name",
    "published",
    "fitted",
    "residual",
    "surface",
    "loo",
    "loo_error",
    "chosen",
    "low",
    "high",
    "pinned",
    "evidence",
    "consistent_low",
    "consistent_high",
    "loss",
    "consistent_settings",
    "unreached",
]
CONSISTENT, DIFFERS, NOT_COMPARABLE, NOT_REPRODUCED = "consistent", "differs", "not-comparable", "not-reproduced"
BASELINE_NOT_REPRODUCED = "baseline-not-reproduced"


class Reproduction(NamedTuple):
    """One entry reproduced on one testbed: the chosen values' number and setting in words, the points
    used, the sensitivity runs' numbers ({setting: value}), the testbed's chosen-value records and the
    reproducer on changed records (for the reason's implied factors)."""

    testbed: dict[str, str]
    value: float
    setting: str
    used: set[str]
    variants: dict[str, float]
    chosen: pd.DataFrame
    requote: Callable[[pd.DataFrame], float]

    def surface(self, paper: str) -> Surface:
        """The number over the paper's unstated parameters, through the chosen and sensitivity runs."""
        runs = [({}, self.value), *((parse_setting(text), v) for text, v in self.variants.items())]
        return Surface(runs, axes_of(UNSTATED_PARAMS.get(paper, {}).values()))


def points_text(names: set[str]) -> str:
    """The points a row used, for people: their count, then their names joined by ";"."""
    return f"{len(names)}: " + ";".join(sorted(names))


def verdict(ratio: float, tolerance: float, bound: str | None = None) -> str:
    """Whether reproduced / published = ``ratio`` agrees with the published number: within the
    tolerance of a point, or on the right side of a bound (less the tolerance)."""
    return CONSISTENT if within(ratio, tolerance, bound) else DIFFERS


def unlike(entry: dict[str, Any], testbed: dict[str, str]) -> str | None:
    """Why a reproduction of ``entry`` on ``testbed`` is not like for like (the entry says no run matches
    it, or the testbed is not the paper's); None when it is."""
    if entry["not_comparable"]:
        return entry["not_comparable"]
    if not set(testbed["hardware"].split("+")) <= set(entry["testbed"]):
        return (
            f"{testbed['mode']} on {testbed['hardware']}, not on the paper's testbed "
            f"({', '.join(entry['testbed'])}); a run on that profile gets a verdict"
        )
    return None


def judge(entry: dict[str, Any], testbed: dict[str, str], ratio: float) -> tuple[str, str | None]:
    """(verdict, reason) of one reproduction of ``entry`` on ``testbed``: not comparable when it is not
    like for like (:func:`unlike`), else the ratio's verdict."""
    reason = unlike(entry, testbed)
    return (NOT_COMPARABLE, reason) if reason else (verdict(ratio, entry["tolerance"], entry["bound"]), None)


def fit_group(entry: dict[str, Any], testbed: dict[str, str]) -> tuple[str, str, str]:
    """The testbed fit a reproduction belongs to: its paper's, per mode and backend (the paper's
    hardware profiles share its unstated parameters)."""
    return entry["paper"], testbed["mode"], testbed["backend"]


def target_label(key: str, entry: dict[str, Any], testbed: dict[str, str]) -> str:
    """A baseline row's name in its fit: its id, with the hardware profile where the entry has several
    (each profile's reproduction is a target of its own)."""
    return key if len(entry["testbed"]) == 1 or entry["across_testbeds"] else f"{key} ({testbed['hardware']})"


def testbed_fits(registry: dict[str, dict[str, Any]], found: dict[str, list[Reproduction]]) -> dict[tuple, Fit]:
    """Each paper's testbed fitted to its like-for-like baseline reproductions (analysis.fit), per
    :func:`fit_group` that has any; a claim row never enters a fit. An entry reproduced on several of the
    group's profiles is a target per profile."""
    targets: dict[tuple, dict[str, Target]] = {}
    for key, entry in registry.items():
        if entry["role"] != BASELINE:
            continue
        for rep in found[key]:
            if unlike(entry, rep.testbed) is None:
                group = targets.setdefault(fit_group(entry, rep.testbed), {})
                group[target_label(key, entry, rep.testbed)] = Target(
                    rep.surface(entry["paper"]), entry["value"], entry["tolerance"], entry["bound"]
                )
    return {
        group: fit_testbed(rows, axes_of(UNSTATED_PARAMS.get(group[0], {}).values())) for group, rows in targets.items()
    }


def compare(
    registry: dict[str, dict[str, Any]],
    records: pd.DataFrame,
    samples: pd.DataFrame,
    at_fit: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """One row per entry and testbed that reproduces it; one row for an entry none does: not-comparable
    with the entry's reason when it gives one, else not-reproduced. The table's ``attrs["fits"]`` holds
    the testbed fits (:func:`testbed_fits`) its numbers were predicted at. ``at_fit``: the records and
    samples of the runs at the fitted testbeds (the workflow's second stage, rule ``at_fit``), which give
    a fitted row its ``reproduced`` and a baseline row its residual (analysis.fit, "Simulated at the fit").
    """
    found = _reproduce(registry, records, samples)
    fits = testbed_fits(registry, found)
    simulated = _simulated_at_fits(registry, found, fits, at_fit)
    rows = []
    for key, entry in registry.items():
        published = {"published": entry["value"], **{k: entry[k] for k in COMPARISON_COLUMNS if k in entry}}
        if not found[key]:
            rows.append({**published, **_unreproduced(entry)})
        for i, rep in enumerate(found[key]):
            fit = fits.get(fit_group(entry, rep.testbed))
            label = target_label(key, entry, rep.testbed)
            rows.append(
                {
                    **published,
                    **rep.testbed,
                    **_judged(entry, rep, fit, label, simulated.get((key, i))),
                    "reproduced_setting": rep.setting,
                    "points": points_text(rep.used),
                }
            )
    table = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    table.attrs["fits"] = fits
    return table


def _reproduce(
    registry: dict[str, dict[str, Any]], records: pd.DataFrame, samples: pd.DataFrame
) -> dict[str, list[Reproduction]]:
    """Every entry of ``registry`` reproduced on every testbed of the tables that holds its data (none for
    an entry without a reproducer). Rows without a finite value are no data point: they are left out
    before any reproducer sees the tables, so the counts a reproducer writes into its setting are of
    the points it used."""
    records, samples = _with_finite_values(records), _with_finite_values(samples)
    testbeds = _split_by_testbed(records, samples)
    return {
        key: []
        if (fn := _reproducer_of(entry)) is None
        else list(_reproductions(fn, entry, records, samples, testbeds))
        for key, entry in registry.items()
    }


def _simulated_at_fits(
    registry: dict[str, dict[str, Any]],
    found: dict[str, list[Reproduction]],
    fits: dict[tuple, Fit],
    at_fit: tuple[pd.DataFrame, pd.DataFrame] | None,
) -> dict[tuple[str, int], float]:
    """(entry id, reproduction index) -> the number simulated at its paper's fitted testbed, for every
    like-for-like reproduction whose testbed the runs ``at_fit`` cover; each baseline row's fit takes
    its simulated ratio (analysis.fit.Fit.simulated). A run at another setting than the fit's is an error:
    the runs are of an older fit."""
    if at_fit is None:
        return {}
    records, samples = (_with_finite_values(df) for df in at_fit)
    testbeds = _split_by_testbed(records, samples)
    simulated = {}
    for key, entry in registry.items():
        for i, rep in enumerate(found[key]):
            fit = fits.get(fit_group(entry, rep.testbed))
            if fit is None or unlike(entry, rep.testbed) is not None:
                continue
            text = setting_text(fit.run_setting())
            for testbed, settings in _testbeds(entry, records, samples, testbeds):
                if testbed != rep.testbed:
                    continue
                if text not in settings.records:
                    raise ValueError(
                        f"registry entry {key!r} on {'/'.join(testbed.values())}: the runs at the fit are at "
                        f"{settings.varied}, not at the fitted setting {text}; run the workflow's at_fit jobs again"
                    )
                value = _run(_reproducer_of(entry), entry, testbed, *settings.at(text))
                if value is not None:
                    simulated[key, i] = value[0]
                    if entry["role"] == BASELINE:
                        fit.simulated(target_label(key, entry, testbed), value[0])
    return simulated


def _unreproduced(entry: dict[str, Any]) -> dict[str, Any]:
    """The verdict columns of an entry no testbed reproduces."""
    reason = entry["not_comparable"]
    kind = NOT_COMPARABLE if reason else NOT_REPRODUCED
    return {"verdict": kind, "reason": explain.first_sentence(kind, entry, reason=reason)}


def _judged(
    entry: dict[str, Any], rep: Reproduction, fit: Fit | None, label: str, simulated: float | None
) -> dict[str, Any]:
    """The verdict columns of one reproduction: its value at the paper's testbed fit (``simulated`` there
    when the runs at the fit cover it, else the surface's; the chosen values' where the paper has no
    baseline on this testbed, or the row is not like for like), its range over the baseline-consistent set
    and the value at the fit (else over every sensitivity run), the verdict, ``weak``, and its reason
    (analysis.explain): a plain first sentence, then, for a row that differs, the step terms of the
    ``used`` points at the chosen values and each term's implied factor."""
    published = entry["value"]
    fit = fit if unlike(entry, rep.testbed) is None else None
    surface = rep.surface(entry["paper"]) if fit else None
    on_surface = fit.predict(surface) if fit else None
    value = simulated if fit and simulated is not None else on_surface if fit else rep.value
    by = CHOSEN_VALUES if fit is None else SIMULATED_AT_FIT if simulated is not None else SURFACE_AT_FIT
    span = fit.span(surface) if fit else None
    runs = [rep.value, *rep.variants.values()]
    low, high = span or (min(runs), max(runs))
    low, high = min(low, value), max(high, value)
    judged, reason = judge(entry, rep.testbed, value / published)
    if judged in (CONSISTENT, DIFFERS) and entry["role"] == CLAIM and fit and fit.unreached:
        judged = BASELINE_NOT_REPRODUCED
    columns = {
        "reproduced": value,
        "reproduced_low": low,
        "reproduced_high": high,
        "range_width": range_width(low, high),
        "weak": weak(low, high) if judged in (CONSISTENT, DIFFERS) else None,
        "reproduced_chosen": rep.value,
        "reproduced_surface": on_surface,
        "reproduced_by": by,
        "fitted_setting": fit.setting_text() if fit else None,
        "loo": fit.loo.get(label) if fit else None,
        "unstated": "; ".join(rep.variants) or None,
        "ratio": value / published,
        "verdict": judged,
        "needs": None,
    }
    details = None
    if judged == DIFFERS:
        columns["needs"] = explain.needs(entry["paper"], rep.value, published, rep.variants)
        details = explain.reason(
            rep.value,
            published,
            explain.swept_keys(rep.variants),
            columns["needs"],
            explain.term_shares(rep.chosen, rep.used),
            explain.term_factors(rep.requote, rep.chosen, rep.used, published, rep.value),
        )
    columns["reason"] = explain.first_sentence(judged, entry, columns, fit=fit, reason=reason, details=details)
    return columns


def _with_finite_values(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a records or samples table whose ``value`` is a number, neither NaN nor infinite."""
    return df[np.isfinite(df["value"].to_numpy(dtype=float))]


def _reproducer_of(entry: dict[str, Any]) -> Reproducer | None:
    name = entry["reproducer"]
    if name is not None and name not in REPRODUCERS:
        raise ValueError(
            f"registry entry {entry['id']!r} names reproducer {name!r}, which no module of "
            f"analysis/papers/ registers; add it there with @reproducer or set it to null"
        )
    return None if name is None else REPRODUCERS[name]


class Settings:
    """One testbed's records and samples by setting of the paper's unstated parameters (None: the chosen
    values; ``varied``: the sensitivity runs' settings), split once: every registry entry reads the same
    split, and a reproducer runs on each setting (selecting them per entry took most of the comparison's
    time)."""

    def __init__(self, records: pd.DataFrame, samples: pd.DataFrame):
        self.records, self.samples = _by_setting(records), _by_setting(samples)
        self.empty = records.iloc[0:0], samples.iloc[0:0]
        self.varied = sorted(setting for setting in self.records if setting is not None)

    def at(self, setting: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The records and samples at ``setting`` (analysis.collect.at_setting's rows)."""
        return self.records.get(setting, self.empty[0]), self.samples.get(setting, self.empty[1])


def _by_setting(df: pd.DataFrame) -> dict[str | None, pd.DataFrame]:
    """``df``'s rows by their ``unstated`` setting (None: the chosen values), in the table's order."""
    if UNSTATED not in df:
        return {None: df}
    return {text or None: rows for text, rows in df.groupby(df[UNSTATED].fillna(""), sort=False)}


def _split_by_testbed(records: pd.DataFrame, samples: pd.DataFrame) -> list[tuple[dict[str, str], Settings]]:
    """(testbed, its tables by setting) for each testbed of the tables, in the order of the records."""
    return [
        (testbed, Settings(select(records, **testbed), select(samples, **testbed)))
        for testbed in records[TESTBED_COLUMNS].drop_duplicates().to_dict("records")
    ]


def _testbeds(entry: dict[str, Any], records: pd.DataFrame, samples: pd.DataFrame, testbeds: list):
    """(testbed, its tables by setting) for each testbed of the tables (``testbeds``, from
    :func:`_split_by_testbed`); for an entry that spans its paper's testbeds (``across_testbeds``),
    one per mode and backend over the paper's hardware, named by the profiles joined with "+"."""
    if not entry["across_testbeds"]:
        yield from testbeds
        return
    records, samples = (df[df["hardware"].isin(entry["testbed"])] for df in (records, samples))
    for (mode, backend), recs in records.groupby(["mode", "backend"]):
        hardware = "+".join(sorted(recs["hardware"].unique()))
        yield (
            {"mode": mode, "backend": backend, "hardware": hardware},
            Settings(recs, select(samples, mode=mode, backend=backend)),
        )


def _reproductions(fn: Reproducer, entry: dict[str, Any], records: pd.DataFrame, samples: pd.DataFrame, testbeds: list):
    """A :class:`Reproduction` for every testbed whose chosen-value records hold the data ``fn`` needs;
    its variants are the sensitivity runs that reproduce it too."""
    for testbed, settings in _testbeds(entry, records, samples, testbeds):
        chosen, chosen_samples = settings.at()
        with noting_used_points() as used:
            result = _run(fn, entry, testbed, chosen, chosen_samples)

        def requote(changed: pd.DataFrame, testbed=testbed, chosen_samples=chosen_samples) -> float:
            found = _run(fn, entry, testbed, changed, chosen_samples)
            return float("nan") if found is None else found[0]

        if result is None:
            continue
        variants = {}
        for setting in settings.varied:
            varied = _run(fn, entry, testbed, *settings.at(setting))
            if varied is not None:
                variants[setting] = varied[0]
        yield Reproduction(testbed, *result, used, variants, chosen, requote)


def _run(fn: Reproducer, entry: dict[str, Any], testbed: dict[str, str], records, samples) -> tuple[float, str] | None:
    """``fn`` on one testbed's tables; any failure is raised as a ValueError naming the entry and testbed."""
    try:
        return fn(records, samples)
    except (ValueError, TypeError, KeyError, IndexError) as err:
        raise ValueError(
            f"registry entry {entry['id']!r} (reproducer {entry['reproducer']}) on {'/'.join(testbed.values())}: "
            f"{err if isinstance(err, MissingPointsError) else repr(err)}"
        ) from err


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--out", type=Path, help="comparison CSV to write")
    parser.add_argument(
        "--at-fit",
        type=Path,
        nargs=2,
        metavar=("RECORDS", "SAMPLES"),
        help="the tables of the runs at the fitted testbeds (the second stage; see --fitted-settings)",
    )
    parser.add_argument(
        "--fitted-settings",
        type=Path,
        nargs="+",
        metavar="PAPER.yaml",
        help="instead of comparing: write each paper's fitted testbed (the file's stem names the paper) as a "
        "config layer, which the workflow's at_fit jobs simulate the paper at",
    )
    parser.add_argument(
        "--summary", type=Path, help="verdict counts per paper to write (default: verdict_summary.csv beside --out)"
    )
    parser.add_argument("--fits", type=Path, help="the testbed fits to write (default: testbed_fit.csv beside --out)")
    parser.add_argument("--registry", type=Path, default=REGISTRY_PATH, help="published numbers (YAML)")
    args = parser.parse_args(argv)
    if not (args.out or args.fitted_settings):
        parser.error("give --out (the comparison) or --fitted-settings (the fits alone)")
    try:
        registry, tables = load_registry(args.registry), read_tables(args.records, args.samples)
        if args.fitted_settings:
            settings = fitted_settings(registry, *tables, [path.stem for path in args.fitted_settings])
            for path in args.fitted_settings:
                write_setting_layer(settings[path.stem], path)
                print(f"wrote {path}: {path.stem} at {setting_text(settings[path.stem])}")
            return
        table = compare(registry, *tables, read_tables(*args.at_fit) if args.at_fit else None)
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.compare: error: {err}")
    summary = explain.verdict_summary(table)
    write_csv(table, args.out)
    write_csv(summary, args.summary or args.out.with_name("verdict_summary.csv"))
    fits = fit_table(table.attrs["fits"])
    write_csv(fits, args.fits or args.out.with_name("testbed_fit.csv"))
    print(table[["id", "mode", "published", "reproduced", "unit", "verdict", "weak"]].to_string(index=False))
    print("\nTestbed fits (each paper's unstated parameters fitted to its baseline rows):")
    print(fits.drop(columns=["unreached"]).to_string(index=False))
    print("\nVerdicts per paper (weak: a range wider than x1.5 over the baseline-consistent settings):")
    print(summary.to_string(index=False))


def fitted_settings(
    registry: dict[str, dict[str, Any]], records: pd.DataFrame, samples: pd.DataFrame, papers: list[str]
) -> dict[str, dict[str, float]]:
    """Each of ``papers``' setting to simulate it at: its simulated testbed's fit to its baseline rows
    (analysis.fit.Fit.run_setting), the chosen values where its baseline gives no fit; an error for a
    paper that declares no unstated parameter. Reproduces the baseline rows alone (the fit reads no claim)."""
    unknown = [paper for paper in papers if paper not in UNSTATED_PARAMS]
    if unknown:
        raise ValueError(
            f"{unknown}: no unstated parameters declared (papers that have some: {sorted(UNSTATED_PARAMS)})"
        )
    baselines = {key: entry for key, entry in registry.items() if entry["role"] == BASELINE}
    found = _reproduce(baselines, records, samples)
    fits = {paper: fit for (paper, mode, _), fit in testbed_fits(baselines, found).items() if mode == "simulated"}
    return {paper: fits[paper].run_setting() if paper in fits else chosen_setting(paper) for paper in papers}


def write_setting_layer(setting: dict[str, float], path: Path) -> None:
    """``setting`` as a config layer (``--config``): each parameter's value, and ``unstated`` recording
    it, so every record of a run on the layer carries the setting (moe_core.schema.points)."""
    layer = OmegaConf.from_dotlist(setting_overrides(setting))
    with atomic_output(path) as tmp:
        Path(tmp).write_text(OmegaConf.to_yaml(layer))


def fit_table(fits: dict[tuple, Fit]) -> pd.DataFrame:
    """Every testbed fit (:func:`testbed_fits`) as one table: a row per fitted parameter and per baseline
    row (analysis.fit.Fit.rows), each with its paper, mode and backend."""
    rows = [
        {"paper": paper, "mode": mode, "backend": backend, **row}
        for (paper, mode, backend), fit in fits.items()
        for row in fit.rows()
    ]
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


if __name__ == "__main__":
    main()
