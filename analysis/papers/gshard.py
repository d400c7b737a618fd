"""GShard (arXiv 2006.16668): its figures (results/figures/gshard/), table and reproducers.

* Measured: the MoE layer's training step broken down by phase (``step_breakdown``; the published
  numbers it is compared with are Lina's, analysis/papers/lina/).
* Simulated scaling study on the TPU v3 torus (experiments/gshard.py): Table 1's models at 128, 512
  and 2048 experts (table ``gshard_scaling``; the runtime breakdown against its roofline, Fig 8),
  memory per core (Fig 7), the collectives against the number of partitions (Fig 9); reproducers of
  Table 3's steps/s and model (1)'s training cost, and of Table 4's O(sqrt(D)) all-to-all.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.collect import select, wide_points
from analysis.published import load_registry, published_value
from analysis.registry import FigureDataError, describe_testbeds, figure, reproducer, table, train_step_rows
from analysis.style import PUBLISHED, phase_colour, phase_label
from analysis.units import format_bytes
from moe_core.papers.gshard.config import COLLECTIVES, MEMORY, PAPER, SCALING
from moe_core.papers.gshard.models import MODELS, core_years, training_days

STEP_COMPONENTS_MS = ["gate_ms", "dispatch_a2a_ms", "expert_ms", "combine_a2a_ms", "dense_ms", "allreduce_exposed_ms"]


@figure(paper="gshard")
def step_breakdown(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Stacked median phase times per step vs experts, and beside each stack the step's median and p95;
    one panel per policy × world size."""
    df = train_step_rows(records, [*STEP_COMPONENTS_MS, "step_ms"], shown=["policy", "world_size", "num_experts"])
    policies, sizes = sorted(df["policy"].unique()), sorted(df["world_size"].unique())
    fig.set_size_inches(1.0 + 3.2 * len(sizes), 0.6 + 2.8 * len(policies))
    axes = fig.subplots(len(policies), len(sizes), sharey=True, squeeze=False)
    for (i, policy), (j, world_size) in itertools.product(enumerate(policies), enumerate(sizes)):
        ax, panel = axes[i, j], df[(df["policy"] == policy) & (df["world_size"] == world_size)]
        ax.set_title(f"{policy}, {world_size} ranks")
        if panel.empty:  # a sweep that skipped this combination
            ax.set_axis_off()
            continue
        ax.set_xlabel("experts (total)")
        ax.set_ylabel("time per step (ms)" if j == 0 else "")
        # median over seeds of each point's median
        ms = panel.pivot_table(index="num_experts", columns="metric", values="value", aggfunc="median")
        p95 = panel[panel["metric"] == "step_ms"].groupby("num_experts")["p95"].median().reindex(ms.index)
        x, bottom = np.arange(len(ms)), np.zeros(len(ms))
        for name in STEP_COMPONENTS_MS:
            ax.bar(x, ms[name], bottom=bottom, color=phase_colour(name), label=phase_label(name))
            bottom += ms[name].to_numpy()
        # The step's own median and p95, on its own: the phases' medians need not add up to the step's
        # (and overlapped phases add up to more), so a p95 drawn on the stack could sit below its top.
        step = ms["step_ms"].to_numpy()
        ax.errorbar(
            x + 0.5,
            step,
            yerr=[np.zeros(len(step)), np.maximum(p95.to_numpy() - step, 0)],
            fmt="_",
            markersize=12,
            color="black",
            capsize=4,
            zorder=3,
            label="step: median, bar to p95",
        )
        ax.set_xticks(x, [str(n) for n in ms.index])
        ax.legend()
    fig.suptitle("Training step time by phase (GShard MoE layer)")
    return df


# ---- the simulated scaling study ----------------------------------------------------------------

# Fig 8's components: (simulated metric, roofline metric or None where none is meaningful); each drawn
# with its step phase's words and colour (analysis/style.py)
BREAKDOWN = [
    ("dense_ms", "dense_roofline_ms"),  # the transformer, with the dispatch and combine einsums
    ("gate_ms", "gate_roofline_ms"),
    ("expert_ms", "expert_roofline_ms"),
    ("a2a_ms", "a2a_roofline_ms"),
    ("allreduce_exposed_ms", None),
]
MEMORY_KINDS = {
    "replicated_weights_GB": "replicated weights",
    "distributed_weights_GB": "distributed weights",
    "optimizer_GB": "optimizer state",
    "gradients_GB": "gradients",
    "activations_GB": "activations",
}
STEPS_PER_S_ID = "gshard-table3-model{}-steps-per-s"


def _points(records: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """One row per point of gshard/<experiment> (every testbed), metrics as columns."""
    return wide_points(records, PAPER, experiment)


def _required(df: pd.DataFrame, what: str) -> pd.DataFrame:
    if df.empty:
        raise FigureDataError(f"the records table has no {what}; run experiments/gshard.py and collect its records")
    return df


def _with_training_cost(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the days and core-years of training on 1T tokens at its steps/s and batch (Table 3's
    arithmetic, moe_core/papers/gshard/models.py)."""
    return df.assign(
        training_days=training_days(df["steps_per_s"], df["batch_tokens"]),
        core_years=core_years(df["steps_per_s"], df["batch_tokens"], df["cores"]),
    )


def _scaling(records: pd.DataFrame) -> pd.DataFrame:
    """The simulated models of Table 1, one row each (ints where the parameters are counts)."""
    df = _points(records, SCALING)
    if df.empty:
        return df
    counts = ["gshard_model", "num_experts", "n_layers", "cores", "chips", "batch_tokens", "moe_layers"]
    return _with_training_cost(df.astype({c: int for c in counts})).sort_values("gshard_model")


@table(paper="gshard")
def gshard_scaling(records: pd.DataFrame) -> pd.DataFrame:
    """Per Table 1 model simulated on its torus: step time and steps/s beside Table 3's, the days and
    core-years of 1T tokens at that rate, all-to-all time and share of the step, the step's other
    components, the MoE compute's fraction of its roofline, memory per core in that run."""
    df = _scaling(records)
    if df.empty:
        return df
    registry = load_registry()
    df["published_steps_per_s"] = [published_value(registry, STEPS_PER_S_ID.format(i)) for i in df["gshard_model"]]
    columns = ["gshard_model", "num_experts", "n_layers", "cores", "hardware", "batch_tokens", "step_ms"]
    columns += ["steps_per_s", "published_steps_per_s", "training_days", "core_years", "a2a_ms", "a2a_share"]
    columns += ["gate_ms", "expert_ms", "dense_ms", "allreduce_exposed_ms", "moe_roofline_fraction"]
    columns += ["a2a_roofline_ms", "memory_GB", "memory_share_of_device"]
    return df[columns].reset_index(drop=True)


# ---- reproducers ------------------------------------------------------------------------------


def _model_row(records: pd.DataFrame, model_id: int) -> pd.Series | None:
    """Model ``model_id``'s simulated point on this testbed, or None."""
    df = _scaling(records)
    found = df[df["gshard_model"] == model_id] if not df.empty else df
    return None if found.empty else found.iloc[0]


def _setting(row: pd.Series) -> str:
    return (
        f"{describe_testbeds(row.to_frame().T)}, model ({row['gshard_model']}) {MODELS[row['gshard_model']].name} on "
        f"{row['cores']} cores ({row['chips']} chips), batch {row['batch_tokens']:,} tokens: step "
        f"{row['step_ms']:.0f} ms ({row['steps_per_s']:.3g} steps/s), all-to-all {row['a2a_share']:.0%} of it; "
        f"1T tokens in {row['training_days']:.2f} days = {row['core_years']:.2f} core-years"
    )


def _model_reproducer(model_id: int, metric: str):
    """The reproducer of ``metric`` (a column of the scaling points) for model ``model_id``."""

    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        row = _model_row(records, model_id)
        return None if row is None else (float(row[metric]), _setting(row))

    reproduce.__doc__ = f"Model ({model_id})'s simulated {metric} (Table 3)."
    return reproduce


for _model_id in MODELS:
    reproducer(_model_reproducer(_model_id, "steps_per_s"), f"gshard_steps_per_s_model{_model_id}")
reproducer(_model_reproducer(1, "core_years"), "gshard_core_years_model1")
reproducer(_model_reproducer(1, "training_days"), "gshard_training_days_model1")


def scaling_exponent(x: pd.Series, y: pd.Series) -> float:
    """b of the least-squares fit y = a x^b on log-log axes."""
    return float(np.polyfit(np.log(x.astype(float)), np.log(y.astype(float)), 1)[0])


def _collective_exponents(records: pd.DataFrame) -> pd.DataFrame:
    """Per collective and size per partition: the fitted exponent of its time and of its line-rate
    bound in the number of partitions, over how many partition counts."""
    df = _points(records, COLLECTIVES)
    if df.empty:
        return df
    rows = []
    for (kind, size), points in df.groupby(["collective", "size_bytes"]):
        rows.append(
            {
                "collective": kind,
                "size_bytes": int(size),
                "exponent": scaling_exponent(points["partitions"], points["time_ms"]),
                "line_rate_exponent": scaling_exponent(points["partitions"], points["line_rate_ms"]),
                "partition_counts": int(points["partitions"].nunique()),
                "partitions": f"{points['partitions'].min():.0f}-{points['partitions'].max():.0f}",
            }
        )
    return pd.DataFrame(rows)


@reproducer
def gshard_a2a_exponent(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The exponent of the all-to-all's time in the number of partitions on the torus, at the largest
    size per partition of the sweep (Table 4: O(sqrt(D)), the bandwidth term d h / l, which dominates
    the latency at the largest size); the other sizes' exponents are in the setting."""
    fits = _collective_exponents(records)
    fits = fits[(fits["collective"] == "all_to_all") & (fits["partition_counts"] >= 3)] if not fits.empty else fits
    if fits.empty:
        return None
    fits = fits.sort_values("size_bytes")
    largest = fits.iloc[-1]
    others = ", ".join(f"{format_bytes(r.size_bytes)}: D^{r.exponent:.2f}" for r in fits.iloc[:-1].itertuples())
    a2a_points = select(_points(records, COLLECTIVES), collective="all_to_all")
    return largest["exponent"], (
        f"{describe_testbeds(a2a_points)}, torus slices of {largest['partitions']} partitions, "
        f"{format_bytes(largest['size_bytes'])} per partition: time ~ D^{largest['exponent']:.2f} (at line rate "
        f"alone D^{largest['line_rate_exponent']:.2f}); smaller sizes: {others or 'none'}"
    )


# ---- figures ----------------------------------------------------------------------------------


@figure(paper=PAPER)
def gshard_runtime_breakdown(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Per MoE layer and its adjacent Transformer layer, simulated time by component against its
    roofline, from 128 to 2048 experts; one panel per depth (GShard Fig 8)."""
    df = _required(_scaling(records), "gshard_scaling points")
    depths = sorted(df["n_layers"].unique())
    fig.set_size_inches(5.5 * len(depths), 4.5)
    for ax, depth in zip(fig.subplots(1, len(depths), squeeze=False)[0], depths):
        _breakdown_panel(ax, df[df["n_layers"] == depth].sort_values("num_experts"))
    fig.suptitle("GShard on the TPU v3 torus (simulated): time per MoE layer + Transformer layer vs roofline")
    return df


def _breakdown_panel(ax: Axes, df: pd.DataFrame) -> None:
    """Per expert count, a simulated bar and a roofline bar (hatched), stacked by component, ms per
    layer pair (the step's components over its MoE layers)."""
    x = np.arange(len(df))
    simulated, roofline = np.zeros(len(df)), np.zeros(len(df))
    per_pair = df["moe_layers"].to_numpy()
    for metric, bound in BREAKDOWN:
        color = phase_colour(metric)
        ax.bar(x - 0.2, df[metric] / per_pair, 0.38, bottom=simulated, color=color, label=phase_label(metric))
        simulated += df[metric].to_numpy() / per_pair
        if bound is not None:
            ax.bar(x + 0.2, df[bound] / per_pair, 0.38, bottom=roofline, color=color, hatch="//", alpha=0.6)
            roofline += df[bound].to_numpy() / per_pair
    ax.bar(0, 0, color="white", edgecolor="0.3", hatch="//", label="roofline (hatched)")
    tokens = df["tokens_per_rank"] * df["chips"] / df["cores"]  # a chip's tokens over its cores
    labels = [
        f"{e} experts, {t:.0f} tokens/core\n{h}\nsimulated | roofline"
        for e, t, h in zip(df["num_experts"], tokens, df["hardware"])
    ]
    ax.set_xticks(x, labels, fontsize="x-small")
    ax.set(ylabel="ms per layer pair (forward + backward)", title=f"{df['n_layers'].iloc[0]} layers")
    ax.legend()


@figure(paper=PAPER)
def gshard_collective_scaling(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """All-to-all and all-reduce time vs number of partitions on torus slices, per size per partition,
    log-log, with sqrt(D) for reference and each line's fitted exponent (GShard Fig 9)."""
    df = _required(_points(records, COLLECTIVES), "gshard_collectives points")
    fits = _collective_exponents(records).set_index(["collective", "size_bytes"])
    ax = fig.subplots()
    fig.set_size_inches(7, 5)
    for (kind, size), points in df.sort_values("partitions").groupby(["collective", "size_bytes"]):
        fit = fits.loc[(kind, size), "exponent"]
        style = "-o" if kind == "all_to_all" else "--s"
        ax.plot(points["partitions"], points["time_ms"], style, label=f"{kind}, {format_bytes(size)}: D^{fit:.2f}")
    smallest = df[df["partitions"] == df["partitions"].min()]
    start = smallest.loc[smallest["collective"] == "all_to_all", "time_ms"].max()
    d = np.sort(df["partitions"].unique())
    exponent = published_value(load_registry(), "gshard-table4-a2a-exponent")
    ax.plot(d, start * (d / d[0]) ** exponent, label=f"published all-to-all: D^{exponent:g} (Table 4)", **PUBLISHED)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="partitions D (TPU v3 cores)", ylabel="time (ms)")
    ax.set_title("Collectives on the TPU v3 torus vs partitions (simulated)", fontsize="medium")
    ax.legend()
    return df


@figure(paper=PAPER)
def gshard_memory(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Memory per core by kind for each depth and expert count, against the core's HBM (GShard Fig 7)."""
    df = _required(_points(records, MEMORY), "gshard_memory points").astype({"num_experts": int, "n_layers": int})
    df = df.sort_values(["n_layers", "num_experts"]).reset_index(drop=True)
    ax = fig.subplots()
    fig.set_size_inches(max(7, 0.6 * len(df)), 4.5)
    parts = df[list(MEMORY_KINDS)].rename(columns=MEMORY_KINDS)
    parts.set_axis([f"{L}L\n{E}E" for L, E in zip(df["n_layers"], df["num_experts"])]).plot.bar(
        stacked=True, ax=ax, rot=0, width=0.75
    )
    device = (df["memory_GB"] / df["memory_share_of_device"]).iloc[0]
    ax.axhline(device, color="black", linestyle="--", label=f"HBM per core ({device:g} GB)")
    ax.set(xlabel="layers and experts per MoE layer", ylabel="GB per core")
    ax.set_title(
        f"Memory per core, {df['group_size'].iloc[0]:.0f} tokens per core and side (no rematerialization)",
        fontsize="medium",
    )
    ax.tick_params(axis="x", labelsize="x-small")
    ax.legend()
    return df
