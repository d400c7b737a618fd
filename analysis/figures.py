"""Figures from the tidy tables, each saved as PNG and PDF (same stem).

Every figure is a function ``f(records, samples, fig)`` (or ``f(validation, fig)`` for one drawn from
the simulator's validation table) that draws into an empty matplotlib Figure and raises FigureDataError,
before anything is written, when the tables lack its data. Each paper's figures live in
analysis/papers/<paper>.py and register here with ``@figure(paper=...)``; the workflow
(experiments/rules/analysis.smk) makes one rule per registered figure, writing
results/figures/<paper>/<name>.png.

    python -m analysis.figures --records results/tables/records.csv --samples results/tables/samples.csv \
        --figure step_breakdown --out results/figures/gshard/step_breakdown.png
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis.collect import TESTBED_COLUMNS, at_setting, param_columns, select
from analysis.files import read_tables
from moe_core.results import atomic_outputs

matplotlib.use("Agg")  # files only, no display

DPI = 150


@dataclass(frozen=True)
class RegisteredFigure:
    """A figure function and where the workflow puts its output."""

    name: str  # the function's name: the figure's file stem and rule name (figure_<name>)
    paper: str  # the paper whose figure it mirrors, its folder results/figures/<paper>/; "common" if none
    draw: Callable[..., None]  # draw(records, samples, fig), or draw(validation, fig)
    reads_validation: bool  # drawn from sim_validation.csv (experiments/validate.py), not the tables


FIGURE_REGISTRY: dict[str, RegisteredFigure] = {}  # name -> figure; filled by @figure in analysis/papers/


def figure(*, paper: str, reads_validation: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register the decorated function as the figure of its name, in ``paper``'s folder; with
    ``reads_validation`` it is called as ``draw(validation, fig)`` on the simulator's validation table."""

    def register(draw: Callable[..., None]) -> Callable[..., None]:
        if draw.__name__ in FIGURE_REGISTRY:
            raise ValueError(f"two figures are named {draw.__name__!r}; figure names must be unique")
        FIGURE_REGISTRY[draw.__name__] = RegisteredFigure(draw.__name__, paper, draw, reads_validation)
        return draw

    return register


class FigureDataError(ValueError):
    """The tables lack the data a figure needs."""


# ---- selecting data, for every paper's figures -------------------------------------------------


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


# ---- drawing and writing ----------------------------------------------------------------------


def render(
    name: str, records: pd.DataFrame, samples: pd.DataFrame, out_png: str | Path, validation: pd.DataFrame | None = None
) -> list[Path]:
    """Draw figure ``name`` and write ``out_png`` and the PDF beside it; nothing is written on error."""
    if name not in FIGURE_REGISTRY:
        raise ValueError(f"unknown figure {name!r}; choose one of {sorted(FIGURE_REGISTRY)}")
    registered = FIGURE_REGISTRY[name]
    if registered.reads_validation and validation is None:
        raise ValueError(f"figure {name!r} needs the validation table (--validation)")
    out_png = Path(out_png)
    if out_png.suffix != ".png":
        raise ValueError(f"{out_png}: the output must end in .png (the PDF is written beside it)")
    sns.set_theme(style="whitegrid", context="paper")
    np.random.seed(0)  # seaborn's jitter (strip plots) draws from numpy's global generator: same figure every run
    fig = plt.figure(figsize=(7, 4.5))
    try:
        if registered.reads_validation:
            registered.draw(validation, fig)
        else:
            registered.draw(at_setting(records), at_setting(samples), fig)  # the chosen values' runs
        fig.tight_layout()
        outputs = [out_png, out_png.with_suffix(".pdf")]
        with atomic_outputs(*outputs) as tmps:  # both new, or both old
            for path, tmp in zip(outputs, tmps):
                fig.savefig(tmp, format=path.suffix[1:], dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--validation", type=Path, help="validation CSV from experiments.validate")
    parser.add_argument("--figure", required=True, choices=sorted(FIGURE_REGISTRY))
    parser.add_argument("--out", type=Path, required=True, help="PNG to write; the PDF goes beside it")
    args = parser.parse_args(argv)
    try:
        validation = pd.read_csv(args.validation) if args.validation else None
        outputs = render(args.figure, *read_tables(args.records, args.samples), args.out, validation)
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.figures: error: {err}")
    print(" ".join(map(str, outputs)))


# Last, because the paper modules import this one: importing them registers every paper's figures.
import analysis.papers  # noqa: E402, F401

if __name__ == "__main__":
    # `python -m` runs this file as a second module, __main__; the papers registered their figures with
    # analysis.figures, so its main is the one that sees them.
    from analysis.figures import main as main_with_papers

    main_with_papers()
