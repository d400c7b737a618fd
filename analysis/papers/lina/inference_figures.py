"""Lina's inference figures (Figs 16-18): per placement policy the whole inference and MoE layers' time
over a perfectly balanced gate's, and the tail all-to-all per MoE layer, measured and simulated."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.collect import select
from analysis.papers.lina.inference import INFERENCE_RUN_KEYS, LINA_PATH_LENGTH, tail_a2a_reduction
from analysis.registry import FigureDataError, figure, one_testbed
from analysis.style import palette
from analysis.units import span

LINA_INFERENCE_POLICIES_SHOWN = ("ideal", "static", "lina", "lina-no-estimation", "lina-no-finetune")


def _normalised_to_ideal(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Median and p95 of ``metric`` per policy over the ideal policy's median in the same run, long
    form (policy, num_experts, statistic, normalised)."""
    df = select(records, paper="lina", experiment="inference", metric=metric, path_length=LINA_PATH_LENGTH)
    if df.empty:
        return df.assign(statistic=[], normalised=[])
    keys = [k for k in INFERENCE_RUN_KEYS if k in df]
    ideal = df[df["policy"] == "ideal"][[*keys, "median"]].rename(columns={"median": "ideal_median"})
    df = df.merge(ideal, on=keys)
    long = df.melt(
        id_vars=["policy", "num_experts", "ideal_median"],
        value_vars=["median", "p95"],
        var_name="statistic",
        value_name="ms",
    )
    return long.assign(normalised=long["ms"] / long["ideal_median"])


@figure(paper="lina")
def lina_inference(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Measured inference per placement policy, one row per expert count: whole inference time (Fig
    16) and the MoE layers' time (Fig 17), median and p95 normalised to a perfectly balanced gate's
    median; and each MoE layer's p95 all-to-all time, static vs lina (Fig 18)."""
    return _draw_inference(select(records, mode="measured"), fig, "experiments/inference.py (rule lina_inference)")


@figure(paper="lina")
def lina_inference_simulated(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """As lina_inference, simulated at the paper's scale (experts = GPUs of Lina's testbed, synthetic
    routing with the paper's skew and path following)."""
    return _draw_inference(
        select(records, mode="simulated"),
        fig,
        "experiments/lina_inference_sim.py (rule lina_inference_simulated)",
    )


STATISTIC_GREYS = {"median": "0.35", "p95": "0.7"}  # greys: the bars' policy is on the axis, not in a colour


def _draw_inference(records: pd.DataFrame, fig: Figure, producer: str) -> pd.DataFrame:
    """The inference figure of one testbed's records; returns its rows."""
    rows = select(records, paper="lina", experiment="inference")
    if rows.empty or not {"forward_ms", "moe_layer_ms"} & set(rows["metric"]):
        raise FigureDataError(
            f"the records table has no lina inference forward_ms / moe_layer_ms rows; run {producer} and "
            "collect its records"
        )
    one_testbed(rows)
    panels = [
        (_normalised_to_ideal(records, "forward_ms"), "whole inference time (Fig 16)"),
        (_normalised_to_ideal(records, "moe_layer_ms"), "MoE layers' time (Fig 17)"),
    ]
    tails = tail_a2a_reduction(records)
    experts = sorted(
        {int(n) for df, _ in panels for n in df["num_experts"].unique()}
        | {int(n) for n in tails["num_experts"].unique()}
    )
    if not experts:
        raise FigureDataError(
            f"the lina inference records have no ideal policy at path length {LINA_PATH_LENGTH} "
            "to normalise to, nor per-layer all-to-all times"
        )
    fig.set_size_inches(13, 0.8 + 3.6 * len(experts))
    axes = fig.subplots(len(experts), 3, squeeze=False)
    for row, n in zip(axes, experts):
        for ax, (df, what) in zip(row[:2], panels):
            df = df[df["num_experts"] == n]
            ax.set_title(f"{n} experts: {what}")
            if df.empty:
                ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
                continue
            order = [p for p in LINA_INFERENCE_POLICIES_SHOWN if p in set(df["policy"])]
            sns.barplot(
                df,
                x="policy",
                y="normalised",
                hue="statistic",
                palette=STATISTIC_GREYS,
                order=order,
                errorbar=None,
                ax=ax,
            )
            ax.axhline(1.0, color="0.5", lw=0.8)
            ax.tick_params(axis="x", labelrotation=90, labelsize="x-small")  # long policy names: upright, apart
            ax.set(xlabel="placement policy", ylabel="time / ideal's median (×)")
        _tail_a2a_panel(row[2], tails[tails["num_experts"] == n] if not tails.empty else tails, n)
    fig.suptitle(
        f"Lina inference, path length {LINA_PATH_LENGTH}, {rows['backend'].iloc[0]} on "
        f"{rows['hardware'].iloc[0]}, {span(rows['world_size'])} ranks"
    )
    return rows


def _tail_a2a_panel(ax, tails: pd.DataFrame, experts: int) -> None:
    """p95 all-to-all time per MoE layer, static vs lina, with the reduction's mean and max (Fig 18)."""
    if tails.empty:
        ax.set_title(f"{experts} experts: tail all-to-all per layer (Fig 18)")
        ax.text(0.5, 0.5, "no per-layer all-to-all times", ha="center", transform=ax.transAxes)
        return
    long = tails.melt(id_vars=["layer"], value_vars=["p95_static", "p95_lina"], var_name="policy", value_name="p95_ms")
    long["policy"] = long["policy"].str.removeprefix("p95_")
    sns.barplot(
        long,
        x="layer",
        y="p95_ms",
        hue="policy",
        saturation=1,
        palette=palette("policy", long["policy"]),
        hue_order=["static", "lina"],
        errorbar=None,
        ax=ax,
    )
    step = -(-tails["layer"].nunique() // 12)  # at most 12 layer numbers, which fit side by side
    for i, label in enumerate(ax.get_xticklabels()):
        label.set_visible(i % step == 0)
    ax.set(
        xlabel="MoE layer",
        ylabel="p95 all-to-all time per batch (ms)",
        title=f"{experts} experts: tail all-to-all per layer (Fig 18); static / lina "
        f"mean {tails['reduction'].mean():.2f}×, max {tails['reduction'].max():.2f}×",
    )
    ax.title.set_fontsize("small")
