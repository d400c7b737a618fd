"""GShard (arXiv 2006.16668): the figure of its MoE layer's training step, broken down by phase
(results/figures/gshard/). The published numbers it is compared with are Lina's (analysis/papers/lina.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.figures import figure, train_step_rows

STEP_COMPONENTS_MS = ["gate_ms", "dispatch_a2a_ms", "expert_ms", "combine_a2a_ms", "dense_ms", "allreduce_exposed_ms"]


@figure(paper="gshard")
def step_breakdown(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Stacked median phase times per step vs experts; one panel per policy × world size."""
    df = train_step_rows(records, [*STEP_COMPONENTS_MS, "step_ms"], shown=["policy", "world_size", "num_experts"])
    policies, sizes = sorted(df["policy"].unique()), sorted(df["world_size"].unique())
    fig.set_size_inches(1.0 + 3.2 * len(sizes), 0.6 + 2.8 * len(policies))
    axes = fig.subplots(len(policies), len(sizes), sharey=True, squeeze=False)
    colors = dict(zip(STEP_COMPONENTS_MS, sns.color_palette("colorblind", len(STEP_COMPONENTS_MS))))
    for (i, policy), (j, world_size) in itertools.product(enumerate(policies), enumerate(sizes)):
        ax, panel = axes[i, j], df[(df["policy"] == policy) & (df["world_size"] == world_size)]
        ax.set_title(f"{policy}, {world_size} ranks")
        if panel.empty:  # a sweep that skipped this combination
            ax.set_axis_off()
            continue
        ax.set_xlabel("experts (total)")
        ax.set_ylabel("time per step (ms, median)" if j == 0 else "")
        # median over seeds of each point's median
        ms = panel.pivot_table(index="num_experts", columns="metric", values="value", aggfunc="median")
        p95 = panel[panel["metric"] == "step_ms"].groupby("num_experts")["p95"].median()
        x, bottom = np.arange(len(ms)), np.zeros(len(ms))
        for name in STEP_COMPONENTS_MS:
            ax.bar(x, ms[name], bottom=bottom, color=colors[name], label=name)
            bottom += ms[name].to_numpy()
        ax.scatter(x, p95.reindex(ms.index), marker="_", s=300, color="black", zorder=3, label="step_ms p95")
        ax.set_xticks(x, [str(n) for n in ms.index])
    fig.suptitle("Training step time by phase (GShard MoE layer)")
    handles, labels = next(ax.get_legend_handles_labels() for ax in axes.flat if ax.axison)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), title="phase")
