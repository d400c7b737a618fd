"""Every figure the runs draw (the default and the CI run draw every registered figure) passes the layout
check of analysis/layout.py: no legend, title, label or tick label outside the saved image or over
another text; and the check catches a figure broken on purpose."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from analysis_records import comparison_table
from matplotlib.figure import Figure

from analysis import style
from analysis.figures import draw
from analysis.layout import layout_problems
from analysis.registry import FIGURE_REGISTRY

# The simulator's validation table, as experiments.validate writes it: two experiments, one point noisy.
VALIDATION = pd.DataFrame(
    {
        "experiment": ["collectives", "train_step"],
        "setting": ["a", "b"],
        "hardware": ["local-cpu"] * 2,
        "measured_ms": [10.0, 200.0],
        "predicted_ms": [11.0, 180.0],
        "rel_error": [0.1, -0.1],
        "noisy": [False, True],
        "contention": [0.01, 0.6],
        "profile_noisy": [False, False],
    }
)


# The table each figure that does not read the tidy tables is drawn from.
SOURCES = {"validation": VALIDATION, "comparison": comparison_table()}


@pytest.mark.parametrize("name", sorted(FIGURE_REGISTRY))
def test_figure_layout_is_clean(figure_tables, name):
    reads = FIGURE_REGISTRY[name].reads
    fig = draw(name, *figure_tables, SOURCES.get(reads))
    try:
        problems = layout_problems(fig)
    finally:
        plt.close(fig)
    assert not problems, f"{name}:\n" + "\n".join(problems)


def _broken() -> Figure:
    """Two panels whose long titles run into each other, and a legend placed beside the image and kept
    out of the layout: what the check is for."""
    fig = plt.figure(figsize=(6, 3))
    left, right = fig.subplots(1, 2)
    for ax in (left, right):
        ax.plot([0, 1], [0, 1], label="data")
        ax.set_title("a panel title far wider than its own panel")
    legend = fig.legend(loc="upper left", bbox_to_anchor=(0.95, 0.5))
    legend.set_in_layout(False)  # what finish did before: the saved (tight) image cut it off
    return fig


def test_layout_check_catches_a_broken_figure():
    fig = _broken()
    try:
        problems = layout_problems(fig)
    finally:
        plt.close(fig)
    assert any("axes 0 title" in p and "overlaps axes 1 title" in p for p in problems)
    assert any(p.startswith("legend 0 entry 0 'data'") and "outside the saved image" in p for p in problems)


def test_finish_repairs_the_broken_figure():
    """finish wraps the titles to their panels and puts the legend below the data, in the layout."""
    fig = _broken()
    try:
        for legend in fig.legends:
            legend.remove()
        style.finish(fig, None)
        assert layout_problems(fig) == []
    finally:
        plt.close(fig)
