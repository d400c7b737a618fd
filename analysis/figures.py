"""Figures from the tidy tables, each saved as PNG and PDF (same stem).

Every figure is a function ``f(records, samples, fig)`` that draws into an empty matplotlib Figure and
raises FigureDataError, before anything is written, when the tables lack its data.

    python -m analysis.figures --records results/tables/records.csv --samples results/tables/samples.csv \
        --figure step_breakdown --out results/figures/gshard/step_breakdown.png
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from analysis.collect import param_columns, select
from analysis.compare import (LINA_PATH_LENGTH, LINA_POLICIES_SHOWN, POINT_KEYS, TESTBED, contended_slowdowns,
                              lina_speedups, tail_a2a_reduction)
from analysis.files import read_tables
from moe_core.results import atomic_output
from analysis.published import load_registry, published_value
from analysis.units import format_bytes

matplotlib.use("Agg")  # files only, no display

DPI = 150
STEP_COMPONENTS_MS = ["gate_ms", "dispatch_a2a_ms", "expert_ms", "combine_a2a_ms", "dense_ms",
                      "allreduce_exposed_ms"]
LINA_FIG3 = {"median": "lina-fig3-a2a-slowdown-median", "worst": "lina-fig3-a2a-slowdown-worst"}
LINA_TESTBED = "lina-a100-4x4"
BASELINES = ["sequential", "overlap"]  # the paper-scale sweep's policies (Lina's are figures of their own)  # configs/hardware: Lina's 4 x 4 A100, 100 Gb/s IB per node


class FigureDataError(ValueError):
    """The tables lack the data a figure needs."""


# ---- selecting data ---------------------------------------------------------------------------

def _one_testbed(df: pd.DataFrame) -> pd.DataFrame:
    """Measured and simulated numbers, or two machines' numbers, must not be pooled in one figure."""
    testbeds = df[TESTBED].drop_duplicates()
    if len(testbeds) > 1:
        found = "; ".join(" ".join(map(str, tb)) for tb in testbeds.itertuples(index=False))
        raise FigureDataError(f"the data come from several testbeds ({found}); collect one testbed's "
                              "records (one mode, backend and hardware) into the tables for this figure")
    return df


def _train_step(records: pd.DataFrame, metrics: list[str], shown: list[str]) -> pd.DataFrame:
    """gshard/train_step rows of ``metrics``; every swept parameter not ``shown`` (but seed) must be fixed."""
    df = select(records, paper="gshard", experiment="train_step")
    missing = sorted(set(metrics) - set(df["metric"]))
    if missing:
        raise FigureDataError(f"the records table has no gshard/train_step rows of {missing}; collect "
                              "results/raw/gshard/train_step/*.json into it first")
    df = _one_testbed(df[df["metric"].isin(metrics)]).astype({"num_experts": int, "world_size": int})
    hidden = [c for c in param_columns(df) if c not in shown and c != "seed"]
    counts = df.groupby([*shown, "metric"])[hidden].nunique(dropna=False)
    varying = [c for c in hidden if (counts[c] > 1).any()]
    if varying:
        raise FigureDataError(f"parameters {varying} vary within one bar or line of this figure; "
                              "collect only records that share one value of each")
    return df


def _collectives(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Collectives measured alone (no concurrent all-reduce)."""
    df = select(records, paper="common", experiment="collectives", metric=metric)
    df = df if df.empty else df[df["concurrent"].isna()]
    if df.empty:
        raise FigureDataError(f"the records table has no common/collectives rows of {metric} measured alone; "
                              "collect results/raw/common/collectives/*.json into it first")
    return _one_testbed(df).astype({"size_bytes": int, "world_size": int})


# ---- figures ----------------------------------------------------------------------------------

def step_breakdown(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Stacked median phase times per step vs experts; one panel per policy × world size."""
    df = _train_step(records, [*STEP_COMPONENTS_MS, "step_ms"], shown=["policy", "world_size", "num_experts"])
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


def a2a_share_vs_experts(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """All-to-all share of step time vs experts, with the all-to-all data per rank dashed (Lina Fig 4)."""
    df = _train_step(records, ["a2a_share", "a2a_bytes"], shown=["policy", "world_size", "num_experts"])
    share = df[df["metric"] == "a2a_share"].assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(share, x="num_experts", y="a2a_share_pct", hue="policy", style="world_size",
                 markers=True, dashes=False, estimator="median", errorbar=None, ax=ax)
    ax.set(xlabel="experts (total)", ylabel="all-to-all share of step time (%, median)",
           title="All-to-all share of step time vs number of experts")
    ax.legend(loc="upper left", fontsize="small")
    data_mb = df[df["metric"] == "a2a_bytes"].groupby(["world_size", "num_experts"])["value"].median() / 1e6
    twin = ax.twinx()
    grays = sns.color_palette("Greys", data_mb.index.get_level_values("world_size").nunique() + 1)[1:]
    for (world_size, line), color in zip(data_mb.groupby(level="world_size"), grays):
        twin.plot(line.index.get_level_values("num_experts"), line.to_numpy(), ls="--", marker=".",
                  color=color, label=f"a2a data, {world_size} ranks")
    twin.set_ylabel("all-to-all data sent per rank per step (MB)")
    twin.grid(False)
    twin.legend(loc="lower right", fontsize="small")
    experts = sorted(share["num_experts"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(experts, [str(n) for n in experts])
    ax.xaxis.set_minor_locator(NullLocator())


def a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Empirical CDF of all-to-all slowdown next to an all-reduce, with Lina's Fig 3 numbers."""
    s = contended_slowdowns(samples)
    if s.empty:
        raise FigureDataError("the samples table has no slowdown samples of all_to_all/all_to_all_v "
                              ">= 1 MiB with a concurrent all_reduce; run the collectives sweep with "
                              "concurrent: all_reduce and collect its records")
    _slowdown_cdf(fig.subplots(), _one_testbed(s), "collective", "fraction of iterations (CDF)",
                  "All-to-all slowdown under a concurrent all-reduce")


def sim_a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Simulated backward all-to-all slowdown (overlap / sequential) on Lina's testbed, per cluster size."""
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", hardware=LINA_TESTBED)
    if s.empty:
        raise FigureDataError(f"the samples table has no a2a_bwd_slowdown samples of sim_train_step on "
                              f"{LINA_TESTBED}; run the simulated sweep with policy overlap and collect it")
    s = s.astype({"world_size": int})
    _slowdown_cdf(fig.subplots(), s, "world_size", "fraction of backward all-to-alls (CDF)",
                  f"Simulated all-to-all slowdown under DDP all-reduce ({LINA_TESTBED})")


def _slowdown_cdf(ax, s: pd.DataFrame, hue: str, ylabel: str, title: str) -> None:
    for key, group in s.groupby(hue):
        sns.ecdfplot(group, x="value", ax=ax, label=f"{hue} {key} (n={len(group)})")
    registry = load_registry()
    for (name, entry_id), ls in zip(LINA_FIG3.items(), (":", "--")):
        value = published_value(registry, entry_id)
        ax.axvline(value, color="black", ls=ls, label=f"Lina Fig 3 {name} ({value:g}×)")
    ax.set(xlabel="all-to-all time with concurrent all-reduce / alone (×)", ylabel=ylabel, title=title)
    ax.legend(loc="lower right", fontsize="small")


def sim_a2a_share_vs_cluster_size(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Simulated all-to-all share of step time vs GPUs (experts = GPUs), per cluster and policy."""
    df = select(records, experiment="sim_train_step", metric="a2a_share")
    df = df[df["policy"].isin(BASELINES)] if not df.empty else df
    if df.empty:
        raise FigureDataError("the records table has no sim_train_step a2a_share rows; run the simulated sweep")
    df = df.astype({"world_size": int}).assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(df, x="world_size", y="a2a_share_pct", hue="hardware", style="policy", markers=True,
                 estimator="median", errorbar=None, ax=ax)
    sizes = sorted(df["world_size"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="GPUs (= experts)", ylabel="all-to-all share of step time (%, simulated)",
           title="All-to-all share of step time vs cluster size (simulated)")
    ax.legend(fontsize="small")


def busbw_vs_size(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Bus bandwidth vs message size per collective, measured alone (nccl-tests style)."""
    df = _collectives(records, "busbw_GBps")
    ax = fig.subplots()
    sns.lineplot(df, x="size_bytes", y="value", hue="collective", style="world_size", markers=True,
                 estimator="median", errorbar=None, ax=ax)
    ax.set(xlabel="message size per rank", ylabel="bus bandwidth (GB/s, median)",
           title="Bus bandwidth vs message size (collectives alone)")
    ax.set_xscale("log", base=2)
    sizes = sorted(df["size_bytes"].unique())
    ticks = sizes[:: -(-len(sizes) // 8)]  # at most 8 labels
    ax.set_xticks(ticks, [format_bytes(n) for n in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize="small")



# ---- Lina's speedups (simulated on its testbed; measured on this machine) -----------------------

def lina_step_speedup(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Step-time speedup over DDP-style overlap per Lina policy vs experts (= GPUs): Lina's Fig 10
    (policy lina) and its cumulative ablation (Fig 14), one panel per testbed, with Fig 10's averages."""
    panels = [(tb, lina_speedups(select(records, **tb), "step_ms"))
              for tb in records[TESTBED].drop_duplicates().to_dict("records")]
    panels = [(tb, df) for tb, df in panels if not df.empty]
    if not panels:
        raise FigureDataError("the records table has no step_ms of Lina policies next to overlap with experts = "
                              "GPUs; run the lina sweeps (configs/default.yaml: lina) and collect them")
    registry = load_registry()
    for ax, (tb, df) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        experts = sorted(df["experts"].unique())
        sns.barplot(df, x="experts", y="speedup", hue="policy", order=experts,
                    hue_order=[p for p in LINA_POLICIES_SHOWN if p in set(df["policy"])], ax=ax)
        for i, n in enumerate(experts):
            entry = f"lina-fig10-step-speedup-{n}e"
            if entry in registry:
                ax.plot([i - 0.4, i + 0.4], [published_value(registry, entry)] * 2, color="black", ls="--",
                        label="Lina Fig 10: lina vs DeepSpeed" if i == 0 else None)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(xlabel="experts (= GPUs)", ylabel="step-time speedup over overlap (×)",
               title=f"{tb['mode']} on {tb['hardware']}")
        ax.legend(fontsize="x-small")


LINA_FIGS_11_13 = [  # metric, panel title, registry ids "<prefix>-<n>e" of the published values
    ("moe_layer_fwd_ms", "MoE layers, forward (Fig 11)", "lina-fig11-moe-fwd-speedup"),
    ("moe_layer_bwd_ms", "MoE layers, backward (Fig 12)", "lina-fig12-moe-bwd-speedup"),
    ("a2a_bwd_ms", "backward all-to-all (Fig 13)", "lina-fig13-bwd-a2a-speedup"),
]


def lina_moe_speedup(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Policy lina over overlap on Lina's testbed (simulated), per experts (= GPUs): the MoE layers'
    forward (Fig 11) and backward (Fig 12) wall time and the backward all-to-all time (Fig 13), with
    the published speedups where the paper gives them."""
    sim = select(records, experiment="sim_train_step", hardware=LINA_TESTBED)
    panels = []
    for metric, title, prefix in LINA_FIGS_11_13:
        df = lina_speedups(sim, metric)
        panels.append((metric, title, prefix, df[df["policy"] == "lina"] if not df.empty else df))
    if all(df.empty for *_, df in panels):
        raise FigureDataError(f"the records table has no simulated {'/'.join(m for m, *_ in LINA_FIGS_11_13)} of "
                              f"policy lina next to overlap on {LINA_TESTBED}; run the lina sweep and collect it")
    registry = load_registry()
    fig.set_size_inches(12, 4)
    axes = fig.subplots(1, len(panels))  # own scales: packing can all but remove an all-to-all
    for ax, (metric, title, prefix, df) in zip(axes, panels):
        ax.set_title(title)
        if df.empty:  # records from before the metric existed
            ax.text(0.5, 0.5, f"no {metric}", ha="center", transform=ax.transAxes)
            continue
        experts = sorted(df["experts"].unique())
        sns.barplot(df, x="experts", y="speedup", order=experts, color=sns.color_palette("colorblind")[0],
                    errorbar=None, ax=ax)
        for i, n in enumerate(experts):
            if f"{prefix}-{n}e" in registry:
                ax.plot([i - 0.4, i + 0.4], [published_value(registry, f"{prefix}-{n}e")] * 2, color="black", ls="--",
                        label="Lina vs DeepSpeed (published)")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(xlabel="experts (= GPUs)", ylabel="speedup of lina over overlap (×)")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles[:1], labels[:1], fontsize="x-small")
    fig.suptitle(f"Lina's MoE layers and backward all-to-all (simulated, {LINA_TESTBED})")


def lina_partition_sweep(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Step time of policy lina vs micro-op (partition) size at the largest expert count (Lina Fig 15)."""
    df = select(records, experiment="sim_train_step", hardware=LINA_TESTBED, policy="lina", metric="step_ms")
    if df.empty:
        raise FigureDataError(f"the records table has no simulated step_ms of policy lina on {LINA_TESTBED}; "
                              "run the lina partition sweep and collect it")
    df = df[df["num_experts"] == df["num_experts"].max()]
    ax = fig.subplots()
    sns.lineplot(df, x="partition_mb", y="value", marker="o", ax=ax)
    ax.set(xlabel="micro-op (partition) size (MB)", ylabel="step time (ms, simulated)",
           title=f"Lina step time vs partition size, {int(df['num_experts'].iloc[0])} experts ({LINA_TESTBED})")


INFERENCE_POLICIES = ("ideal", "static", "lina", "lina-no-estimation", "lina-no-finetune")


def _normalised_to_ideal(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Median and p95 of ``metric`` per policy over the ideal policy's median in the same run, long
    form (policy, num_experts, statistic, normalised)."""
    df = select(records, paper="lina", experiment="inference", metric=metric, path_length=LINA_PATH_LENGTH)
    if df.empty:
        return df.assign(statistic=[], normalised=[])
    keys = [k for k in POINT_KEYS if k in df]
    ideal = df[df["policy"] == "ideal"][[*keys, "median"]].rename(columns={"median": "ideal_median"})
    df = df.merge(ideal, on=keys)
    long = df.melt(id_vars=["policy", "num_experts", "ideal_median"], value_vars=["median", "p95"],
                   var_name="statistic", value_name="ms")
    return long.assign(normalised=long["ms"] / long["ideal_median"])


def lina_inference(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Measured inference per placement policy, one row per expert count: whole inference time (Fig
    16) and the MoE layers' time (Fig 17), median and p95 normalised to a perfectly balanced gate's
    median; and each MoE layer's p95 all-to-all time, static vs lina (Fig 18)."""
    rows = select(records, paper="lina", experiment="inference")
    if rows.empty or not {"forward_ms", "moe_layer_ms"} & set(rows["metric"]):
        raise FigureDataError("the records table has no lina inference forward_ms / moe_layer_ms rows; run "
                              "experiments/inference.py (rule lina_inference) and collect its records")
    _one_testbed(rows)
    panels = [(_normalised_to_ideal(records, "forward_ms"), "whole inference time (Fig 16)"),
              (_normalised_to_ideal(records, "moe_layer_ms"), "MoE layers' time (Fig 17)")]
    tails = tail_a2a_reduction(records)
    experts = sorted({int(n) for df, _ in panels for n in df["num_experts"].unique()} |
                     {int(n) for n in tails["num_experts"].unique()})
    if not experts:
        raise FigureDataError(f"the lina inference records have no ideal policy at path length {LINA_PATH_LENGTH} "
                              "to normalise to, nor per-layer all-to-all times")
    fig.set_size_inches(15, 0.8 + 3.6 * len(experts))
    axes = fig.subplots(len(experts), 3, squeeze=False)
    for row, n in zip(axes, experts):
        for ax, (df, what) in zip(row[:2], panels):
            df = df[df["num_experts"] == n]
            ax.set_title(f"{n} experts: {what}")
            if df.empty:
                ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
                continue
            order = [p for p in INFERENCE_POLICIES if p in set(df["policy"])]
            sns.barplot(df, x="policy", y="normalised", hue="statistic", order=order, errorbar=None, ax=ax)
            ax.axhline(1.0, color="0.5", lw=0.8)
            ax.tick_params(axis="x", labelrotation=20, labelsize="x-small")
            ax.set(xlabel="placement policy", ylabel="time / ideal's median (×)")
            ax.legend(fontsize="x-small")
        _tail_a2a_panel(row[2], tails[tails["num_experts"] == n] if not tails.empty else tails, n)
    fig.suptitle(f"Lina inference, path length {LINA_PATH_LENGTH}, {rows['backend'].iloc[0]} on "
                 f"{rows['hardware'].iloc[0]}, {_span_text(rows['world_size'])} ranks")


def _tail_a2a_panel(ax, tails: pd.DataFrame, experts: int) -> None:
    """p95 all-to-all time per MoE layer, static vs lina, with the reduction's mean and max (Fig 18)."""
    if tails.empty:
        ax.set_title(f"{experts} experts: tail all-to-all per layer (Fig 18)")
        ax.text(0.5, 0.5, "no per-layer all-to-all times", ha="center", transform=ax.transAxes)
        return
    long = tails.melt(id_vars=["layer"], value_vars=["p95_static", "p95_lina"], var_name="policy", value_name="p95_ms")
    long["policy"] = long["policy"].str.removeprefix("p95_")
    sns.barplot(long, x="layer", y="p95_ms", hue="policy", hue_order=["static", "lina"], errorbar=None, ax=ax)
    ax.set(xlabel="MoE layer", ylabel="p95 all-to-all time per batch (ms)",
           title=f"{experts} experts: tail all-to-all per layer (Fig 18); static / lina "
                 f"mean {tails['reduction'].mean():.2f}×, max {tails['reduction'].max():.2f}×")
    ax.title.set_fontsize("small")
    ax.legend(fontsize="x-small")


def _span_text(values: pd.Series) -> str:
    return ", ".join(str(int(v)) for v in sorted(values.unique()))


def sim_validation(validation: pd.DataFrame, fig: Figure) -> None:
    """Predicted vs measured time of every held-out point, with the +-10% target band."""
    if validation.empty:
        raise FigureDataError("the validation table is empty; run experiments/validate.py on measured records")
    ax = fig.subplots()
    lo = 0.8 * min(validation["measured_ms"].min(), validation["predicted_ms"].min())
    hi = 1.25 * max(validation["measured_ms"].max(), validation["predicted_ms"].max())
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="±10%")
    ax.plot(line, line, color="black", lw=0.8, label="predicted = measured")
    errors = validation.groupby("experiment")["rel_error"].apply(lambda e: e.abs().median())
    hue = validation["experiment"].map(lambda e: f"{e} (median |error| {errors[e]:.0%})")
    sns.scatterplot(validation, x="measured_ms", y="predicted_ms", hue=hue, ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="measured (ms, median)", ylabel="simulated (ms)",
           title=f"Simulator vs held-out measurements ({', '.join(sorted(validation['hardware'].unique()))})")
    ax.legend(fontsize="small")


# ---- Aurora (arXiv 2410.17043) -----------------------------------------------------------------

AURORA_SETTINGS = ("exclusive-homogeneous", "exclusive-heterogeneous", "colocated-homogeneous",
                   "colocated-heterogeneous")
# Fig 11's published speedup range per setting (registry ids: lower end or None for "up to", upper end).
AURORA_FIG11 = {
    "exclusive-homogeneous": ("Fig 11a, vs SJF", None, "aurora-fig11a-speedup-vs-sjf-max"),
    "exclusive-heterogeneous": ("Fig 11b, vs RGA", "aurora-fig11b-speedup-vs-rga-min", "aurora-fig11b-speedup-vs-rga-max"),
    "colocated-homogeneous": ("Fig 11c, vs Lina", "aurora-fig11c-speedup-vs-lina-min", "aurora-fig11c-speedup-vs-lina-max"),
    "colocated-heterogeneous": ("Fig 11d, vs Lina", "aurora-fig11d-speedup-vs-lina-min", "aurora-fig11d-speedup-vs-lina-max"),
}


def _aurora(records: pd.DataFrame, experiment: str, metric: str, mode: str = "simulated") -> pd.DataFrame:
    """aurora/<experiment> rows of ``metric`` in ``mode`` (simulated records come from two network
    profiles, homogeneous and heterogeneous, of one system model, so they are shown together)."""
    df = select(records, paper="aurora", experiment=experiment, metric=metric, mode=mode)
    if df.empty:
        raise FigureDataError(f"the records table has no {mode} aurora/{experiment} rows of {metric}; run "
                              f"experiments/aurora{'_a2a' if mode == 'measured' else ''}.py and collect its records")
    return df


def _span_int(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _published_band(ax, registry: dict, low_id: str | None, high_id: str, label: str) -> None:
    """Shade a published speedup range (from 1x for an "up to" number)."""
    low = published_value(registry, low_id) if low_id else 1.0
    high = published_value(registry, high_id)
    ax.axhspan(low, high, color="0.85", zorder=0, label=f"published {label}: {low:g}–{high:g}×")


def aurora_order_speedup(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Transmission orders over T*, then Aurora's speedup over each baseline in the four settings (Fig 11)."""
    order = _aurora(records, "aurora_order", "a2a_over_lower_bound")
    order = order[order["workload"] != "fig4-toy"]
    speedup = _aurora(records, "aurora_deployment", "aurora_speedup")
    registry = load_registry()
    fig.set_size_inches(15, 8)
    axes = fig.subplots(2, 3).flat
    sns.boxplot(order, x="policy", y="value", hue="network", order=["naive", "sjf", "rcs", "aurora", "exact"],
                ax=axes[0])
    axes[0].axhline(1.0, color="black", lw=0.8)
    axes[0].set(xlabel="transmission order (aurora = Algorithm 1, exact = BvN)",
                ylabel="dispatch all-to-all time / T*", title="Orders vs the lower bound (all workloads, layers)")
    for ax, setting in zip(axes[1:], AURORA_SETTINGS):
        label, low_id, high_id = AURORA_FIG11[setting]
        panel = speedup[speedup["setting"] == setting]
        _published_band(ax, registry, low_id, high_id, label)
        if panel.empty:
            ax.set_title(f"{setting}: no data")
            continue
        sns.barplot(panel, x="workload", y="value", hue="policy", errorbar=None, ax=ax)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.tick_params(axis="x", labelrotation=30, labelsize="x-small")
        ax.set(xlabel="workload (model a+b when colocated)", ylabel="Aurora's speedup (x, inference time)",
               title=setting)
        ax.set_ylim(0, 1.4 * max(panel["value"].max(), published_value(registry, high_id)))  # room for the legend
        ax.legend(fontsize="x-small", title="baseline", title_fontsize="x-small", loc="upper left", ncol=2)
    axes[5].set_axis_off()
    fig.suptitle("Aurora on its big-switch model: transmission order and deployment speedups (simulated)")


def aurora_gpu_utilisation(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """GPU utilisation of Aurora's colocation vs Aurora exclusive vs Lina (Fig 12a/b)."""
    df = _aurora(records, "aurora_deployment", "gpu_utilisation")
    df = df[df["deployment"] == "colocated"].assign(pct=lambda d: 100 * d["value"])
    axes = fig.subplots(1, 2, sharey=True)
    fig.set_size_inches(11, 4.5)
    for ax, net in zip(axes, ("homogeneous", "heterogeneous")):
        panel = df[df["network"] == net]
        sns.barplot(panel, x="workload", y="pct", hue="policy", errorbar=None, ax=ax,
                    hue_order=[p for p in ("aurora", "aurora-exclusive", "lina", "rec", "rga+rec")
                               if p in set(panel["policy"])])
        ax.tick_params(axis="x", labelrotation=30, labelsize="x-small")
        ax.set(xlabel="models a+b", ylabel="GPU utilisation (%, compute / inference time)",
               title=f"colocated, {net} (Fig 12{'a' if net == 'homogeneous' else 'b'})")
        ax.legend(fontsize="x-small")


def aurora_gap_to_optimum(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Section 7's colocation heuristic over the brute-force optimum, per instance (Fig 13)."""
    df = _aurora(records, "aurora_gap", "gap_to_optimum").astype({"layer": int, "n_gpus": int})
    ax = fig.subplots()
    sns.stripplot(df, x="workload", y="value", hue="layer", ax=ax, size=6, jitter=0.15)
    mean = df["value"].mean()
    ax.axhline(mean, color="black", ls="--", label=f"mean here {mean:.3f}×")
    published = published_value(load_registry(), "aurora-fig13-gap-to-optimum-mean")
    ax.axhline(published, color="black", ls=":", label=f"published mean {published:g}×")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.tick_params(axis="x", labelrotation=20, labelsize="x-small")
    ax.set(xlabel="models a+b", ylabel="heuristic / optimum (busiest GPU's time)",
           title=f"Gap to the brute-force optimum, colocated heterogeneous, {_span_int(df['n_gpus'])} GPUs")
    ax.legend(fontsize="x-small", ncol=2, title="MoE layer", title_fontsize="x-small")


def aurora_imprecision(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Aurora's speedup over the random baselines when it plans on imprecise traffic (Fig 14)."""
    df = _aurora(records, "aurora_imprecision", "aurora_speedup").assign(pct=lambda d: 100 * d["imprecision"])
    axes = fig.subplots(1, 2, sharey=True)
    fig.set_size_inches(11, 4.5)
    for ax, (setting, panel) in zip(axes, df.groupby("setting")):
        sns.lineplot(panel, x="pct", y="value", hue="workload", marker="o", ax=ax)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set(xlabel="traffic imprecision (%): plan on (1-p) D_l + p D_l+1", ylabel="Aurora's speedup (x)",
               title=f"{setting} vs {panel['baseline'].iloc[0].upper()}")
        ax.legend(fontsize="x-small")


def aurora_ordered_vs_library(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> None:
    """Measured dispatch all-to-alls of a forward pass: all_to_all_single vs each Aurora order."""
    df = _one_testbed(_aurora(records, "aurora_a2a", "a2a_ms", mode="measured"))
    ax = fig.subplots()
    order = [p for p in ("library", "aurora", "exact", "sjf", "rcs") if p in set(df["policy"])]
    sns.barplot(df, x="workload", y="value", hue="policy", hue_order=order, errorbar=None, ax=ax)
    workloads = list(dict.fromkeys(df["workload"]))
    width = 0.8 / len(order)
    for i, policy in enumerate(order):
        rows = df[df["policy"] == policy].set_index("workload").reindex(workloads)
        x = np.arange(len(workloads)) - 0.4 + width * (i + 0.5)
        ax.scatter(x, rows["p95"], marker="_", s=120, color="black", zorder=3, label="p95" if i == 0 else None)
    ws, backend, hw = df["world_size"].iloc[0], df["backend"].iloc[0], df["hardware"].iloc[0]
    ax.set(xlabel="gating trace", ylabel="dispatch all-to-alls per forward (ms, median, worst rank)",
           title=f"Ordered all-to-all vs library, {int(ws)} ranks, {backend} on {hw}")
    ax.legend(fontsize="small")


FIGURES = {f.__name__: f for f in (step_breakdown, a2a_share_vs_experts, a2a_slowdown_cdf, busbw_vs_size,
                                  sim_a2a_share_vs_cluster_size, sim_a2a_slowdown_cdf,
                                  lina_step_speedup, lina_moe_speedup, lina_partition_sweep, lina_inference,
                                  aurora_order_speedup, aurora_gpu_utilisation, aurora_gap_to_optimum,
                                  aurora_imprecision, aurora_ordered_vs_library)}
VALIDATION_FIGURES = {"sim_validation": sim_validation}  # drawn from results/tables/sim_validation.csv


def render(name: str, records: pd.DataFrame, samples: pd.DataFrame, out_png: str | Path,
           validation: pd.DataFrame | None = None) -> list[Path]:
    """Draw figure ``name`` and write ``out_png`` and the PDF beside it; nothing is written on error."""
    if name not in FIGURES and name not in VALIDATION_FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose one of {sorted([*FIGURES, *VALIDATION_FIGURES])}")
    if name in VALIDATION_FIGURES and validation is None:
        raise ValueError(f"figure {name!r} needs the validation table (--validation)")
    out_png = Path(out_png)
    if out_png.suffix != ".png":
        raise ValueError(f"{out_png}: the output must end in .png (the PDF is written beside it)")
    sns.set_theme(style="whitegrid", context="paper")
    fig = plt.figure(figsize=(7, 4.5))
    try:
        if name in VALIDATION_FIGURES:
            VALIDATION_FIGURES[name](validation, fig)
        else:
            FIGURES[name](records, samples, fig)
        fig.tight_layout()
        outputs = [out_png, out_png.with_suffix(".pdf")]
        for path in outputs:
            with atomic_output(path) as tmp:
                fig.savefig(tmp, format=path.suffix[1:], dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--validation", type=Path, help="validation CSV from experiments.validate")
    parser.add_argument("--figure", required=True, choices=sorted([*FIGURES, *VALIDATION_FIGURES]))
    parser.add_argument("--out", type=Path, required=True, help="PNG to write; the PDF goes beside it")
    args = parser.parse_args(argv)
    try:
        validation = pd.read_csv(args.validation) if args.validation else None
        outputs = render(args.figure, *read_tables(args.records, args.samples), args.out, validation)
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.figures: error: {err}")
    print(" ".join(map(str, outputs)))


if __name__ == "__main__":
    main()
