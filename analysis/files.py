"""Reading the tidy tables and writing outputs atomically, so a crash never leaves a partial file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moe_core.records.results import atomic_output


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    with atomic_output(path) as tmp:
        df.to_csv(tmp, index=False)
    return Path(path)


def read_tables(records_csv: str | Path, samples_csv: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two tables written by ``python -m analysis.collect``."""
    tables = []
    for path in (records_csv, samples_csv):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such table; write it first with `python -m analysis.collect`")
        tables.append(read_csv(path))
    return tables[0], tables[1]


def read_csv(path: str | Path) -> pd.DataFrame:
    """A tidy table: read whole before its column types are chosen (the records table mixes papers,
    so a column empty for thousands of rows holds text further down)."""
    return pd.read_csv(path, low_memory=False)


def with_none(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its empty cells as None, which a console table shows as ``-`` and a W&B table
    stores as a missing value (it refuses NaN in a text column)."""
    return frame.astype(object).where(frame.notna(), None)
