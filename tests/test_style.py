"""analysis/style.py: fixed colours, one published mark, legends below the data, the setting line."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
from analysis_records import TABLE_FIGURES
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

import moe_core.papers  # noqa: F401  (registers the papers' policies and dispatchers)
from analysis import style
from analysis.registry import FIGURE_REGISTRY
from moe_core.dispatch import DISPATCHERS
from moe_core.schedule.policies import POLICIES
from moe_core.schema.sections import hardware_profiles

matplotlib.use("Agg")


def _drawn(name: str, tables) -> Figure:
    fig = Figure(figsize=(7, 4.5))
    style.finish(fig, FIGURE_REGISTRY[name].draw(*tables, fig))
    fig.canvas.draw()
    return fig


def test_every_registered_name_has_one_colour():
    for name in POLICIES:
        style.colour("policy", name)
    for name in DISPATCHERS:
        style.colour("dispatcher", name)
    assert set(style.TESTBED_COLOURS) == set(hardware_profiles())
    # by registry order: the library's, then the papers', each its own hue
    assert list(style.DISPATCHER_COLOURS)[: len(DISPATCHERS)] == list(DISPATCHERS)
    lina_training = ["overlap", "lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]
    assert len({style.colour("policy", p) for p in lina_training}) == len(lina_training)
    with pytest.raises(ValueError, match="analysis/style.py"):
        style.colour("policy", "no-such-policy")


def test_setting_line_states_testbeds_sizes_models_and_iterations():
    rows = pd.DataFrame(
        {
            "mode": ["measured", "measured", "simulated"],
            "hardware": ["local-cpu", "local-cpu", "lina-a100-4x4"],
            "backend": ["gloo", "gloo", "sim"],
            "world_size": [2, 4, 16],
            "model": [None, None, "2B"],
            "n": [10, 10, 1],
        }
    )
    assert style.setting_line(rows) == (
        "Setting: measured on local-cpu (gloo), 2–4 ranks, 10 timed iterations per point; "
        "simulated on lina-a100-4x4, 16 ranks, model 2B"
    )
    rows["fitted_setting"] = [None, None, "train.batch_size=37"]  # analysis.collect.as_judged's rows
    assert style.setting_line(rows).endswith(
        "model 2B, at the testbed fitted to the paper's baseline rows (train.batch_size=37)"
    )


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_figure_legend_lies_outside_every_axes_and_published_is_drawn_one_way(figure_tables, name):  # noqa: F811
    fig = _drawn(name, figure_tables)
    assert all(ax.get_legend() is None for ax in fig.axes)  # gathered into the figure's one legend
    for legend in fig.legends:
        box = legend.get_window_extent()
        assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes if ax.axison)
    for artist in fig.findobj(lambda a: a.get_gid() == "published"):
        if isinstance(artist, matplotlib.lines.Line2D):
            assert to_rgba(artist.get_color()) == to_rgba("black")
            assert artist.get_linestyle() in ("--", "None")  # a line, or an error bar's caps
        elif isinstance(artist, matplotlib.collections.PathCollection):
            assert to_rgba(artist.get_facecolor()[0]) == to_rgba("black")
    assert any(t.get_gid() == style.SETTING_ID and t.get_text().startswith("Setting: ") for t in fig.texts)


def test_a_policy_has_its_colour_in_every_figure(figure_tables):  # noqa: F811
    for name in ("lina_step_speedup", "a2a_share_vs_experts"):
        legend = _drawn(name, figure_tables).legends[0]
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            policy = text.get_text().removeprefix("policy: ")
            if policy in style.POLICY_COLOURS:
                drawn = handle.get_facecolor() if hasattr(handle, "get_facecolor") else handle.get_color()
                assert to_rgba(drawn) == to_rgba(style.colour("policy", policy)), (name, policy)


def test_log_axes_read_plain_numbers_and_published_marks_stay_ungrouped():
    """A log axis left with matplotlib's ticks reads 1, 2, 5, 10 after finish (not 10^0); chosen ticks
    stay; a published mark drawn after a subtitled legend group is not put in that group."""
    fig = Figure()
    ax, chosen = fig.subplots(1, 2)
    ax.plot([1, 2, 4], [0.9, 3.0, 9.0], label="a")
    ax.set_yscale("log")
    chosen.set_xscale("log", base=2)
    chosen.set_xticks([1, 2, 4], ["one", "two", "four"])
    ax.legend(title="path")
    style.published_point(ax, 2, 2.0, "published: x")
    style.finish(fig, None)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if 0.9 <= t.get_position()[1] <= 9.0]
    assert labels == ["1", "2", "5"]
    assert [t.get_text() for t in chosen.get_xticklabels()] == ["one", "two", "four"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["path: a", "published: x"]
