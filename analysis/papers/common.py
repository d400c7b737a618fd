"""Paper-neutral figures (results/figures/common/): bus bandwidth of the collectives measured alone,
the simulator against held-out measurements, which dispatcher wins under routing skew (with its
table), the simulator against published hardware measurements no one here made (the external
validation, with its table), and every published number with a verdict against ours (drawn from the
comparison table). No reproducers: no paper publishes these numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import NullLocator

from analysis.collect import select
from analysis.registry import FigureDataError, figure, one_testbed, table
from analysis.style import MODE_MARKERS, PUBLISHED_MARKER, VERDICT_COLOURS, mode_title, palette
from analysis.units import format_bytes


def _collectives(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Collectives measured alone (no concurrent all-reduce)."""
    df = select(records, paper="common", experiment="collectives", metric=metric)
    df = df if df.empty else df[df["concurrent"].isna()]
    if df.empty:
        raise FigureDataError(
            f"the records table has no common/collectives rows of {metric} measured alone; "
            "collect results/raw/common/collectives/*.json into it first"
        )
    return one_testbed(df).astype({"size_bytes": int, "world_size": int})


@figure(paper="common")
def busbw_vs_size(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Bus bandwidth vs message size per collective, measured alone (nccl-tests style)."""
    df = _collectives(records, "busbw_GBps")
    ax = fig.subplots()
    sns.lineplot(
        df,
        x="size_bytes",
        y="value",
        hue="collective",
        style="world_size",
        markers=True,
        estimator="median",
        errorbar=None,
        ax=ax,
    )
    ax.set(
        xlabel="message size per rank",
        ylabel="bus bandwidth (GB/s, median)",
        title="Bus bandwidth vs message size (collectives alone)",
    )
    ax.set_xscale("log", base=2)
    sizes = sorted(df["size_bytes"].unique())
    ticks = sizes[:: -(-len(sizes) // 8)]  # at most 8 labels
    ax.set_xticks(ticks, [format_bytes(n) for n in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    return df


@figure(paper="common", reads="validation")
def sim_validation(validation: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Predicted vs measured time of every held-out point, with the +-10% target band; the title says
    when the points or the profile were measured on a noisy host."""
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
    title = f"Simulator vs held-out measurements ({', '.join(sorted(validation['hardware'].unique()))})"
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured (ms, median)",
        ylabel="simulated (ms)",
        title="\n".join([title, *_noise_notes(validation)]),
    )
    return validation


def _noise_notes(validation: pd.DataFrame) -> list[str]:
    """Title lines saying when the held-out records or the calibrated profile came from a noisy host
    (experiments/validate.py's ``noisy`` and ``profile_noisy`` columns)."""
    missing = sorted({"noisy", "profile_noisy"} - set(validation.columns))
    if missing:
        raise FigureDataError(f"the validation table has no {missing} columns; rerun experiments/validate.py")
    notes = []
    if validation["noisy"].any():
        notes.append(f"noisy host: {validation['noisy'].sum()} of {len(validation)} held-out points")
    if validation["profile_noisy"].any():
        notes.append("noisy host: the calibrated profile was fitted on noisy records")
    return notes


# ---- which dispatcher when (moe_core/dispatch_study.py) -----------------------------------------


def _dispatchers(records: pd.DataFrame) -> pd.DataFrame:
    """Every dispatcher record (measured and simulated), one row per point: time, drops, imbalance."""
    df = pd.concat([select(records, paper="common", experiment=e) for e in ("dispatchers", "dispatchers_sim")])
    if df.empty:
        return df
    keys = ["experiment", "mode", "backend", "hardware", "world_size", "skew", "path"]
    wide = df.astype({"world_size": int}).pivot_table(index=keys, columns="metric", values="value").reset_index()
    return wide.dropna(subset=["exchange_ms"])


def _fastest(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per ``keys`` group of dispatcher rows, the path with the shortest round trip."""
    return df.loc[df.groupby(keys)["exchange_ms"].idxmin()].set_index(keys)["path"]


@table(paper="common", file="dispatchers", category="Dispatchers")
def dispatcher_choice(records: pd.DataFrame) -> pd.DataFrame:
    """Per testbed and skew: every path's round trip and drops, the fastest path, and the fastest that
    drops no token."""
    df = _dispatchers(records)
    if df.empty:
        return df
    keys = ["mode", "backend", "hardware", "world_size", "skew"]
    fastest, fastest_lossless = _fastest(df, keys), _fastest(df[df["dropped_fraction"] == 0], keys)
    df = df.join(fastest.rename("fastest"), on=keys).join(fastest_lossless.rename("fastest_without_drops"), on=keys)
    columns = [*keys, "imbalance", "gini", "path", "exchange_ms", "dropped_fraction", "fastest"]
    columns.append("fastest_without_drops")
    return df[columns].sort_values([*keys, "exchange_ms"])


@table(paper="common", file="dispatchers_vs_model", category="Dispatchers")
def dispatchers_against_the_model(records: pd.DataFrame) -> pd.DataFrame:
    """Every measured dispatcher cell beside the simulator's prediction for it on its testbed's
    calibrated profile (experiments/dispatchers_predictions.py): the measured median with the
    repeats' 95% interval, the prediction, and measured / predicted. No rows without both."""
    keys = ["hardware", "skew", "path", "world_size", "tokens_per_rank"]
    wide = {}
    for experiment in ("dispatchers", "dispatchers_predictions"):
        df = select(records, paper="common", experiment=experiment)
        if df.empty:
            return df
        wide[experiment] = df.pivot_table(index=keys, columns="metric", values="value").reset_index()
    measured = wide["dispatchers"][[*keys, "exchange_ms", "exchange_ms_ci95_low", "exchange_ms_ci95_high"]]
    df = measured.merge(wide["dispatchers_predictions"][[*keys, "predicted_exchange_ms"]], on=keys)
    df["measured_over_predicted"] = df["exchange_ms"] / df["predicted_exchange_ms"]
    return df.sort_values(keys).reset_index(drop=True)


@figure(paper="common")
def dispatchers_under_skew(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Round trip of one MoE layer per dispatch path vs routing imbalance, per testbed, and the tokens
    the capacity paths drop."""
    df = _dispatchers(records)
    if df.empty:
        raise FigureDataError(
            "the records table has no common/dispatchers rows; run experiments/dispatchers.py or dispatchers_sim.py"
        )
    # a simulated cluster at its largest size (the winner map has every size)
    largest = df.groupby(["mode", "hardware"])["world_size"].transform("max")
    df = df[(df["mode"] == "measured") | (df["world_size"] == largest)]
    testbeds = df[["mode", "backend", "hardware", "world_size"]].drop_duplicates().to_records(index=False)
    colours = palette("dispatcher", df["path"])
    columns = 2  # two panels a row: four side by side do not read at the report's width
    rows = -(-(len(testbeds) + 1) // columns)
    fig.set_size_inches(10, 3.8 * rows)
    axes = fig.subplots(rows, columns, squeeze=False).flat
    for (mode, backend, hardware, ranks), ax in zip(testbeds, axes):  # testbeds first: zip takes no spare axes
        panel = df[(df["mode"] == mode) & (df["hardware"] == hardware)].sort_values("imbalance")
        sns.lineplot(panel, x="imbalance", y="exchange_ms", hue="path", palette=colours, marker="o", ax=ax)
        if mode == "measured":  # the repeats' 95% interval
            for path, rows in panel.groupby("path"):
                low, high = rows["exchange_ms_ci95_low"], rows["exchange_ms_ci95_high"]
                spread = [rows["exchange_ms"] - low, high - rows["exchange_ms"]]
                ax.errorbar(rows["imbalance"], rows["exchange_ms"], yerr=spread, fmt="none", ecolor=colours[path])
        ax.set(xlabel="imbalance (max / mean tokens per expert)", ylabel="dispatch + combine (ms)", xscale="log")
        ax.set_title(mode_title(mode, f"{hardware} {backend}, {ranks} ranks"), fontsize="small")
    drops, ax = df[df["dropped_fraction"] > 0], next(axes)
    sns.scatterplot(
        drops,
        x="imbalance",
        y="dropped_fraction",
        hue="path",
        palette=colours,
        style="mode",
        markers=MODE_MARKERS,
        ax=ax,
    )
    ax.set(xlabel="imbalance", ylabel="tokens dropped (fraction)", xscale="log")
    ax.set_title("Capacity paths drop tokens (measured and simulated)", fontsize="small")
    for unused in axes:
        unused.set_axis_off()
    fig.suptitle("Which dispatcher when: round trip vs routing skew")
    return df


@figure(paper="common")
def dispatcher_winner_map(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Which dispatcher wins, per routing workload and expert-parallel size, on each simulated
    cluster: the fastest path's name, its margin over the runner-up (x) and the tokens it drops;
    colour by path."""
    df = _dispatchers(records)
    df = df[df["mode"] == "simulated"] if not df.empty else df
    if df.empty:
        raise FigureDataError("the records table has no simulated dispatcher rows; run experiments/dispatchers_sim.py")
    keys = ["hardware", "world_size", "skew"]
    ranked = df.sort_values("exchange_ms").groupby(keys)
    winners = ranked.head(1).set_index(keys)
    runner_up = ranked.nth(1).set_index(keys)["exchange_ms"]
    winners["margin"] = runner_up.reindex(winners.index) / winners["exchange_ms"]
    winners = winners.reset_index()
    colours = palette("dispatcher", winners["path"])
    clusters = sorted(winners["hardware"].unique())
    skews = sorted(winners["skew"].unique())
    sizes = sorted(winners["world_size"].unique())
    fig.set_size_inches(1.2 * len(sizes) * len(clusters) + 2.5, 0.45 * len(skews) + 1.8)
    axes = np.atleast_1d(fig.subplots(1, len(clusters), sharey=True))
    for ax, cluster in zip(axes, clusters):
        panel = winners[winners["hardware"] == cluster]
        for _, row in panel.iterrows():
            x, y = sizes.index(row["world_size"]), skews.index(row["skew"])
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colours[row["path"]], alpha=0.6))
            label = row["path"] + ("" if np.isnan(row["margin"]) else f" {row['margin']:.2f}x")
            if row["dropped_fraction"] > 0:
                label += f"\ndrops {row['dropped_fraction']:.0%}"
            ax.text(x, y, label, ha="center", va="center", fontsize="x-small")
        ax.grid(False)
        ax.set(xlim=(-0.5, len(sizes) - 0.5), ylim=(len(skews) - 0.5, -0.5), title=cluster)
        ax.set_xticks(range(len(sizes)), [str(n) for n in sizes])
        ax.set_yticks(range(len(skews)), skews)
        ax.set_xlabel("expert-parallel ranks (one expert each)")
    fig.suptitle("Fastest dispatcher per workload and cluster size (simulated; margin over the runner-up)")
    return df


# ---- the simulator against published hardware measurements (experiments/external_validation.py) --------

EXTERNAL_TARGET = 0.15  # the simulator-fidelity issue's target for |predicted / published - 1|


def _external(records: pd.DataFrame) -> pd.DataFrame:
    """One row per external_validation entry (id, what, profile, and its metrics side by side), in id order."""
    df = select(records, paper="common", experiment="external_validation")
    if df.empty:
        return df
    wide = df.pivot_table(index=["point", "what", "hardware"], columns="metric", values="value").reset_index()
    return wide.rename(columns={"point": "id", "hardware": "profile"})


@table(paper="common", category="Simulator")
def external_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Each published hardware measurement next to the simulator's prediction, then a summary row: the median
    |relative error| against the issue's 15% target."""
    df = _external(records)
    if df.empty:
        return df
    columns = ["id", "what", "profile", "published", "published_low", "published_high", "predicted", "rel_error"]
    df = df[columns].assign(abs_rel_error=df["rel_error"].abs())
    df["within_target"] = df["abs_rel_error"] <= EXTERNAL_TARGET
    median = df["abs_rel_error"].median()
    summary = {
        "id": "median",
        "what": f"median |rel_error| over {len(df)} entries (target <= {EXTERNAL_TARGET:.0%})",
        "abs_rel_error": median,
        "within_target": median <= EXTERNAL_TARGET,
    }
    return pd.concat([df, pd.DataFrame([summary])], ignore_index=True)


@figure(paper="common")
def external_validation_errors(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Predicted vs published bandwidth of each external measurement (the published range as an error bar), and
    each relative error against the 15% target."""
    df = _external(records)
    if df.empty:
        raise FigureDataError(
            "the records table has no common/external_validation rows; run experiments/external_validation.py "
            "and collect results/raw/common/external_validation/*.json into it first"
        )
    fig.set_size_inches(11, 2 + 0.4 * len(df))
    ax_bw, ax_err = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(len(df))
    spread = [df["published"] - df["published_low"], df["published_high"] - df["published"]]
    bars = ax_bw.errorbar(df["published"], y, xerr=spread, fmt="none", color="black", capsize=3)
    for artist in bars.get_children():
        artist.set_gid("published")
    ax_bw.scatter(df["published"], y, label="published (its range as a bar)", **{**PUBLISHED_MARKER, "s": 90})
    ax_bw.scatter(
        df["predicted"],
        y,
        marker=MODE_MARKERS["simulated"],
        facecolors="none",
        edgecolors="C3",
        zorder=3,
        label="simulated",
    )
    ax_bw.set_yticks(y, [f"{i} ({p})" for i, p in zip(df["id"], df["profile"])], fontsize="small")
    ax_bw.invert_yaxis()
    ax_bw.set(xscale="log", xlabel="bandwidth (GB/s, as each source defines it)")
    shown = df[["predicted", "published_low", "published_high"]].to_numpy()
    ticks = [t for t in (12.5, 25, 50, 100, 200, 400, 800) if shown.min() / 1.5 <= t <= 1.5 * shown.max()]
    ax_bw.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax_bw.xaxis.set_minor_locator(NullLocator())
    ax_bw.legend()
    within = df["rel_error"].abs() <= EXTERNAL_TARGET
    ax_err.axvspan(-EXTERNAL_TARGET, EXTERNAL_TARGET, color="0.85", label=f"±{EXTERNAL_TARGET:.0%} target")
    ax_err.barh(y, df["rel_error"], color=np.where(within, "C2", "C3"))
    ax_err.axvline(0, color="black", lw=0.8)
    ax_err.xaxis.set_major_formatter("{x:.0%}")
    ax_err.set(xlabel="predicted / published - 1")
    ax_err.legend()
    median = df["rel_error"].abs().median()
    fig.suptitle(
        f"Simulator vs published hardware measurements: median |error| {median:.0%} "
        f"(target {EXTERNAL_TARGET:.0%}, {within.sum()} of {len(df)} within)"
    )
    return df.assign(mode="simulated", hardware=df["profile"])


# ---- the kernel model against published expert-parallel kernel tables (experiments/external_dispatch.py) --

# which bandwidth a kernel-level column is: the library's count, or bytes that cross a link
BANDWIDTH_KINDS = {
    "logical_GBps": "logical (the library's count)",
    "nvlink_wire_GBps": "wire (busiest NVLink link)",
    "nic_wire_GBps": "wire (busiest NIC)",
}


def _external_dispatch(records: pd.DataFrame) -> pd.DataFrame:
    """One row per external_dispatch entry (id, what, measure, and its metrics side by side), in file order."""
    df = select(records, paper="common", experiment="external_dispatch")
    if df.empty:
        return df
    index = ["point", "what", "measure", "hardware"]
    wide = df.pivot_table(index=index, columns="metric", values="value", sort=False).reset_index()
    return wide.rename(columns={"point": "id", "hardware": "profile"})


@table(paper="common", category="Simulator")
def external_dispatch(records: pd.DataFrame) -> pd.DataFrame:
    """Each published kernel number next to the kernel model's prediction, in-sample and leave-one-out error,
    with the bandwidths labelled by kind; then the median and worst |error| rows."""
    df = _external_dispatch(records)
    if df.empty:
        return df
    df = df[
        ["id", "what", "profile", "measure", "published", "predicted", "rel_error", "loo_rel_error", *BANDWIDTH_KINDS]
    ]
    df = df.rename(columns={key: f"{key} [{kind}]" for key, kind in BANDWIDTH_KINDS.items()})
    summary = [
        {"id": name, "what": f"{name} |error| over {len(df)} entries (target <= {EXTERNAL_TARGET:.0%})", **values}
        for name, reduce in (("median", np.median), ("worst", np.max))
        for values in [{col: reduce(df[col].abs()) for col in ("rel_error", "loo_rel_error")}]
    ]
    return pd.concat([df, pd.DataFrame(summary)], ignore_index=True)


@figure(paper="common")
def external_dispatch_errors(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Each published kernel number's error: in-sample (the profile's fitted kernel parameters) and
    leave-one-out (fitted without it), against the 15% target."""
    df = _external_dispatch(records)
    if df.empty:
        raise FigureDataError(
            "the records table has no common/external_dispatch rows; run experiments/external_dispatch.py "
            "and collect results/raw/common/external_dispatch/*.json into it first"
        )
    fig.set_size_inches(8, 2 + 0.35 * len(df))
    ax = fig.subplots()
    y = np.arange(len(df))
    ax.axvspan(-EXTERNAL_TARGET, EXTERNAL_TARGET, color="0.85", label=f"±{EXTERNAL_TARGET:.0%} target")
    ax.barh(y - 0.2, df["rel_error"], height=0.4, color="C0", label="in-sample (the profile's fit)")
    ax.barh(y + 0.2, df["loo_rel_error"], height=0.4, color="C1", label="leave-one-out")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{i} ({m})" for i, m in zip(df["id"], df["measure"])], fontsize="small")
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter("{x:.0%}")
    ax.set(xlabel="predicted / published - 1 (latency, or logical GB/s as the library counts it)")
    ax.legend()
    fig.suptitle(
        f"Kernel model vs DeepEP's published tables: median |error| {df['rel_error'].abs().median():.1%} "
        f"(leave-one-out {df['loo_rel_error'].abs().median():.1%}, worst {df['loo_rel_error'].abs().max():.1%})"
    )
    return df.assign(mode="simulated", hardware=df["profile"])


# ---- the simulator against published GPU training steps (experiments/external_steps.py) ------------------

STEP_TARGETS = {"median": 0.15, "p90": 0.35}  # the targets for |step error|, dense and MoE apart


def _external_steps(records: pd.DataFrame) -> pd.DataFrame:
    """One row per priced external_steps entry (id, kind, gpu, gpus and its metrics side by side), in id order."""
    df = select(records, paper="common", experiment="external_steps")
    if df.empty:
        return df
    wide = df.pivot_table(index=["point", "kind", "gpu", "gpus", "hardware"], columns="metric", values="value")
    return wide.reset_index().rename(columns={"point": "id", "hardware": "profile"})


@table(paper="common", category="Simulator")
def external_steps(records: pd.DataFrame) -> pd.DataFrame:
    """Each published training step next to the simulated one, then per kind (dense, MoE) the median and 90th
    percentile |step error| against the issue's targets."""
    df = _external_steps(records)
    if df.empty:
        return df
    columns = ["id", "kind", "gpu", "gpus", "profile", "published", "predicted", "published_step_s"]
    df = df[[*columns, "predicted_step_s", "step_error"]]
    summaries = []
    for kind, rows in df.groupby("kind"):
        errors = rows["step_error"].abs()
        for name, value in (("median", errors.median()), ("p90", errors.quantile(0.9))):
            within = value <= STEP_TARGETS[name]
            summaries.append({"id": f"{kind} {name}", "kind": kind, "step_error": value, "within_target": within})
    return pd.concat([df, pd.DataFrame(summaries)], ignore_index=True)


@figure(paper="common")
def external_steps_errors(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """The step error of each published training step, dense and MoE apart, against the 15% median target."""
    df = _external_steps(records)
    if df.empty:
        raise FigureDataError(
            "the records table has no common/external_steps rows; run experiments/external_steps.py "
            "and collect results/raw/common/external_steps/*.json into it first"
        )
    kinds = sorted(df["kind"].unique())
    fig.set_size_inches(9, 2 + 0.4 * len(df))
    heights = [(df["kind"] == kind).sum() for kind in kinds]  # one bar as tall in every panel
    axes = np.atleast_1d(fig.subplots(len(kinds), 1, squeeze=False, height_ratios=heights)[:, 0])
    target = STEP_TARGETS["median"]
    for ax, kind in zip(axes, kinds):
        rows = df[df["kind"] == kind].sort_values("id")
        y = np.arange(len(rows))
        within = rows["step_error"].abs() <= target
        ax.axvspan(-target, target, color="0.85", label=f"±{target:.0%}")
        ax.barh(y, rows["step_error"], color=np.where(within, "C2", "C3"))
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(y, [f"{i} ({g:.0f} GPUs)" for i, g in zip(rows["id"], rows["gpus"])], fontsize="small")
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter("{x:.0%}")
        median = rows["step_error"].abs().median()
        ax.set(xlabel="predicted step / published step - 1", title=f"{kind}: median |error| {median:.0%}")
        ax.legend()
    fig.suptitle("Simulator vs published GPU training steps")
    return df.assign(mode="simulated", hardware=df["profile"])


# ---- published vs reproduced: every verdict at once (analysis.compare's comparison.csv) -----------------

# the verdicts a judged row can get
VERDICT_MARKERS = {"consistent": "o", "differs": "X", "baseline-not-reproduced": "D"}
LOG2_LIMIT = 7  # the axis spans at most 1/128x..128x; a ratio beyond it (or at zero) is drawn at the edge
VERDICT_POINT_COLUMNS = [
    "id",
    "paper",
    "hardware",
    "published",
    "reproduced",
    "reproduced_low",
    "reproduced_high",
    "tolerance",
    "bound",
    "verdict",
    "weak",
]


def verdict_points(comparison: pd.DataFrame) -> pd.DataFrame:
    """The comparison rows with a verdict (consistent, differs or baseline-not-reproduced: the paper's
    quantity on the paper's testbed), in table order, as base-2 logs of reproduced / published: at the
    paper's testbed fit (``log_ratio``), the range's ends over the baseline-consistent settings, or over
    every sensitivity run where the paper has no baseline to fit (``log_low``, ``log_high``) and the ends
    of the band where the verdict is consistent (``band_low``, ``band_high``: 1 -+ tolerance, open on
    the far side of a published bound). A ratio at or below zero is -inf.
    Each row is labelled by its id without the paper's prefix, and its testbed where an id has several."""
    missing = [column for column in VERDICT_POINT_COLUMNS if column not in comparison]
    if missing:
        raise FigureDataError(
            f"the comparison table lacks columns {missing}; rewrite it with python -m analysis.compare"
        )
    df = comparison[comparison["verdict"].isin(list(VERDICT_MARKERS))][VERDICT_POINT_COLUMNS]
    df = df.reset_index(drop=True).assign(kind=lambda d: d["verdict"])
    for column, values in (("log_ratio", "reproduced"), ("log_low", "reproduced_low"), ("log_high", "reproduced_high")):
        df[column] = _log2(df[values] / df["published"])
    df["band_low"] = np.where(df["bound"] == "upper", -np.inf, _log2(1 - df["tolerance"]))
    df["band_high"] = np.where(df["bound"] == "lower", np.inf, _log2(1 + df["tolerance"]))
    label = pd.Series([id_.removeprefix(f"{paper}-") for id_, paper in zip(df["id"], df["paper"])], dtype=object)
    repeated = df["id"].duplicated(keep=False)
    df["label"] = label.where(~repeated, label + " (" + df["hardware"] + ")")
    return df


def _log2(values: pd.Series) -> pd.Series:
    """Base-2 log, with -inf for values at or below zero (drawn at the axis' edge)."""
    with np.errstate(divide="ignore"):
        return np.log2(values.clip(lower=0))


@figure(paper="common", reads="comparison")
def verdicts(comparison: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Every published number with a verdict: reproduced / published on a log axis, the range the verdict
    uses as a bar, the band where the verdict is consistent, one panel per paper; the counts are the
    comparison's (and verdict_summary.csv's)."""
    df = verdict_points(comparison)
    if df.empty:
        raise FigureDataError(
            "the comparison table has no row with a verdict (consistent, differs or baseline-not-reproduced); "
            "run the paper's experiments on its testbed profiles and rerun analysis.compare"
        )
    shown = df[["log_ratio", "log_low", "log_high"]].to_numpy().ravel()
    shown = np.append(shown[np.isfinite(shown)], [-1, 1])  # at least 1/2x..2x
    lo, hi = max(-LOG2_LIMIT, np.floor(shown.min())), min(LOG2_LIMIT, np.ceil(shown.max()))
    papers = sorted(df["paper"].unique())
    sizes = [int((df["paper"] == paper).sum()) for paper in papers]
    fig.set_size_inches(8, 2 + 0.2 * len(df) + 0.4 * len(papers))
    # the first row holds the title and legend, above the data (tight_layout keeps an axes' legend clear)
    key, *axes = fig.subplots(len(papers) + 1, 1, sharex=True, gridspec_kw={"height_ratios": [3, *sizes]})
    for ax, paper in zip(axes, papers):
        rows = df[df["paper"] == paper].reset_index(drop=True)
        _verdict_panel(ax, rows, lo, hi)
        ax.set_title(f"{paper} ({len(rows)})", loc="left", fontsize="small", fontweight="bold")
    step = 1 if hi - lo <= 8 else 2  # a label per doubling, or per two
    ticks = np.arange(np.ceil(lo / step) * step, hi + 1, step)
    axes[-1].set_xticks(ticks, [f"{2**t:g}×" if t >= 0 else f"1/{2**-t:g}×" for t in ticks])
    axes[-1].set_xlim(lo - 0.2, hi + 0.2)
    axes[-1].set_xlabel("reproduced / published (log scale)")
    handles = [
        Line2D([], [], marker=shape, color=VERDICT_COLOURS[kind], lw=0, label=kind)
        for kind, shape in VERDICT_MARKERS.items()
    ]
    handles += [
        Line2D([], [], marker="o", color="0.4", lw=0, label="marker: at the testbed fitted to the paper's baselines"),
        Line2D([], [], color="0.4", lw=2, alpha=0.6, label="bar: over the baseline-consistent settings, or all runs"),
        Patch(color="0.87", label="grey: consistent, 1 ± tolerance (open beyond a published bound)"),
        Line2D([], [], marker="<", color="0.4", lw=0, label="arrow: beyond the axis, or 0"),
    ]
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=2, fontsize="x-small", frameon=False)
    counts = df["kind"].value_counts()
    key.set_title(
        f"Published vs reproduced: {len(df)} numbers with a verdict, {counts.get('consistent', 0)} consistent, "
        f"{counts.get('differs', 0)} differ, {counts.get('baseline-not-reproduced', 0)} baseline not reproduced, "
        f"{int(df['weak'].eq(True).sum())} weak\n"
        f"(not shown: {len(comparison) - len(df)} rows without a verdict, not comparable or not reproduced)",
        fontsize="small",
    )
    return df


def _verdict_panel(ax: Axes, rows: pd.DataFrame, lo: float, hi: float) -> None:
    """One paper's rows of verdict_points, top to bottom, on an axis from 2**lo to 2**hi: each row's
    consistent band, plausible range and value, coloured by verdict; a value beyond the axis an arrow."""
    y = np.arange(len(rows))
    band_low, band_high = rows["band_low"].clip(lo, hi), rows["band_high"].clip(lo, hi)
    ax.barh(y, band_high - band_low, left=band_low, height=0.8, color="0.87", lw=0)
    ax.axvline(0, color="black", lw=0.8)
    colours = rows["kind"].map(VERDICT_COLOURS)
    ax.hlines(y, rows["log_low"].clip(lo, hi), rows["log_high"].clip(lo, hi), colors=colours, lw=2, alpha=0.6)
    at = rows["log_ratio"].clip(lo, hi)
    for kind, marker in VERDICT_MARKERS.items():
        for where, shape, size in (
            (rows["log_ratio"].between(lo, hi), marker, 28),
            (rows["log_ratio"] < lo, "<", 40),
            (rows["log_ratio"] > hi, ">", 40),
        ):
            chosen = (rows["kind"] == kind) & where
            ax.scatter(at[chosen], y[chosen], marker=shape, color=VERDICT_COLOURS[kind], s=size, zorder=3)
    ax.set_yticks(y, rows["label"], fontsize="x-small")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
