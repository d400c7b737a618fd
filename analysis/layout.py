"""Layout check of a drawn figure: every text a reader needs (titles, axis labels, tick labels, legend
entries, the setting line) lies inside the image that is saved and overlaps no other text.

A figure is saved with ``bbox_inches="tight"``, which keeps what takes part in the layout and cuts off
the rest, so a legend placed outside the layout is clipped in the PNG although matplotlib drew it; and
two texts can be drawn over each other (a long panel title over its neighbour's). Neither raises, so
tests/test_figure_layout.py runs this check over every figure the runs draw.
"""

from __future__ import annotations

import itertools

from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.text import Text

TOLERANCE_PX = 1.0  # antialiasing: texts that touch by a pixel neither overlap nor leave the canvas


def _tick_labels(axis: Axis) -> list[Text]:
    """The axis' shown tick labels: visible, not empty, at a tick inside the view (a locator also
    returns ticks beyond the limits, which are not drawn)."""
    low, high = sorted(axis.get_view_interval())
    margin = 1e-9 * ((high - low) or 1.0)
    return [
        label
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        if low - margin <= tick.get_loc() <= high + margin
        for label in (tick.label1, tick.label2)
        if label.get_visible()
    ]


def texts(fig: Figure) -> dict[str, Text]:
    """Every text a reader reads in ``fig``, named by where it is and how it starts: the figure's own
    texts (suptitle, setting line), legends' titles and entries, and each shown axes' titles, axis
    labels and tick labels."""
    found: list[tuple[str, Text]] = [(f"figure text {i}", text) for i, text in enumerate(fig.texts)]
    for i, legend in enumerate([*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]):
        found += [(f"legend {i} title", legend.get_title())]
        found += [(f"legend {i} entry {j}", text) for j, text in enumerate(legend.get_texts())]
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        # NOTE: the left and right titles are only reachable as private attributes
        found += [(f"axes {i} title", title) for title in (ax.title, ax._left_title, ax._right_title)]
        found += [(f"axes {i} x label", ax.xaxis.label), (f"axes {i} y label", ax.yaxis.label)]
        found += [(f"axes {i} x tick", label) for label in _tick_labels(ax.xaxis)]
        found += [(f"axes {i} y tick", label) for label in _tick_labels(ax.yaxis)]
    return {
        f"{where} {text.get_text()[:40]!r}": text
        for where, text in found
        if text.get_visible() and text.get_text().strip()
    }


def layout_problems(fig: Figure) -> list[str]:
    """What a reader of ``fig``'s saved image would find wrong, one line each: a text outside the image
    ``savefig(bbox_inches="tight")`` writes (clipped), and two texts drawn over each other. Empty when
    the layout is clean."""
    fig.draw_without_rendering()  # lay out every text as saving does
    canvas = fig.get_tightbbox().transformed(fig.dpi_scale_trans)  # inches -> pixels
    boxes = {name: text.get_window_extent() for name, text in texts(fig).items()}
    problems = [
        f"{name} lies outside the saved image"
        for name, box in boxes.items()
        if box.x0 < canvas.x0 - TOLERANCE_PX
        or box.y0 < canvas.y0 - TOLERANCE_PX
        or box.x1 > canvas.x1 + TOLERANCE_PX
        or box.y1 > canvas.y1 + TOLERANCE_PX
    ]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        overlap_x = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        overlap_y = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if overlap_x > TOLERANCE_PX and overlap_y > TOLERANCE_PX:
            problems.append(f"{a} overlaps {b}")
    return problems
