"""AxoNN (arXiv 2305.13525): its reproducers, figures (results/figures/axonn/) and grid-validation table,
from the measured grid sweep (experiments/axonn_grids.py: a small dense GPT on every 4D grid of the
world size, and the overlap ablation on one grid), the communication model's prediction for each of
its points (experiments/axonn_grid_predictions.py, on the testbed's calibrated profile; records of
their own, joined to the measured ones here) and the simulated Perlmutter runs (experiments/axonn.py:
weak scaling against a Megatron-LM-style baseline, the 2B overlap ablation and the communication
model's ranking of the 80B model's grids).

A grid is data x depth x row x col ranks (moe_core.parallel.grid), written "1x2x2x1" in that order. A step's
communication is the time the compute waits for the grid's collectives (``grid_comm_ms``) plus the
data-parallel gradient all-reduce left after the backward pass (``allreduce_exposed_ms``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from analysis.collect import TESTBED_COLUMNS, wide_points
from analysis.published import load_registry, published_value
from analysis.registry import FigureDataError, describe_testbeds, figure, one_testbed, reproducer, table
from analysis.style import mode_title, published_point, published_segment
from moe_core.papers.axonn.config import OVERLAP_VARIANTS
from moe_core.papers.axonn.sweeps import MEASURED, PAPER, PREDICTED
from moe_core.parallel.grid import GRID_AXES

GRID_COLUMNS = [f"grid_{axis}" for axis in GRID_AXES]
# A measured grid point and its prediction: the testbed's name (the measurement's mode and backend are
# not the model's) and the grid point's params, which the two records share.
PREDICTION_KEYS = ["hardware", "world_size", *GRID_COLUMNS, "overlap_variant"]
KINDS = ["all_gather", "all_reduce", "reduce_scatter"]  # the grid's collectives, as the step metrics name them
SYSTEMS = {"axonn": "AxoNN (model's best grid)", "megatron": "Megatron-LM-style (tp x pp x dp)"}
HEADLINE_MODEL, HEADLINE_GPUS = "80B", 1024  # the abstract's numbers: 80B GPT on 1024 GPUs of Perlmutter
TOP_FEW = 3  # AxoNN benchmarks the model's top few grids; validated: is the measured best among them?
RANKED_SHOWN = 12  # grids drawn in the ranking figure


# ---- selecting data ---------------------------------------------------------------------------


def _points(records: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """One row per point of axonn/<experiment> (every testbed), metrics as columns; grid sizes as
    integers (NA: a baseline's point)."""
    points = wide_points(records, PAPER, experiment)
    return points.astype({c: "Int64" for c in GRID_COLUMNS if c in points})


def _required(df: pd.DataFrame, what: str, how: str) -> pd.DataFrame:
    if df.empty:
        raise FigureDataError(f"the records table has no {what}; {how}")
    return df


def _grid_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's grid as data x depth x row x col, e.g. "1x2x2x1"."""
    return df[GRID_COLUMNS].astype("string").fillna("-").agg("x".join, axis=1)


def _testbeds(df: pd.DataFrame):
    """(hardware, that testbed's rows) per testbed of ``df``: one panel each, never pooled."""
    for testbed, rows in df.groupby(TESTBED_COLUMNS):
        yield testbed[TESTBED_COLUMNS.index("hardware")], rows


def _collective_label(name: str) -> str:
    """A breakdown metric in words: ``all_gather_depth_s`` -> ``all-gather (depth)``."""
    kind, axis = name.removesuffix("_s").rsplit("_", 1)
    return f"{kind.replace('_', '-')} ({axis})"


def _headline(records: pd.DataFrame) -> pd.DataFrame:
    """The weak-scaling points of the abstract's model and GPU count, indexed by system (axonn, megatron)."""
    df = _points(records, "axonn_scaling")
    return df if df.empty else df[(df["model"] == HEADLINE_MODEL) & (df["gpus"] == HEADLINE_GPUS)].set_index("system")


def _simulated_ablation(records: pd.DataFrame) -> pd.DataFrame:
    """The simulated overlap ablation, indexed by overlap variant."""
    df = _points(records, "axonn_ablation")
    return df if df.empty else df.set_index("overlap_variant")


def _measured_ablation(records: pd.DataFrame) -> pd.DataFrame:
    """The measured points on each testbed's ablation grid (the one measured with overlaps), every variant."""
    df = _points(records, MEASURED)
    if df.empty:
        return df
    ablated = df.loc[df["overlap_variant"] != "none", [*TESTBED_COLUMNS, *GRID_COLUMNS]].drop_duplicates()
    return df.merge(ablated, on=[*TESTBED_COLUMNS, *GRID_COLUMNS])


# ---- reproducers ------------------------------------------------------------------------------


@reproducer
def axonn_speedup_over_megatron_80b(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """How much faster AxoNN's batch is than the Megatron-LM-style baseline's, 80B GPT (0.26 = 26% faster)."""
    points = _headline(records)
    if not {"axonn", "megatron"} <= set(points.index):
        return None
    axonn, megatron = points.loc["axonn"], points.loc["megatron"]
    layout = " x ".join(f"{k} {megatron[k]:.0f}" for k in ("tp", "pp", "dp"))
    return megatron["batch_s"] / axonn["batch_s"] - 1, (
        f"{describe_testbeds(points)}, {HEADLINE_MODEL} GPT on {HEADLINE_GPUS} GPUs: batch "
        f"{megatron['batch_s']:.3g} s (Megatron-LM-style, {layout}) / {axonn['batch_s']:.3g} s "
        f"(AxoNN, grid {_grid_labels(points.loc[['axonn']]).iloc[0]}) - 1"
    )


def _system_80b(records: pd.DataFrame, system: str = "axonn") -> tuple[pd.Series, str] | None:
    """``system``'s (axonn, megatron) headline weak-scaling point and its setting in words."""
    points = _headline(records)
    if system not in points.index:
        return None
    point = points.loc[system]
    layout = f"grid {_grid_labels(points.loc[[system]]).iloc[0]}" if system == "axonn" else "Megatron-LM-style layout"
    return point, (
        f"{describe_testbeds(points.loc[[system]])}, {HEADLINE_MODEL} GPT on {HEADLINE_GPUS} GPUs, {layout}: batch "
        f"{point['batch_s']:.3g} s, {point['pflops']:.0f} PFLOP/s, {point['peak_share']:.0%} of the profile's bf16 peak"
    )


@reproducer
def axonn_peak_share_80b(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """AxoNN's share of peak FLOP/s in the headline run, 80B GPT on 1024 GPUs (0..1)."""
    found = _system_80b(records)
    return None if found is None else (found[0]["peak_share"], found[1])


@reproducer
def axonn_pflops_80b(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """AxoNN's model PFLOP/s in the headline run, 80B GPT on 1024 GPUs."""
    found = _system_80b(records)
    return None if found is None else (found[0]["pflops"], found[1])


@reproducer
def axonn_megatron_pflops_80b(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The Megatron-LM baseline's model PFLOP/s at the headline point (80B GPT, 1024 GPUs): AxoNN's
    baseline row, which the testbed fit reproduces."""
    found = _system_80b(records, "megatron")
    return None if found is None else (found[0]["pflops"], found[1])


@reproducer
def axonn_overlap_gain_2b(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The 2B model's step time without overlap over that with all three overlaps, less 1 (simulated)."""
    points = _simulated_ablation(records)
    if not {"none", "all"} <= set(points.index):
        return None
    none, every = points.loc["none"], points.loc["all"]
    if none["grid_comm_ms"] == 0:  # a grid without tensor-parallel collectives: no overlap has anything to hide
        return None
    return none["step_ms"] / every["step_ms"] - 1, (
        f"{describe_testbeds(points.loc[['none', 'all']])}, {none['model']} GPT on {none['gpus']:.0f} GPUs, grid "
        f"{_grid_labels(points.loc[['none']]).iloc[0]}: step {none['step_ms']:.0f} ms (no overlap) / "
        f"{every['step_ms']:.0f} ms (all-reduce, reduce-scatter and all-gather overlapped) - 1"
    )


def _megatron_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's Megatron layout in words, e.g. "tp 4 x pp 16 x dp 16" (NA where it has none)."""
    sizes = df[["tp", "pp", "dp"]].astype("Int64").astype("string")
    return "tp " + sizes["tp"] + " x pp " + sizes["pp"] + " x dp " + sizes["dp"]


@table(paper="axonn")
def axonn_scaling(records: pd.DataFrame) -> pd.DataFrame:
    """The simulated weak-scaling runs, AxoNN beside the Megatron-style baseline per model: layout, time
    per batch, model PFLOP/s and share of peak; for AxoNN every grid collective's time in flight, the
    part the compute stream waits for (exposed) and what the overlaps hide (the difference), and the
    data-parallel all-reduce left after the backward pass."""
    df = _points(records, "axonn_scaling")
    if df.empty:
        return df
    df["layout"] = np.where(
        df["system"] == "axonn",
        "grid " + _grid_labels(df),
        _megatron_labels(df),
    )
    columns = ["model", "parameters", "gpus", "system", "layout", "batch_s", "pflops", "peak_share"]
    for kind in KINDS:
        df[f"{kind}_hidden_ms"] = df[f"grid_{kind}_busy_ms"] - df[f"grid_{kind}_ms"]
        columns += [f"grid_{kind}_busy_ms", f"grid_{kind}_ms", f"{kind}_hidden_ms"]
    columns += ["allreduce_exposed_ms", "stage_ms", "dp_allreduce_ms", "p2p_ms"]
    return df[[c for c in columns if c in df]].sort_values(["gpus", "system"]).reset_index(drop=True)


# ---- the model's validation on measured grids ---------------------------------------------------


def _predicted_grids(records: pd.DataFrame) -> pd.DataFrame:
    """Every measured grid without overlap beside the model's prediction for it on its testbed
    (``predicted_comm_ms``, from its axonn_grid_predictions record, joined on PREDICTION_KEYS); no
    rows without both."""
    measured, predicted = _points(records, MEASURED), _points(records, PREDICTED)
    if measured.empty or predicted.empty:
        return measured.iloc[0:0]
    measured = measured[measured["overlap_variant"] == "none"]
    predicted = predicted[[*PREDICTION_KEYS, "predicted_comm_ms"]]
    return measured.merge(predicted, on=PREDICTION_KEYS, validate="many_to_one")


@table(paper="axonn")
def axonn_grid_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Every measured grid without overlap, per testbed: measured and predicted communication per step,
    their ranks, and per testbed how well the model ranks the grids (Spearman's rho; whether the
    measured best grid is among the model's top few, the ones AxoNN would benchmark)."""
    df = _predicted_grids(records)
    if df.empty:
        return df
    df = df.astype({"world_size": int})
    df["grid"] = _grid_labels(df)
    by_testbed = df.groupby(TESTBED_COLUMNS)
    df["measured_rank"] = by_testbed["comm_ms"].rank(method="min")
    df["predicted_rank"] = by_testbed["predicted_comm_ms"].rank(method="min")
    df = df.merge(_rank_agreement(df), on=TESTBED_COLUMNS)
    columns = [*TESTBED_COLUMNS, "world_size", *GRID_COLUMNS, "grid", "comm_ms", "predicted_comm_ms"]
    columns += ["measured_rank", "predicted_rank", "spearman", f"measured_best_in_model_top{TOP_FEW}"]
    return df[columns].sort_values([*TESTBED_COLUMNS, "measured_rank"]).reset_index(drop=True)


def _rank_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """Per testbed of ranked grids: Spearman's rho of measured vs predicted communication (NaN under 3
    grids), and whether a grid measured best is among the model's top few."""
    rows = []
    for testbed, grids in df.groupby(TESTBED_COLUMNS):
        rho = spearmanr(grids["comm_ms"], grids["predicted_comm_ms"]).statistic if len(grids) > 2 else np.nan
        best = grids.loc[grids["measured_rank"] == 1, "predicted_rank"].min() <= TOP_FEW
        agreement = {"spearman": rho, f"measured_best_in_model_top{TOP_FEW}": best}
        rows.append({**dict(zip(TESTBED_COLUMNS, testbed)), **agreement})
    return pd.DataFrame(rows)


@figure(paper=PAPER)
def axonn_model_validation(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Predicted vs measured communication per step of every grid without overlap, one panel per testbed."""
    table = _required(
        axonn_grid_validation(records),
        f"measured {MEASURED} points with their {PREDICTED} records",
        "run experiments/axonn_grids.py and experiments/axonn_grid_predictions.py",
    )
    panels = list(_testbeds(table))
    fig.set_size_inches(6 * len(panels), 5)
    for ax, (hardware, grids) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        _validation_panel(ax, grids)
        agreed = "yes" if grids[f"measured_best_in_model_top{TOP_FEW}"].iloc[0] else "no"
        ax.set_title(
            f"{hardware}: Spearman rho {grids['spearman'].iloc[0]:.2f}; measured best in the model's top "
            f"{TOP_FEW}: {agreed}",
            fontsize="small",
        )
    fig.suptitle("AxoNN: communication model vs measurement, per grid (data x depth x row x col), no overlap")
    return table


def _validation_panel(ax: Axes, grids: pd.DataFrame) -> None:
    """One testbed's grids: the model's top few and the rest, the measured best ringed, each labelled."""
    measured, predicted = grids["comm_ms"], grids["predicted_comm_ms"]
    top = grids["predicted_rank"] <= TOP_FEW
    ax.scatter(measured[~top], predicted[~top], color="C0", label="other grids")
    ax.scatter(measured[top], predicted[top], color="C1", marker="s", label=f"model's top {TOP_FEW}")
    best = grids["measured_rank"] == 1
    ax.scatter(measured[best], predicted[best], s=180, facecolors="none", edgecolors="C3", label="measured best")
    for x, y, grid in zip(measured, predicted, grids["grid"]):
        ax.annotate(grid, (x, y), xytext=(4, 3), textcoords="offset points", fontsize="x-small")
    ax.set(
        xlim=(0, 1.15 * measured.max()),
        ylim=(0, 1.15 * predicted.max()),
        xlabel="measured communication (ms per step, median)",
        ylabel="predicted by AxoNN's model (ms per step)",
    )
    ax.legend()


# ---- the overlap ablation -----------------------------------------------------------------------


def _breakdown(points: pd.DataFrame) -> pd.DataFrame:
    """Per overlap variant (rows in the ablation's order): compute (the step less its exposed
    communication), the exposed grid collectives by kind and the exposed data-parallel all-reduce, ms."""
    exposed = points["grid_comm_ms"] + points["allreduce_exposed_ms"]
    parts = pd.DataFrame({"compute": points["step_ms"] - exposed}, index=points.index)
    for kind in KINDS:
        parts[kind.replace("_", "-")] = points[f"grid_{kind}_ms"]
    parts["data-parallel all-reduce"] = points["allreduce_exposed_ms"]
    return parts.reindex([v for v in OVERLAP_VARIANTS if v in parts.index]).clip(lower=0)


def _breakdown_panel(ax: Axes, points: pd.DataFrame, title: str) -> None:
    """Stacked breakdown bars of one testbed's ablation, each bar's total (the step) written above it."""
    parts = _breakdown(points)
    parts.plot.bar(stacked=True, ax=ax, rot=0, width=0.7)
    for i, total in enumerate(parts.sum(axis=1)):
        ax.annotate(f"{total:.3g}", (i, total), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
    ax.set(xlabel="overlap variant", ylabel="ms per iteration (exposed parts)")
    ax.set_title(title, fontsize="small")
    ax.tick_params(axis="x", labelsize="x-small", labelrotation=25)
    ax.legend()


@figure(paper=PAPER)
def axonn_overlap_ablation(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Per-iteration breakdowns under every overlap variant: measured on one grid, simulated for the 2B model."""
    measured, simulated = _measured_ablation(records), _points(records, "axonn_ablation")
    _required(
        pd.concat([measured, simulated]), "overlap ablation", "run experiments/axonn_grids.py or experiments/axonn.py"
    )
    panels = [
        (mode_title("measured", f"{hw}, {df['world_size'].iloc[0]:.0f} ranks"), df) for hw, df in _testbeds(measured)
    ]
    panels += [
        (mode_title("simulated", f"{hw}, {df['model'].iloc[0]} GPT on {df['gpus'].iloc[0]:.0f} GPUs"), df)
        for hw, df in _testbeds(simulated)
    ]
    fig.set_size_inches(4.5 * len(panels), 4.5)
    for ax, (title, df) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        _breakdown_panel(ax, df.set_index("overlap_variant"), f"{title}, grid {_grid_labels(df).iloc[0]}")
    if panels and panels[-1][1] is not measured:
        _published_overlap_gain(fig.axes[-1], panels[-1][1].set_index("overlap_variant"))
    fig.suptitle("AxoNN: iteration time by exposed part under each overlap of the grid's collectives")
    return pd.concat([measured, simulated])


def _published_overlap_gain(ax: Axes, points: pd.DataFrame) -> None:
    """The 2B model's published overlap gain, drawn as the step it gives with every overlap: the
    simulated step without overlap over 1 + the gain, over the bar of all three overlaps."""
    variants = list(_breakdown(points).index)
    if {"none", "all"} <= set(variants):
        gain = published_value(load_registry(), "axonn-2b-overlap-gain")
        step = points.loc["none", "step_ms"] / (1 + gain)
        published_segment(ax, variants.index("all"), step, f"published: all overlaps, none / {1 + gain:g}", 0.35)


# ---- weak scaling -----------------------------------------------------------------------------


@figure(paper=PAPER)
def axonn_weak_scaling(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Time per batch and share of peak vs GPUs (and model), AxoNN vs the Megatron-LM-style baseline,
    with the published 80B point."""
    df = one_testbed(_required(_points(records, "axonn_scaling"), "axonn_scaling points", "run experiments/axonn.py"))
    df = df.assign(layout=_layouts(df), system=df["system"].map(SYSTEMS), peak_pct=100 * df["peak_share"])
    df = df.sort_values("gpus")
    fig.set_size_inches(12, 4.5)
    left, right = fig.subplots(1, 2)
    colours = {SYSTEMS["axonn"]: "C0", SYSTEMS["megatron"]: "0.45"}  # the baseline grey
    sns.lineplot(df, x="gpus", y="batch_s", hue="system", palette=colours, marker="o", ax=left)
    sns.lineplot(df, x="gpus", y="peak_pct", hue="system", palette=colours, marker="o", ax=right)
    _draw_published_80b(right)
    _label_layouts(left, df)
    ticks = df.drop_duplicates("gpus")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks["gpus"], [f"{g:.0f}\n{m}" for g, m in zip(ticks["gpus"], ticks["model"])])
        ax.minorticks_off()
        ax.set_xlabel("GPUs (A100) and GPT model (weak scaling)")
    left.set(ylabel="time per batch (s)", ylim=(0, None), title=mode_title("simulated", "time per batch"))
    right.set(ylabel="% of peak bf16 FLOP/s", ylim=(0, 100), title=mode_title("simulated", "achieved share of peak"))
    fig.suptitle("AxoNN vs Megatron-LM-style on Perlmutter: weak scaling")
    return df


def _layouts(df: pd.DataFrame) -> pd.Series:
    """Each weak-scaling point's layout: AxoNN's grid (data x depth x row x col), or the baseline's."""
    baseline = df.apply(lambda p: f"tp{p['tp']:.0f} pp{p['pp']:.0f} dp{p['dp']:.0f}", axis=1)
    return _grid_labels(df).where(df["system"] == "axonn", baseline)


def _label_layouts(ax: Axes, df: pd.DataFrame) -> None:
    """Each point's layout beside it: AxoNN's below its point, the baseline's above."""
    for gpus, batch_s, system, layout in zip(df["gpus"], df["batch_s"], df["system"], df["layout"]):
        offset = (6, -10) if system == SYSTEMS["axonn"] else (-20, 7)
        ax.annotate(layout, (gpus, batch_s), xytext=offset, textcoords="offset points", fontsize=6)


def _draw_published_80b(ax: Axes) -> None:
    """The published share of peak of the headline run, and the baseline's it implies (26% slower)."""
    registry = load_registry()
    share = 100 * published_value(registry, "axonn-80b-peak-share")
    speedup = published_value(registry, "axonn-80b-speedup-over-megatron")
    published_point(ax, HEADLINE_GPUS, share, f"published: AxoNN, {HEADLINE_MODEL}, {share:.0f}%")
    implied = f"published: Megatron-LM, {share:.0f}% / {1 + speedup:g} (implied)"
    published_point(ax, HEADLINE_GPUS, share / (1 + speedup), implied)


# ---- the model's grid ranking at scale ------------------------------------------------------------


@figure(paper=PAPER)
def axonn_grid_ranking(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """The grids AxoNN's model ranks best for the largest model: predicted communication by collective,
    and the simulated step's communication where simulated."""
    ranked = _required(_points(records, "axonn_ranking"), "axonn_ranking points", "run experiments/axonn.py")
    panels = list(_testbeds(ranked))
    fig.set_size_inches(max(7, 0.8 * RANKED_SHOWN) * len(panels), 5)
    for ax, (hardware, grids) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        best = grids.sort_values("model_rank").head(RANKED_SHOWN).reset_index(drop=True)
        parts = [c for c in best if c.endswith("_s") and c != "predicted_comm_s" and (best[c] > 0).any()]
        bars = best[parts].rename(columns=_collective_label).set_axis(_grid_labels(best))
        bars.plot.bar(stacked=True, ax=ax, rot=45, width=0.7)
        if "sim_comm_ms" in best:
            simulated = best["sim_comm_ms"] / 1e3
            ax.scatter(best.index, simulated, marker="D", color="black", zorder=3, label="simulated step")
        ax.set(
            xlabel="grid (data x depth x row x col), in the model's rank order",
            ylabel="communication per iteration (s)",
        )
        ax.set_title(
            f"{hardware}: {best['model'].iloc[0]} GPT on {best['gpus'].iloc[0]:.0f} GPUs, best {len(best)} of "
            f"{len(grids)} grids that fit",
            fontsize="small",
        )
        ax.tick_params(axis="x", labelsize="x-small")
        ax.legend()
    fig.suptitle("AxoNN: its communication model's ranking of 4D grids")
    return ranked
