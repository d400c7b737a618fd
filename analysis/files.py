"""Reading the tidy tables and writing outputs atomically, so a crash never leaves a partial file."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        tables.append(pd.read_csv(path))
    return tables[0], tables[1]
