"""Raw JSON records -> two tidy tables that every later step (comparison, figures) reads.

* records: one row per point × metric. The record's identity (paper, experiment, point, mode, backend,
  hardware), then every swept parameter as its own column (the union over all records; a parameter a
  record lacks is NA), then the metric's name, its statistics and ``value``. Single-value metrics
  (``{"value": x}``) fill ``value`` only; per-iteration metrics fill the statistics and, for
  convenience, ``value`` = median.
* samples: one row per point × metric × iteration, with the same identity and parameter columns.

    python -m analysis.collect --out-records results/tables/records.csv \
        --out-samples results/tables/samples.csv results/raw/*/*/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.files import write_csv
from analysis.record_schema import digest_problem, record_problem

ID_COLUMNS = ("paper", "experiment", "point", "mode", "backend", "hardware")
# What was measured on what: numbers of different testbeds are never pooled into one value or figure.
TESTBED_COLUMNS = ["mode", "backend", "hardware"]
UNSTATED = "unstated"  # the param of a sensitivity run's records: the unstated parameter's setting
FITTED = "fitted_setting"  # as_judged's column: the fitted testbed a row's run is at (its setting text)
RECORD_KEY = ["paper", "experiment", *TESTBED_COLUMNS, "point"]  # one point of one testbed
STAT_COLUMNS = ("median", "p95", "mean", "min", "max", "n")
RESERVED_COLUMNS = {*ID_COLUMNS, *STAT_COLUMNS, "metric", "value", "iteration", FITTED}


class RecordError(ValueError):
    """A file given to collect() is not a valid record."""


def read_valid_record(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` and check it against the record schema (analysis/record_schema.py): its format
    (keys, finite numbers), its content (required metrics, units, summaries, params, the testbed it ran
    on) and its digest (unchanged since its run wrote it), so that no NaN, text, wrong number or edited
    record reaches the tables, where it would silently move a mean, a verdict or drop a point."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as err:  # missing or unreadable file, invalid JSON
        raise RecordError(
            f"{path}: cannot read a JSON record ({err}); "
            "pass record files written by moe_core.records.results.write_record"
        ) from err
    problem = record_problem(record) or _column_clash(record)
    if problem:
        raise RecordError(f"{path}: {problem}; rerun the experiment that wrote it (schema: analysis/record_schema.py)")
    changed = digest_problem(record)
    if changed:
        raise RecordError(f"{path}: {changed}; delete it and rerun its point (snakemake runs a deleted point again)")
    return record


def _column_clash(record: dict[str, Any]) -> str | None:
    """A param named like a table column, which would overwrite it."""
    clashes = sorted(RESERVED_COLUMNS & record["params"].keys())
    return f"params {clashes} clash with table columns; rename them in the experiment" if clashes else None


def collect(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read record files into the (records, samples) tables; any invalid file raises RecordError.
    The files are read in path order, so the tables do not depend on the order they are given in."""
    paths = sorted(paths, key=str)
    if not paths:
        raise ValueError("no record files given; pass one or more results/raw/<paper>/<experiment>/*.json")
    records, named, swept, types = [], {}, {}, {}
    for path in paths:
        record = read_valid_record(path)
        _one_record_per_point(record, path, named, swept)
        _one_type_per_param(record, path, types)
        records.append(record)
    params = list(dict.fromkeys(name for r in records for name in r["params"]))
    metric_rows = [row for r in records for row in _metric_rows(r)]
    sample_rows = [row for r in records for row in _sample_rows(r)]
    return (
        pd.DataFrame(metric_rows, columns=[*ID_COLUMNS, *params, "metric", *STAT_COLUMNS, "value"]),
        pd.DataFrame(sample_rows, columns=[*ID_COLUMNS, *params, "metric", "iteration", "value"]),
    )


def _one_record_per_point(record: dict[str, Any], path: Path, named: dict, swept: dict) -> None:
    """Each point once: no two records of one experiment and testbed with the same point name, or with
    the same params (a record copied over another point's, which would count one point twice)."""
    where = tuple(record[k] for k in ("paper", "experiment", "mode", "backend", "hardware"))
    by_name = (*where, record["point"])
    by_params = (*where, json.dumps(record["params"], sort_keys=True))
    for seen, key, what in ((named, by_name, "point name"), (swept, by_params, "params")):
        if key in seen:
            raise RecordError(
                f"{path}: the same {what} as {seen[key]} ({'/'.join(where)}); one record per point: remove the copy"
            )
        seen[key] = path


def _one_type_per_param(record: dict[str, Any], path: Path, types: dict) -> None:
    """A param is text in every record of an experiment or a number in every one (null aside): a text
    among numbers turns the whole column into text, which every later comparison then misreads."""
    for name, value in record["params"].items():
        if value is None:
            continue
        kind = "text" if isinstance(value, str) else "boolean" if isinstance(value, bool) else "number"
        key = (record["paper"], record["experiment"], name)
        first_kind, first_path = types.setdefault(key, (kind, path))
        if kind != first_kind:
            raise RecordError(
                f"{path}: params.{name} = {value!r}: a {kind}, but a {first_kind} in {first_path}; "
                "one type per parameter: rerun the experiment that wrote it"
            )


def _identity_and_params(record: dict[str, Any]) -> dict[str, Any]:
    """The columns every row of ``record`` starts with: its identity, then its swept parameters."""
    return {**{k: record[k] for k in ID_COLUMNS}, **record["params"]}


def _metric_rows(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    base = _identity_and_params(record)
    for name, stats in record["metrics"].items():
        row = {**base, "metric": name, **{k: stats.get(k) for k in STAT_COLUMNS}}
        row["value"] = stats.get("value", stats.get("median"))
        yield row


def _sample_rows(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    base = _identity_and_params(record)
    for name, values in record.get("samples", {}).items():
        for iteration, value in enumerate(values):
            yield {**base, "metric": name, "iteration": iteration, "value": value}


def param_columns(df: pd.DataFrame) -> list[str]:
    """The swept-parameter columns of a records or samples table."""
    return [c for c in df.columns if c not in RESERVED_COLUMNS]


def at_setting(df: pd.DataFrame, setting: str | None = None) -> pd.DataFrame:
    """The rows of a records or samples table at one setting of a paper's unstated parameters: None,
    the chosen values (what figures, tables and verdicts show); "key=value", that sensitivity run's
    (moe_core.schema.points.unstated_variants; records carry it as the param ``unstated``)."""
    if UNSTATED not in df:
        return df if setting is None else df.iloc[0:0]
    return df[df[UNSTATED].isna()] if setting is None else df[df[UNSTATED] == setting]


def as_judged(chosen: pd.DataFrame, fitted: pd.DataFrame | None) -> pd.DataFrame:
    """The rows of a records or samples table as the verdicts read them (analysis.compare): each point
    that a paper's runs at its fitted testbed cover (``fitted``: the workflow's second stage, the
    ``*_at_fit`` tables) from those runs, their setting in the column :data:`FITTED`; every other point
    at the chosen values (:func:`at_setting`). The figures and tables draw these rows, so a figure shows
    the number its verdict scores."""
    chosen = at_setting(chosen)
    if fitted is None or fitted.empty:
        return chosen
    setting = fitted.get(UNSTATED, np.nan)  # one setting per paper: not a variant
    fitted = fitted.assign(**{FITTED: setting, UNSTATED: np.nan})
    covered = _point_keys(chosen).isin(set(_point_keys(fitted)))
    return pd.concat([chosen[~covered], fitted], ignore_index=True)


def fitted_text(rows: pd.DataFrame) -> str:
    """The fitted testbeds ``rows`` are at (:func:`as_judged`'s column :data:`FITTED`), joined by ", ";
    "" for rows at the chosen values."""
    if FITTED not in rows:
        return ""
    return ", ".join(sorted(rows[FITTED].dropna().unique()))


def _point_keys(df: pd.DataFrame) -> pd.Series:
    """Each row's point (:data:`RECORD_KEY`) as one string."""
    key = df[RECORD_KEY[0]].astype(str)
    for column in RECORD_KEY[1:]:
        key = key + "\x1f" + df[column].astype(str)
    return key


def wide_points(records: pd.DataFrame, paper: str, experiment: str) -> pd.DataFrame:
    """One row per point of <paper>/<experiment> (every testbed): its testbed, its parameters, the fitted
    testbed it is at (as_judged's tables) and every metric's value (a per-iteration metric's median) as a
    column; no rows when the records have none."""
    df = select(records, paper=paper, experiment=experiment)
    if df.empty:
        return df
    keys = [*TESTBED_COLUMNS, "point"]
    params = [c for c in param_columns(df) if c != "point" and df[c].notna().any()]
    fitted = [FITTED] if FITTED in df else []  # as_judged's: the setting line names it
    wide = df.pivot_table(index=keys, columns="metric", values="value").reset_index()
    wide.columns.name = None
    return df.drop_duplicates(keys)[keys + params + fitted].merge(wide, on=keys)


def select(df: pd.DataFrame, **equal: Any) -> pd.DataFrame:
    """Rows whose columns equal the given values; no rows when a column is absent (no such records)."""
    if not set(equal) <= set(df.columns):
        return df.iloc[0:0]
    return df[np.logical_and.reduce([df[col] == value for col, value in equal.items()])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.collect", description=__doc__.split("\n")[0])
    parser.add_argument("--out-records", type=Path, required=True, help="records CSV to write")
    parser.add_argument("--out-samples", type=Path, required=True, help="samples CSV to write")
    parser.add_argument("files", nargs="*", type=Path, metavar="FILE.json", help="raw record files")
    args = parser.parse_args(argv)
    try:
        records, samples = collect(args.files)
    except ValueError as err:
        sys.exit(f"analysis.collect: error: {err}")
    write_csv(records, args.out_records)
    write_csv(samples, args.out_samples)
    print(
        f"{len(args.files)} records -> {args.out_records} ({len(records)} rows), "
        f"{args.out_samples} ({len(samples)} rows)"
    )


if __name__ == "__main__":
    main()
