"""Lina's figures of the training all-to-all's share and slowdown (Figs 3-4), measured on this machine
and simulated on Lina's testbed."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from analysis.collect import select
from analysis.papers.lina.contention import contended_slowdowns
from analysis.papers.lina.testbed import LINA_TESTBED
from analysis.published import load_registry, published_value
from analysis.registry import FigureDataError, figure, one_testbed, train_step_rows
from analysis.style import palette, published_line

BASELINE_POLICIES = ["sequential", "overlap"]  # the paper-scale sweep's policies (Lina's are figures of their own)
LINA_FIG3_ENTRY_IDS = {"median": "lina-fig3-a2a-slowdown-median", "worst": "lina-fig3-a2a-slowdown-worst"}


@figure(paper="lina")
def a2a_share_vs_experts(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """All-to-all share of step time vs experts, with the all-to-all data per rank dotted (Lina Fig 4)."""
    df = train_step_rows(records, ["a2a_share", "a2a_bytes"], shown=["policy", "world_size", "num_experts"])
    share = df[df["metric"] == "a2a_share"].assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(
        share,
        x="num_experts",
        y="a2a_share_pct",
        hue="policy",
        palette=palette("policy", share["policy"]),
        style="world_size",
        markers=True,
        dashes=False,
        estimator="median",
        errorbar=None,
        ax=ax,
    )
    ax.set(
        xlabel="experts (total)",
        ylabel="all-to-all share of step time (%, median)",
        title="All-to-all share of step time vs number of experts",
    )
    table1 = published_value(load_registry(), "lina-table1-a2a-share-of-step")
    published_line(ax, table1, f"published: Lina Table 1, {table1:g}% (mean of its models)")
    ax.legend()
    data_mb = df[df["metric"] == "a2a_bytes"].groupby(["world_size", "num_experts"])["value"].median() / 1e6
    twin = ax.twinx()
    grays = sns.color_palette("Greys", data_mb.index.get_level_values("world_size").nunique() + 1)[1:]
    for (world_size, line), color in zip(data_mb.groupby(level="world_size"), grays):
        twin.plot(
            line.index.get_level_values("num_experts"),
            line.to_numpy(),
            ls=":",  # dotted: a dash is a published number (analysis/style.py)
            marker=".",
            color=color,
            label=f"a2a data, {world_size} ranks (right axis)",
        )
    twin.set_ylabel("all-to-all data sent per rank per step (MB)")
    twin.grid(False)
    twin.legend()
    experts = sorted(share["num_experts"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(experts, [str(n) for n in experts])
    ax.xaxis.set_minor_locator(NullLocator())
    return df


@figure(paper="lina")
def a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Empirical CDF of all-to-all slowdown next to an all-reduce, with Lina's Fig 3 numbers."""
    s = contended_slowdowns(samples)
    if s.empty:
        raise FigureDataError(
            "the samples table has no slowdown samples of all_to_all/all_to_all_v "
            ">= 1 MiB with a concurrent all_reduce; run the collectives sweep with "
            "concurrent: all_reduce and collect its records"
        )
    s = one_testbed(s)
    _slowdown_cdf(
        fig.subplots(),
        s,
        "collective",
        "fraction of iterations (CDF)",
        "All-to-all slowdown under a concurrent all-reduce",
    )
    return s


@figure(paper="lina")
def sim_a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Simulated backward all-to-all slowdowns (overlap / sequential) on Lina's testbed, every one as a dot
    per cluster size with its median (the name is the CDF it was)."""
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", hardware=LINA_TESTBED)
    if s.empty:
        raise FigureDataError(
            f"the samples table has no a2a_bwd_slowdown samples of sim_train_step on "
            f"{LINA_TESTBED}; run the simulated sweep with policy overlap and collect it"
        )
    s = s.astype({"world_size": int})
    # A step has a few backward all-to-alls (2-4 at these sizes): every one as a dot, per cluster size,
    # with its median; a CDF of so few steps hides sizes whose values coincide.
    sizes = sorted(s["world_size"].unique())
    ax = fig.subplots()
    fig.set_size_inches(7, 1.6 + 0.45 * len(sizes))
    sns.stripplot(s, x="value", y="world_size", order=sizes, orient="h", jitter=0.15, color="0.35", ax=ax)
    medians = s.groupby("world_size")["value"].median().reindex(sizes)
    ax.scatter(medians, range(len(sizes)), marker="|", s=400, color="black", zorder=3, label="median of a step's")
    _published_fig3(ax)
    ax.set(
        xlabel="backward all-to-all time with concurrent all-reduce / alone (×)",
        ylabel="GPUs (= experts)",
        title=f"Simulated all-to-all slowdown under DDP all-reduce ({LINA_TESTBED})",
    )
    ax.legend()
    return s


def _slowdown_cdf(ax, s: pd.DataFrame, hue: str, ylabel: str, title: str) -> None:
    """Empirical CDF of the slowdown samples ``s``, one line per ``hue``, with Lina's Fig 3 median and worst."""
    for key, group in s.groupby(hue):
        sns.ecdfplot(group, x="value", ax=ax, label=f"{hue} {key} (n={len(group)})")
    _published_fig3(ax)
    ax.set(xlabel="all-to-all time with concurrent all-reduce / alone (×)", ylabel=ylabel, title=title)
    ax.legend()


def _published_fig3(ax) -> None:
    """Lina Fig 3's published median and worst slowdown as vertical lines, each named at its foot."""
    registry = load_registry()
    for name, entry_id in LINA_FIG3_ENTRY_IDS.items():
        value = published_value(registry, entry_id)
        published_line(ax, value, f"published: Lina Fig 3 {name}, {value:g}×", horizontal=False)
        ax.annotate(
            f"Fig 3 {name}",
            (value, 0.02),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            rotation=90,
            fontsize=7,
        )


@figure(paper="lina")
def sim_a2a_share_vs_cluster_size(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Simulated all-to-all share of step time vs GPUs (experts = GPUs), per cluster and policy."""
    df = select(records, experiment="sim_train_step", metric="a2a_share")
    df = df[df["policy"].isin(BASELINE_POLICIES)] if not df.empty else df
    if df.empty:
        raise FigureDataError("the records table has no sim_train_step a2a_share rows; run the simulated sweep")
    df = df.astype({"world_size": int}).assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(
        df,
        x="world_size",
        y="a2a_share_pct",
        hue="hardware",
        palette=palette("testbed", df["hardware"]),
        style="policy",
        markers=True,
        estimator="median",
        errorbar=None,
        ax=ax,
    )
    sizes = sorted(df["world_size"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(
        xlabel="GPUs (= experts)",
        ylabel="all-to-all share of step time (%, simulated)",
        title="All-to-all share of step time vs cluster size (simulated)",
    )
    return df
