"""Figures from the tidy tables, each saved as PNG and PDF (same stem).

Every figure is a function ``f(records, samples, fig)`` (or ``f(table, fig)`` for one drawn from the
simulator's validation table or the comparison table; ``f(records, samples, fig, judged)`` for one that
also draws the range of each verdict it shows, from the comparison) that draws into an empty matplotlib
Figure, returns the rows it drew, and raises FigureDataError, before anything is written, when the
tables lack its data. render finishes each the same way (analysis/style.py: legends below the data, the setting
line of the rows drawn, the width cap). Each paper's figures
live in analysis/papers/<paper>.py and register with analysis.registry's ``@figure(paper=...)``; the workflow
(experiments/rules/analysis.smk) makes one rule per paper and source table, which draws that paper's
figures in one process (the plotting stack imported and the tables read once, not once a figure),
writing results/figures/<paper>/<name>.png; each figure keeps its report caption.

    python -m analysis.figures --records results/tables/records.csv --samples results/tables/samples.csv \
        --at-fit results/tables/records_at_fit.csv results/tables/samples_at_fit.csv \
        --out results/figures/gshard/step_breakdown.png [more PNGs, each named <figure>.png]

With ``--at-fit`` a paper fitted to its baseline rows is drawn at its fitted testbed, the numbers its
verdicts score (analysis.collect.as_judged), and the figure's setting line says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

import analysis.papers  # noqa: F401  (registers every paper's figures)
from analysis import style
from analysis.collect import as_judged, at_setting
from analysis.files import read_csv, read_tables
from analysis.registry import FIGURE_REGISTRY
from moe_core.records.results import atomic_outputs

matplotlib.use("Agg")  # files only, no display

DPI = 150


# ---- drawing and writing ----------------------------------------------------------------------


def draw(name: str, records: pd.DataFrame, samples: pd.DataFrame, table: pd.DataFrame | None = None) -> Figure:
    """Figure ``name`` drawn and finished (analysis/style.py), as render saves it; the caller closes it
    (tests check its layout without saving it). ``table`` is the table a figure that reads another
    source than the tidy tables is drawn from, or the comparison whose verdict ranges a judged figure
    draws (None: it draws none)."""
    if name not in FIGURE_REGISTRY:
        raise ValueError(f"unknown figure {name!r}; choose one of {sorted(FIGURE_REGISTRY)}")
    registered = FIGURE_REGISTRY[name]
    if registered.reads != "tables" and table is None:  # a judged figure draws without its comparison
        raise ValueError(f"figure {name!r} needs the {registered.reads} table (--{registered.reads})")
    sns.set_theme(style="whitegrid", context="paper")
    np.random.seed(0)  # seaborn's jitter (strip plots) draws from numpy's global generator: same figure every run
    fig = plt.figure(figsize=(7, 4.5))
    try:
        if registered.reads == "tables":
            # the chosen values' runs, or as the verdicts read them (main's --at-fit: as_judged)
            judged = (table,) if registered.judged else ()
            drawn = registered.draw(at_setting(records), at_setting(samples), fig, *judged)
        else:
            drawn = registered.draw(table, fig)
        style.finish(fig, drawn)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def render(
    name: str, records: pd.DataFrame, samples: pd.DataFrame, out_png: str | Path, table: pd.DataFrame | None = None
) -> list[Path]:
    """Draw figure ``name`` and write ``out_png`` and the PDF beside it; nothing is written on error."""
    out_png = Path(out_png)
    if out_png.suffix != ".png":
        raise ValueError(f"{out_png}: the output must end in .png (the PDF is written beside it)")
    fig = draw(name, records, samples, table)
    try:
        outputs = [out_png, out_png.with_suffix(".pdf")]
        with atomic_outputs(*outputs) as tmps:  # both new, or both old
            for path, tmp in zip(outputs, tmps):
                fig.savefig(tmp, format=path.suffix[1:], dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--validation", type=Path, help="validation CSV from experiments.validate")
    parser.add_argument(
        "--comparison", type=Path, help="comparison CSV from analysis.compare (judged figures draw its verdict ranges)"
    )
    parser.add_argument(
        "--at-fit",
        type=Path,
        nargs=2,
        metavar=("RECORDS", "SAMPLES"),
        help="the tables of the runs at the papers' fitted testbeds (analysis.collect): the points they cover "
        "are drawn from them, as the verdicts read them (analysis.collect.as_judged)",
    )
    parser.add_argument(
        "--figure",
        action="append",
        choices=sorted(FIGURE_REGISTRY),
        help="figure to draw, one per --out (default: each --out's name, <figure>.png)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        nargs="+",
        action="extend",
        help="PNGs to write (the PDF beside each)",
    )
    args = parser.parse_args(argv)
    figures = args.figure or [out.stem for out in args.out]
    if len(figures) != len(args.out):
        parser.error(f"{len(figures)} --figure but {len(args.out)} --out: give one PNG per figure")
    try:
        tables = read_tables(args.records, args.samples)
        if args.at_fit:
            tables = tuple(as_judged(chosen, fitted) for chosen, fitted in zip(tables, read_tables(*args.at_fit)))
        sources = {"validation": args.validation, "comparison": args.comparison}
        for name, out in zip(figures, args.out):
            if name not in FIGURE_REGISTRY:
                raise ValueError(f"{out}: no figure {name!r}; name the PNG <figure>.png or give --figure")
            registered = FIGURE_REGISTRY[name]
            source = sources["comparison"] if registered.judged else sources.get(registered.reads)
            print(" ".join(map(str, render(name, *tables, out, read_csv(source) if source else None))))
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.figures: error: {err}")


if __name__ == "__main__":
    main()
