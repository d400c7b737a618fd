"""What the entry points print on the console: tables in one look, and a study's summary of its records.

Every console table goes through :func:`table` or :class:`RowPrinter` (tabulate's ``simple`` format:
a header, a rule of dashes, columns two spaces apart, numbers right-aligned, ``-`` for a missing
value), so gpu_check's checks, the collectives' sizes, the dispatcher study's cells and a study's
summary read alike. Tables go to stdout; progress bars (tqdm) and log lines to stderr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from tabulate import tabulate

MISSING = "-"  # a cell with no value (None)


def table(rows: Sequence[Mapping[str, Any]], floatfmt: str | Sequence[str] = ".3f") -> str:
    """``rows`` (column -> value, the first row's columns in order) as one table; ``floatfmt`` for
    every float column, or one format per column."""
    return tabulate(rows, headers="keys", tablefmt="simple", floatfmt=floatfmt, missingval=MISSING)


class RowPrinter:
    """A table printed a row at a time, as results arrive (nccl-tests prints each size when it is
    done): :meth:`header` once, then :meth:`row` per result. Columns have fixed widths (``columns``:
    name -> width of its widest value), so the lines stay aligned under their header; every column
    is right-aligned, as nccl-tests aligns its own."""

    def __init__(self, columns: Mapping[str, int], floatfmt: str | Sequence[str] = ".2f"):
        self._names = list(columns)
        self._widths = list(columns.values())
        self._floatfmt = [floatfmt] * len(columns) if isinstance(floatfmt, str) else list(floatfmt)

    def _lines(self, row: list[str]) -> list[str]:
        """The header, its rule, a row that sets every column's width (not shown), then ``row``."""
        widest = ["0" * width for width in self._widths]
        text = tabulate(
            [widest, row],
            headers=self._names,
            tablefmt="simple",
            disable_numparse=True,
            colalign=("right",) * len(self._names),
        )
        return text.splitlines()

    def header(self) -> str:
        """The header line and its rule."""
        return "\n".join(self._lines([""] * len(self._names))[:2])

    def row(self, values: Sequence[Any]) -> str:
        """One line: ``values`` in the columns' order (None for a missing one)."""
        cells = [
            MISSING if value is None else format(value, fmt) if isinstance(value, float) else str(value)
            for value, fmt in zip(values, self._floatfmt)
        ]
        return self._lines(cells)[-1]


def records_summary(records: Sequence[Mapping[str, Any]], paths: Sequence[str | Path]) -> str:
    """What a study wrote (``records`` and the ``paths`` they were written to): how many records
    where, and per experiment the range of its first metric over them (its headline: ``step_ms``,
    ``time_ms``, ``inference_ms``...)."""
    groups: dict[tuple[str, Path], list[Mapping[str, Any]]] = {}
    for record, path in zip(records, paths):
        groups.setdefault((record["experiment"], Path(path).parent), []).append(record)
    rows = []
    for (experiment, folder), group in groups.items():
        metric, values = headline(group)
        rows.append(
            {
                "experiment": experiment,
                "records": len(group),
                "folder": str(folder),
                "metric": metric,
                "min": min(values, default=None),
                "median": median(values) if values else None,
                "max": max(values, default=None),
            }
        )
    return f"wrote {len(records)} records:\n{table(rows, floatfmt='.4g')}"


def headline(records: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[float]]:
    """The headline metric of a study's ``records`` (its first record's first metric: ``step_ms``,
    ``time_ms``, ``inference_ms``...) and its value in each record that has it."""
    metric = next(iter(records[0]["metrics"]), None) if records else None
    return metric, [_central(r["metrics"][metric]) for r in records if metric in r["metrics"]]


def _central(metric: Mapping[str, float]) -> float:
    """A record's metric as one number: its median over samples, or its single value."""
    return metric["median"] if "median" in metric else metric["value"]
