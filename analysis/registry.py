"""What a paper's analysis module (analysis/papers/<paper>.py) registers, and the helpers it uses.

Three registries, each filled by a decorator when analysis.papers is imported (its one list of paper
modules): reproducers (``@reproducer``; analysis.compare runs them against published.yaml), figures
(``@figure``; analysis.figures draws them, the workflow makes one rule each) and tables (``@table``;
analysis.tables writes them). The command-line modules import analysis.papers themselves; this
module imports no paper, so no import runs in a circle.

A reproducer is ``f(records, samples) -> (value, setting_description)``, or None when the tables lack
the data it needs; it describes the rows its number comes from with describe_testbeds, which is also
how the points it used are noted. A figure raises FigureDataError, before anything is written, when
the tables lack its data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import pandas as pd

from analysis.collect import TESTBED_COLUMNS, param_columns, select

# ---- reproducers (analysis.compare) ------------------------------------------------------------

Reproducer = Callable[[pd.DataFrame, pd.DataFrame], tuple[float, str] | None]
REPRODUCERS: dict[str, Reproducer] = {}  # name -> reproducer; filled by @reproducer in analysis/papers/


def reproducer(fn: Reproducer, name: str | None = None) -> Reproducer:
    """Register ``fn`` under its name (or ``name``, for functions made in a loop), so published.yaml
    entries can refer to it."""
    if name is not None:
        fn.__name__ = name
    REPRODUCERS[fn.__name__] = fn
    return fn


POINT_COLUMNS = ("point", "baseline_point")  # the columns naming the points a reproducer's rows come from
_USED_POINTS: ContextVar[set[str] | None] = ContextVar("used_points", default=None)


class MissingPointsError(ValueError):
    """A reproducer selected points that lack a metric it reads: it fails rather than average the rest."""


def describe_testbeds(df: pd.DataFrame) -> str:
    """The testbeds of ``df``'s rows in words (``"local-cpu gloo"``), for a reproduced setting.

    Every reproducer describes the rows its number comes from with this, so it is also where the points
    it used are noted: during compare() the rows' point names (POINT_COLUMNS) become the row's ``points``.
    """
    used = _USED_POINTS.get()
    if used is not None:
        used.update(name for column in POINT_COLUMNS if column in df for name in df[column].dropna())
    return ", ".join(sorted(set(df["hardware"] + " " + df["backend"])))


def complete_points(rows: pd.DataFrame, index: list[str], metrics: list[str], what: str) -> pd.DataFrame:
    """One row per point of ``rows`` (records-table rows a reproducer selected by their parameters),
    ``index`` and a column per metric of ``metrics``; empty when no point has them all (no such data).

    A point selected but lacking one of them, while others have it, raises MissingPointsError naming
    the points: a damaged or missing record stops the comparison instead of leaving the number to the
    remaining points.
    """
    points = rows[index].drop_duplicates()
    wide = rows[rows["metric"].isin(metrics)].pivot_table(index=index, columns="metric", values="value")
    if not set(metrics) <= set(wide.columns):
        return pd.DataFrame()
    wide = points.merge(wide.reset_index(), on=index, how="left")
    lacking = wide[wide[metrics].isna().any(axis=1)]
    if not lacking.empty:
        names = sorted(lacking["point"]) if "point" in lacking else lacking[index].to_dict("records")
        raise MissingPointsError(f"{what}: points {names} lack one of {metrics}; rerun them or collect their records")
    return wide


@contextmanager
def noting_used_points() -> Iterator[set[str]]:
    """Collect the point names describe_testbeds sees while the block runs."""
    used: set[str] = set()
    token = _USED_POINTS.set(used)
    try:
        yield used
    finally:
        _USED_POINTS.reset(token)


# ---- figures (analysis.figures) --------------------------------------------------------------


# What a figure is drawn from: the tidy tables (records, samples; analysis.collect), the simulator's
# validation table (sim_validation.csv, experiments/validate.py) or the comparison (comparison.csv,
# analysis.compare).
FIGURE_SOURCES = ("tables", "validation", "comparison")


Draw = Callable[..., pd.DataFrame]  # draw(..., fig) -> the rows it drew


@dataclass(frozen=True)
class RegisteredFigure:
    """A figure function and where the workflow puts its output."""

    name: str  # the function's name: the figure's file stem (its paper's rule figures_<paper> draws it)
    paper: str  # the paper whose figure it mirrors, its folder results/figures/<paper>/; "common" if none
    # draw(records, samples, fig), or draw(table, fig) for another source; returns the rows it drew, whose
    # setting analysis.style writes under the figure
    draw: Draw
    reads: str  # one of FIGURE_SOURCES
    # drawn from the tidy tables next to the comparison (comparison.csv), whose verdict ranges it draws:
    # draw(records, samples, fig, judged), judged None when the run gives no comparison
    judged: bool = False


FIGURE_REGISTRY: dict[str, RegisteredFigure] = {}  # name -> figure; filled by @figure in analysis/papers/


def figure(*, paper: str, reads: str = "tables", judged: bool = False) -> Callable[[Draw], Draw]:
    """Register the decorated function as the figure of its name, in ``paper``'s folder. It is called as
    ``draw(records, samples, fig)`` on the tidy tables, or with ``reads`` "validation" or "comparison"
    as ``draw(table, fig)`` on that table, and returns the rows it drew. A ``judged`` figure of the tidy
    tables also draws the range of each verdict it shows: ``draw(records, samples, fig, judged)``, with
    the comparison table (analysis.compare) or None."""
    if reads not in FIGURE_SOURCES:
        raise ValueError(f"a figure reads one of {list(FIGURE_SOURCES)}, not {reads!r}")
    if judged and reads != "tables":
        raise ValueError(f"a figure that reads the {reads} table cannot also be judged")

    def register(draw: Draw) -> Draw:
        if draw.__name__ in FIGURE_REGISTRY:
            raise ValueError(f"two figures are named {draw.__name__!r}; figure names must be unique")
        FIGURE_REGISTRY[draw.__name__] = RegisteredFigure(draw.__name__, paper, draw, reads, judged)
        return draw

    return register


class FigureDataError(ValueError):
    """The tables lack the data a figure needs."""


def one_testbed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` itself, if it holds one testbed's rows: measured and simulated numbers, or two machines'
    numbers, must not be pooled in one figure."""
    testbeds = df[TESTBED_COLUMNS].drop_duplicates()
    if len(testbeds) > 1:
        found = "; ".join(" ".join(map(str, testbed)) for testbed in testbeds.itertuples(index=False))
        raise FigureDataError(
            f"the data come from several testbeds ({found}); collect one testbed's "
            "records (one mode, backend and hardware) into the tables for this figure"
        )
    return df


def train_step_rows(records: pd.DataFrame, metrics: list[str], shown: list[str]) -> pd.DataFrame:
    """gshard/train_step rows of ``metrics``; every swept parameter not ``shown`` (but seed) must be fixed."""
    df = select(records, paper="gshard", experiment="train_step")
    missing = sorted(set(metrics) - set(df["metric"]))
    if missing:
        raise FigureDataError(
            f"the records table has no gshard/train_step rows of {missing}; collect "
            "results/raw/gshard/train_step/*.json into it first"
        )
    df = one_testbed(df[df["metric"].isin(metrics)]).astype({"num_experts": int, "world_size": int})
    hidden = [c for c in param_columns(df) if c not in shown and c != "seed"]
    counts = df.groupby([*shown, "metric"])[hidden].nunique(dropna=False)
    varying = [c for c in hidden if (counts[c] > 1).any()]
    if varying:
        raise FigureDataError(
            f"parameters {varying} vary within one bar or line of this figure; "
            "collect only records that share one value of each"
        )
    return df


# ---- tables (analysis.tables) ----------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredTable:
    """A table as registered: the workflow makes one rule per table (rule ``table_<file>``), which
    writes results/tables/<file>.csv with the report caption analysis/captions/<file>_table.rst."""

    name: str
    paper: str  # the paper it belongs to; "common" if none
    file: str  # results/tables/<file>.csv
    category: str  # the report's section
    build: Callable[[pd.DataFrame], pd.DataFrame]  # records table -> the table (empty: no data)


TABLE_REGISTRY: dict[str, RegisteredTable] = {}  # name -> table; filled by @table in analysis/papers/


def table(
    *, paper: str, file: str | None = None, category: str = "Published vs reproduced"
) -> Callable[[Callable[[pd.DataFrame], pd.DataFrame]], Callable[[pd.DataFrame], pd.DataFrame]]:
    """Register the decorated function as the table of its name, written to results/tables/<file>.csv
    (``file`` defaults to the name) in the report's ``category``."""

    def register(build: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[pd.DataFrame], pd.DataFrame]:
        if build.__name__ in TABLE_REGISTRY:
            raise ValueError(f"two tables are named {build.__name__!r}; table names must be unique")
        TABLE_REGISTRY[build.__name__] = RegisteredTable(build.__name__, paper, file or build.__name__, category, build)
        return build

    return register
