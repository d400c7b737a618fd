"""The figures' one visual language: a fixed colour per policy, dispatcher, testbed and verdict; one
way to draw a published number; measured and simulated told apart the same way; legends outside the
data; a width that reads in the report; and a setting line, computed from the rows a figure drew,
under every figure.

Every figure in analysis/papers/ takes its colours and its published marks from here, and
analysis.figures.render calls ``finish`` on every figure, so no figure places its own legend or
setting line.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatterSciNotation, LogLocator

from analysis.collect import TESTBED_COLUMNS, fitted_text, select
from analysis.explain import JUDGED
from analysis.units import span
from moe_core.schema.sections import hardware_profiles

# ---- colours --------------------------------------------------------------------------------------

_CB = sns.color_palette("colorblind")  # Okabe-Ito-like, colour-blind safe; 10 hues

# Names drawn in one figure get distinct hues; a name has its hue in every figure. Baselines brown
# or grey, Lina's policy vermillion, Aurora's orange.
POLICY_COLOURS = {
    # training schedules (Lina Figs 10-14; the baselines of every paper-scale sweep)
    "sequential": _CB[5],
    "overlap": _CB[7],
    "lina-priority": _CB[9],
    "lina-partition": _CB[0],
    "lina-pipeline": _CB[2],
    "lina": _CB[3],
    "lina-pack": _CB[4],
    # inference placement (Lina Figs 16-18): the balanced gate is the reference, static the baseline
    "ideal": _CB[7],
    "static": _CB[5],
    "lina-no-estimation": _CB[6],
    "lina-no-finetune": _CB[8],
    # transmission orders and deployments (Aurora Figs 11-14); exact is the optimum, a reference
    "aurora": _CB[1],
    "aurora-exclusive": _CB[0],
    "aurora-sjf": _CB[0],
    "aurora-rcs": _CB[9],
    "naive": _CB[5],
    "library": _CB[6],
    "exact": _CB[7],
    "sjf": _CB[0],
    "rcs": _CB[9],
    "rga": _CB[2],
    "rec": _CB[4],
    "rga+rec": _CB[5],
}


def _dispatcher_colours() -> dict[str, tuple]:
    """One hue per registered token dispatcher, in registry order (moe_core.dispatch: the library's,
    then the papers'), so a new dispatcher's registry line gives it its colour; and the grey of "none
    (tp 1)", MoNTA's layout without tensor parallelism, where no dispatcher chooses anything."""
    import moe_core.config.load  # noqa: F401  (registers every dispatcher, the papers' included)
    from moe_core.dispatch import DISPATCHERS

    hues = [*_CB[:7], *_CB[8:], *sns.color_palette("dark")]  # _CB[7], grey, is "none"
    return {**dict(zip(DISPATCHERS, hues)), "none (tp 1)": _CB[7]}


DISPATCHER_COLOURS = _dispatcher_colours()

# Each verdict's colour wherever the report shows it (the verdicts figure, the HTML tables): green to
# vermillion as agreement falls; greys for no verdict.
VERDICT_COLOURS = {
    "consistent": "#009E73",
    "baseline-not-reproduced": "#E69F00",
    "differs": "#D55E00",
    "not-comparable": "#999999",
    "not-reproduced": "#666666",
}


def _testbed_colours() -> dict[str, tuple]:
    """One hue per hardware profile of configs/hardware/, in name order: the colour-blind palette,
    then its dark variant."""
    hues = [*_CB, *sns.color_palette("dark")]
    return dict(zip(hardware_profiles(), hues))


TESTBED_COLOURS = _testbed_colours()
_KINDS = {"policy": POLICY_COLOURS, "dispatcher": DISPATCHER_COLOURS, "testbed": TESTBED_COLOURS}


def colour(kind: str, name: str) -> tuple:
    """The fixed colour of ``name``, a policy, dispatcher or testbed (``kind``)."""
    colours = _KINDS[kind]
    if name not in colours:
        raise ValueError(f"{kind} {name!r} has no colour; give it one in analysis/style.py")
    return colours[name]


def palette(kind: str, names) -> dict[str, tuple]:
    """``{name: colour}`` for the ``names`` drawn (seaborn's ``palette=`` for ``hue=``)."""
    return {name: colour(kind, name) for name in pd.unique(pd.Series(list(names)))}


# The phases of a training step, by metric, with the words a figure shows for each: one colour per
# phase in every figure that splits a step (step_breakdown, gshard_runtime_breakdown,
# monta_iteration_breakdown). The whole all-to-all, where a figure does not split it, takes the
# dispatch's colour; communication warm (orange, vermillion), compute cool (blue, green, pink).
PHASES = {
    "gate_ms": ("gate", _CB[0]),
    "dispatch_a2a_ms": ("dispatch all-to-all", _CB[1]),
    "a2a_ms": ("all-to-all", _CB[1]),
    "expert_ms": ("experts", _CB[2]),
    "combine_a2a_ms": ("combine all-to-all", _CB[3]),
    "dense_ms": ("dense layers", _CB[4]),
    "allreduce_exposed_ms": ("exposed gradient all-reduce", _CB[5]),
}


def phase_label(metric: str) -> str:
    """The words for the step phase ``metric`` (a key of PHASES)."""
    return PHASES[metric][0]


def phase_colour(metric: str) -> tuple:
    """The colour of the step phase ``metric`` (a key of PHASES), the same in every figure."""
    return PHASES[metric][1]


# ---- published numbers ------------------------------------------------------------------------------

# A published number is black and dashed wherever it is drawn: a line at its value, a star at a
# point, a dashed-edged band for a range. The artists carry gid "published" (tests find them so).
PUBLISHED = {"color": "black", "ls": "--", "lw": 1.5, "gid": "published"}
PUBLISHED_MARKER = {"marker": "*", "s": 160, "color": "black", "zorder": 4, "gid": "published"}


def published_line(ax: Axes, value: float, label: str, horizontal: bool = True, extent=(0, 1)) -> None:
    """A published value as a dashed black line across the axes (``extent``: the part of the axes it
    spans, as fractions); ``label`` says what it is, starting with "published"."""
    line = ax.axhline if horizontal else ax.axvline
    line(value, *extent, label=label, zorder=4, **PUBLISHED)


def published_segment(ax: Axes, x: float, value: float, label: str | None, half_width: float = 0.4) -> None:
    """A published value over one category of a bar chart (x - half_width .. x + half_width)."""
    ax.plot([x - half_width, x + half_width], [value, value], label=label, zorder=4, **PUBLISHED)


def published_point(ax: Axes, x: float, y: float, label: str | None) -> None:
    """A published number at one point of the axes, as a black star."""
    ax.scatter([x], [y], label=label, **PUBLISHED_MARKER)


def published_band(ax: Axes, low: float, high: float, label: str) -> None:
    """A published range of values: a light band between dashed black lines."""
    ax.axhspan(low, high, color="0.9", zorder=0)
    published_line(ax, low, label)
    published_line(ax, high, None)


# The range a verdict reads (analysis.compare: reproduced_low..reproduced_high, over the settings that
# reproduce the paper's baseline rows, or over every sensitivity run where none does) is a black I-beam
# over the value it judges (gid "verdict-range").
VERDICT_RANGE = {"color": "black", "lw": 1.2, "capsize": 5, "capthick": 1.2, "zorder": 5, "gid": "verdict-range"}
VERDICT_RANGE_LABEL = "the verdict's range: settings that reproduce the paper's baselines (else every run)"


def verdict_range(ax: Axes, x: float, judged: pd.DataFrame | None, entry: str, testbed: dict) -> None:
    """The range the verdict of registry entry ``entry`` on ``testbed`` (its mode, backend, hardware) reads,
    from the comparison ``judged``, as an I-beam at ``x``; nothing without a comparison or a judged row
    (a row not comparable, say) there."""
    if judged is None:
        return
    rows = select(judged, id=entry, **{c: testbed[c] for c in TESTBED_COLUMNS})
    rows = rows[rows["verdict"].isin(JUDGED)]
    if rows.empty:
        return
    low, high = float(rows["reproduced_low"].iloc[0]), float(rows["reproduced_high"].iloc[0])
    middle = (low + high) / 2
    bars = [[middle - low], [high - middle]]
    ax.errorbar([x], [middle], yerr=bars, fmt="none", label=VERDICT_RANGE_LABEL, **VERDICT_RANGE)


# ---- measured vs simulated ------------------------------------------------------------------------

# Measured rows are drawn with filled circles, simulated with hollow squares, in every figure that puts
# both on one axes; every panel's title starts with the mode ("measured: ...", "simulated: ...").
MODE_MARKERS = {"measured": "o", "simulated": "s"}


def mode_title(mode: str, what: str) -> str:
    """A panel title that starts with its mode."""
    return f"{mode}: {what}"


# ---- finishing every figure -------------------------------------------------------------------------

MAX_WIDTH_IN = 11.0  # at the figures' 150 dpi, 1650 px: wider figures are scaled down to it
SETTING_ID = "setting"  # the gid of the setting line


def setting_line(rows: pd.DataFrame) -> str:
    """The run's setting of the rows a figure drew, in words: per testbed (mode, hardware profile,
    backend) the sizes (ranks, GPUs, cores or partitions), the models, the timed iterations and the
    fitted testbed the rows were simulated at (analysis.collect.as_judged), if any."""
    if rows is None or rows.empty or "hardware" not in rows:
        return ""
    parts = []
    keys = [c for c in ("mode", "hardware", "backend") if c in rows]
    for key, group in rows.groupby(keys, sort=True):
        mode, hardware, backend = (dict(zip(keys, np.atleast_1d(key))).get(c) for c in ("mode", "hardware", "backend"))
        words = [(f"{mode} on " if mode else "") + hardware + (f" ({backend})" if backend and backend != "sim" else "")]
        for column, unit in (("world_size", "ranks"), ("gpus", "GPUs"), ("n_gpus", "GPUs"), ("cores", "cores")):
            if column in group and group[column].notna().any():
                words.append(f"{span(group[column].dropna())} {unit}")
                break
        for column, what in (("model", "model"), ("gshard_model", "GShard model")):
            if column in group and group[column].notna().any():
                words.append(f"{what} {', '.join(sorted(map(str, group[column].dropna().unique())))}")
        if mode == "measured" and "n" in group and group["n"].notna().any():
            words.append(f"{span(group['n'].dropna())} timed iterations per point")
        if fits := fitted_text(group):
            words.append(f"at the testbed fitted to the paper's baseline rows ({fits})")
        parts.append(", ".join(words))
    return "Setting: " + "; ".join(parts)


def finish(fig: Figure, drawn: pd.DataFrame | None) -> None:
    """Make a drawn figure read the same as every other: no wider than MAX_WIDTH_IN, panel titles
    wrapped to their panel's width, every axes' legend gathered into one legend below the data, in as
    many columns as fit the figure's width, and the setting line of ``drawn`` under it. Everything
    stays in the layout, so the saved (tight) image keeps all of it (analysis/layout.py checks)."""
    width, height = fig.get_size_inches()
    if width > MAX_WIDTH_IN:
        fig.set_size_inches(MAX_WIDTH_IN, height * MAX_WIDTH_IN / width)
    for ax in fig.axes:
        _plain_log_ticks(ax)
    _wrap_titles(fig)
    handles = _gather_legends(fig)
    fig.tight_layout()
    bottom = min(ax.get_tightbbox().transformed(fig.transFigure.inverted()).y0 for ax in fig.axes if ax.axison)
    if handles:
        legend = _legend_below(fig, handles, bottom)
        bottom = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    line = setting_line(drawn)
    if line:
        wrapped = textwrap.fill(line, width=int(16 * fig.get_size_inches()[0]))
        fig.text(0.01, bottom - 0.01, wrapped, ha="left", va="top", fontsize="small", color="0.3", gid=SETTING_ID)


def _wrap_titles(fig: Figure) -> None:
    """Wrap each shown panel's title wider than its panel onto lines that fit it, so that it runs over
    neither its neighbour's title nor its y label."""
    for ax in fig.axes:
        title = ax.title
        text = title.get_text()
        if not ax.axison or not text:
            continue
        too_wide = title.get_window_extent().width / ax.get_window_extent().width
        if too_wide > 1:
            title.set_text(textwrap.fill(" ".join(text.split()), width=max(10, int(len(text) / too_wide))))


def _legend_below(fig: Figure, handles: dict[str, object], top: float):
    """One legend of ``handles`` centred under ``top`` (a figure fraction), in the most columns (at most
    one per 2.2 inches) whose width fits the figure's."""
    columns = max(1, min(len(handles), int(fig.get_size_inches()[0] // 2.2)))
    while True:
        legend = fig.legend(
            handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, top), ncol=columns
        )
        if columns == 1 or legend.get_window_extent().width <= fig.bbox.width:
            return legend
        legend.remove()
        columns -= 1


def _plain_log_ticks(ax: Axes) -> None:
    """A log axis left with matplotlib's default ticks reads 1, 2, 5, 10, 20, ... instead of 10^0 and
    10^1 (a figure that chose its own ticks keeps them)."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log" and isinstance(axis.get_major_formatter(), LogFormatterSciNotation):
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            axis.set_major_formatter("{x:g}")
            axis.set_minor_formatter("")


def _gather_legends(fig: Figure) -> dict[str, object]:
    """Every shown axes' labelled artists (its legend's entries, and any drawn after the legend was
    made), label -> handle, once each, published numbers last; the axes' own legends removed. A
    legend's title, or a subtitle entry (seaborn's "mode" between hue and style entries: a handle that
    draws nothing), prefixes the labels under it ("path: capacity"), so entries of two legends stay apart."""
    entries: dict[str, object] = {}
    for ax in fig.axes:
        if not ax.axison:
            continue
        legend = ax.get_legend()
        group = legend.get_title().get_text() if legend else ""
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if _draws_nothing(handle):
                group = label
            else:
                grouped = group and not label.startswith("published")  # a published mark is no subgroup's
                entries.setdefault(f"{group}: {label}" if grouped else label, handle)
        if legend:
            legend.remove()
    return dict(sorted(entries.items(), key=lambda entry: entry[0].startswith("published")))


def _draws_nothing(handle) -> bool:
    """A legend handle with neither a marker nor a line (seaborn's subtitles: a line of width 0, or,
    in a scatter plot's legend, of no line style): a subtitle."""
    if not isinstance(handle, Line2D) or handle.get_marker() not in ("", "None", None):
        return False
    return handle.get_linewidth() == 0 or handle.get_linestyle() in ("None", "none", "", " ")
