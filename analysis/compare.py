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
records of a sensitivity run carry the param ``unstated`` ("key=value" pairs joined by ","). The verdict
compares the chosen values' number (records without it); the same reproducer on each sensitivity run's
records (one parameter at a time, and the corners of the ranges jointly) gives ``reproduced_low`` and
``reproduced_high`` (the extremes over the chosen run and the variants that reproduce it) and
``unstated``, the settings run. analysis.explain turns them into ``explainable``, ``needs`` and, for
every ``differs`` row, the computed ``reason``; main() also writes the per-paper counts
(``verdict_summary.csv``) and prints them.

    python -m analysis.compare --records results/tables/records.csv \
        --samples results/tables/samples.csv --out results/tables/comparison.csv \
        --summary results/tables/verdict_summary.csv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import analysis.papers  # noqa: F401  (registers every paper's reproducers)
from analysis import explain
from analysis.collect import TESTBED_COLUMNS, UNSTATED, at_setting, select
from analysis.files import read_tables, write_csv
from analysis.published import REGISTRY_PATH, load_registry
from analysis.registry import REPRODUCERS, MissingPointsError, Reproducer, noting_used_points

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
    *TESTBED_COLUMNS,
    "reproduced",
    "reproduced_low",
    "reproduced_high",
    "unstated",
    "explainable",
    "needs",
    "reproduced_setting",
    "points",
    "ratio",
    "verdict",
    "reason",
]
CONSISTENT, DIFFERS, NOT_COMPARABLE, NOT_REPRODUCED = "consistent", "differs", "not-comparable", "not-reproduced"


def points_text(names: set[str]) -> str:
    """The points a row used, for people: their count, then their names joined by ";"."""
    return f"{len(names)}: " + ";".join(sorted(names))


def verdict(ratio: float, tolerance: float, bound: str | None = None) -> str:
    """Whether reproduced / published = ``ratio`` agrees with the published number: within the
    tolerance of a point, or on the right side of a bound (less the tolerance)."""
    if bound == "lower":
        return CONSISTENT if ratio >= 1 - tolerance else DIFFERS
    if bound == "upper":
        return CONSISTENT if ratio <= 1 + tolerance else DIFFERS
    return CONSISTENT if abs(ratio - 1) <= tolerance else DIFFERS


def judge(entry: dict[str, Any], testbed: dict[str, str], ratio: float) -> tuple[str, str | None]:
    """(verdict, reason) of one reproduction of ``entry`` on ``testbed``: not comparable when the entry
    says no run matches it or the testbed is not the paper's, else the ratio's verdict."""
    if entry["not_comparable"]:
        return NOT_COMPARABLE, entry["not_comparable"]
    if not set(testbed["hardware"].split("+")) <= set(entry["testbed"]):
        return NOT_COMPARABLE, (
            f"{testbed['mode']} on {testbed['hardware']}, not on the paper's testbed "
            f"({', '.join(entry['testbed'])}); a run on that profile gets a verdict"
        )
    return verdict(ratio, entry["tolerance"], entry["bound"]), None


def compare(registry: dict[str, dict[str, Any]], records: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per entry and testbed that reproduces it; one row for an entry none does: not-comparable
    with the entry's reason when it gives one, else not-reproduced.

    Rows without a finite value are no data point: they are left out before any reproducer sees the
    tables, so the counts a reproducer writes into its setting are of the points it used.
    """
    records, samples = _with_finite_values(records), _with_finite_values(samples)
    testbeds = _split_by_testbed(records, samples)
    rows = []
    for entry in registry.values():
        published = {"published": entry["value"], **{k: entry[k] for k in COMPARISON_COLUMNS if k in entry}}
        fn = _reproducer_of(entry)
        found = [] if fn is None else list(_reproductions(fn, entry, records, samples, testbeds))
        if not found:
            reason = entry["not_comparable"]
            rows.append({**published, "verdict": NOT_COMPARABLE if reason else NOT_REPRODUCED, "reason": reason})
        for testbed, value, setting, used, variants, chosen, requote in found:
            rows.append(
                {
                    **published,
                    **testbed,
                    **_judged(entry, testbed, value, variants, chosen, used, requote),
                    "reproduced_setting": setting,
                    "points": points_text(used),
                }
            )
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def _judged(
    entry: dict[str, Any],
    testbed: dict[str, str],
    value: float,
    variants: dict[str, float],
    chosen: pd.DataFrame,
    used: set[str],
    requote: Callable[[pd.DataFrame], float],
) -> dict[str, Any]:
    """The verdict columns of one reproduction: value, the unstated parameters' range and what it
    explains (analysis.explain), the verdict and, for ``differs``, its computed reason (from the
    step terms of the ``used`` points among the testbed's ``chosen``-setting records, and what
    ``requote``, the reproducer on changed records, gives when one term is scaled)."""
    published = entry["value"]
    low, high = min([value, *variants.values()]), max([value, *variants.values()])
    judged, reason = judge(entry, testbed, value / published)
    columns = {
        "reproduced": value,
        "reproduced_low": low,
        "reproduced_high": high,
        "unstated": "; ".join(variants) or None,
        "ratio": value / published,
        "verdict": judged,
        "reason": reason,
        "explainable": None,
        "needs": None,
    }
    if judged in (CONSISTENT, DIFFERS):

        def agrees(ratio: float) -> bool:
            return verdict(ratio, entry["tolerance"], entry["bound"]) == CONSISTENT

        columns["explainable"] = explain.explainable(low / published, high / published, agrees)
        columns["needs"] = explain.needs(entry["paper"], value, published, variants)
    if judged == DIFFERS:
        columns["reason"] = explain.reason(
            value,
            published,
            low,
            high,
            columns["explainable"],
            explain.swept_keys(variants),
            columns["needs"],
            explain.term_shares(chosen, used),
            explain.term_factors(requote, chosen, used, published, value),
        )
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


def _split_by_testbed(
    records: pd.DataFrame, samples: pd.DataFrame
) -> list[tuple[dict[str, str], pd.DataFrame, pd.DataFrame]]:
    """(testbed, its records, its samples) for each testbed of the tables, in the order of the
    records: split once, since every registry entry reads the same split (selecting them again per
    entry took most of the comparison's time)."""
    return [
        (testbed, select(records, **testbed), select(samples, **testbed))
        for testbed in records[TESTBED_COLUMNS].drop_duplicates().to_dict("records")
    ]


def _testbeds(entry: dict[str, Any], records: pd.DataFrame, samples: pd.DataFrame, testbeds: list):
    """(testbed, its records, its samples) for each testbed of the tables (``testbeds``, from
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
            recs,
            select(samples, mode=mode, backend=backend),
        )


def _reproductions(fn: Reproducer, entry: dict[str, Any], records: pd.DataFrame, samples: pd.DataFrame, testbeds: list):
    """(testbed, value, setting, points used, {unstated setting: value}, the testbed's chosen-value
    records, the reproducer's value on changed chosen-value records) for every testbed whose
    chosen-value records hold the data ``fn`` needs; the dict holds the sensitivity runs that
    reproduce it too."""
    for testbed, recs, samps in _testbeds(entry, records, samples, testbeds):
        chosen, chosen_samples = at_setting(recs), at_setting(samps)  # once: requote runs fn again and again
        with noting_used_points() as used:
            result = _run(fn, entry, testbed, chosen, chosen_samples)

        def requote(changed: pd.DataFrame, testbed=testbed, chosen_samples=chosen_samples) -> float:
            found = _run(fn, entry, testbed, changed, chosen_samples)
            return float("nan") if found is None else found[0]

        if result is None:
            continue
        variants = {}
        for setting in sorted(recs[UNSTATED].dropna().unique()) if UNSTATED in recs else []:
            varied = _run(fn, entry, testbed, at_setting(recs, setting), at_setting(samps, setting))
            if varied is not None:
                variants[setting] = varied[0]
        yield testbed, *result, used, variants, chosen, requote


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--out", type=Path, required=True, help="comparison CSV to write")
    parser.add_argument(
        "--summary", type=Path, help="verdict counts per paper to write (default: verdict_summary.csv beside --out)"
    )
    parser.add_argument("--registry", type=Path, default=REGISTRY_PATH, help="published numbers (YAML)")
    args = parser.parse_args(argv)
    try:
        table = compare(load_registry(args.registry), *read_tables(args.records, args.samples))
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.compare: error: {err}")
    summary = explain.verdict_summary(table)
    write_csv(table, args.out)
    write_csv(summary, args.summary or args.out.with_name("verdict_summary.csv"))
    print(table[["id", "mode", "published", "reproduced", "unit", "verdict"]].to_string(index=False))
    print("\nVerdicts per paper (explainable: differs, but inside the unstated parameters' ranges):")
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
