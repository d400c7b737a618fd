"""Numbers written for people (``64 KiB``, ``16 MiB``, ``4–16``), shared by the comparison and the figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from moe_core.units import GiB, KiB, MiB


def format_bytes(n_bytes: float) -> str:
    """``1048576`` -> ``"1 MiB"``; powers of 1024, with no decimals when exact."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def span(values: pd.Series, fmt: Callable[[Any], str] = "{:g}".format) -> str:
    """The range of ``values`` as text, each end written by ``fmt``: ``"4"`` when all are equal, else
    ``"4–16"`` (an en dash, as ranges are written in the papers)."""
    lo, hi = values.min(), values.max()
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"
