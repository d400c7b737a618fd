"""MoNTA (arXiv 2411.00662): its reproducers and figures (results/figures/monta/), from the simulated
training steps at the paper's scale (experiments/simulate.py, MoNTA's points), the performance model
(experiments/monta.py), the measured exchange (experiments/monta_a2a.py) and the measured training
steps (experiments/train_step.py, MoNTA's points).

One MoE all-to-all "exchange" is what MoNTA times: the dispatch (or combine) of one layer, all-to-all
plus the all-gathers of the duplicates. From a training-step record it is the step's all-to-all
wait over the 4 exchanges (dispatch, combine, forward, backward) of each MoE layer.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from analysis.collect import select
from analysis.published import load_registry, published_value
from analysis.registry import FigureDataError, describe_testbeds, figure, one_testbed, reproducer, table
from analysis.style import (
    colour,
    mode_title,
    palette,
    phase_colour,
    phase_label,
    published_line,
    published_point,
    published_segment,
)
from moe_core.papers.monta.decisions import CODE_DEFAULT_CHUNKS

PATHS = ["duplicate", "drop-gather", "monta"]
SOURCE_COLOURS = {"model_exchange_ms": "0.6", "simulated_exchange_ms": "C0"}  # MoNTA's model grey
EXCHANGES_PER_LAYER = 4  # dispatch and combine, forward and backward


# ---- selecting data ---------------------------------------------------------------------------


def _steps(records: pd.DataFrame, mode: str, metric: str = "a2a_ms") -> pd.DataFrame:
    """MoNTA's training steps in ``mode`` with ``metric``, the layout and dispatcher as columns, in
    one phase (not the hierarchical all-to-all); ``exchange_ms`` added for ``a2a_ms``."""
    df = select(records, paper="monta", experiment="sim_train_step" if mode == "simulated" else "train_step")
    df = select(df, mode=mode, metric=metric)
    if df.empty:
        return df
    df = df[df["dispatcher"] != "hierarchical"]
    df = df.astype({"tensor_parallel": int, "expert_parallel": int, "data_parallel": int, "tp_chunks": int})
    df["path"] = df["dispatcher"].where(df["tensor_parallel"] > 1, "none (tp 1)")
    if metric == "a2a_ms":
        df["exchange_ms"] = df["value"] / (EXCHANGES_PER_LAYER * df["moe_layers"])
    return df


def _required(df: pd.DataFrame, what: str, how: str) -> pd.DataFrame:
    if df.empty:
        raise FigureDataError(f"the records table has no {what}; {how}")
    return df


def _at_paper_layout(df: pd.DataFrame, tp: int) -> pd.DataFrame:
    """The paper's layout at ``tp``: two experts on two expert-parallel ranks, the model's chunk count."""
    return df[(df["tensor_parallel"] == tp) & (df["expert_parallel"] == 2) & (df["tp_chunks"] == 0)]


def _testbed_words(df: pd.DataFrame) -> str:
    """A measured testbed in words, saying when its "network" is loopback (no link differs)."""
    testbed = describe_testbeds(df)
    return f"{testbed} (loopback)" if "local" in testbed or "fallback" in testbed else testbed


def _path_colours(measured: pd.DataFrame) -> dict[str, tuple]:
    """Each measured path's colour: its dispatcher's (``flat``, ``monta-n4``: capacity's, MoNTA's)."""
    return {path: colour("dispatcher", d) for path, d in zip(measured["path"], measured["dispatcher"])}


def _by_path(df: pd.DataFrame, column: str) -> dict[str, float]:
    return df.set_index("path")[column].to_dict()


# ---- reproducers ------------------------------------------------------------------------------


@reproducer
def monta_a2a_speedup_tp8(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Exchange time with duplicates sent over MoNTA's, at 8-card tensor parallelism (simulated)."""
    df = _steps(records, "simulated")
    if df.empty:
        return None
    df = _at_paper_layout(df, 8)
    times = _by_path(df, "exchange_ms")
    if not {"duplicate", "monta"} <= times.keys():
        return None
    return times["duplicate"] / times["monta"], (
        f"{describe_testbeds(df)}, tp 8 x ep 2, per MoE exchange: duplicate {times['duplicate']:.3g} ms / "
        f"monta {times['monta']:.3g} ms (baseline read as DeepSpeed sending the tp duplicates; "
        f"vs drop-gather: {times.get('drop-gather', float('nan')) / times['monta']:.2f}x)"
    )


@reproducer
def monta_iteration_gain(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Iteration latency saved by MoNTA's dispatch over DeepSpeed's drop-gather, in %, at tp 8."""
    df = _steps(records, "simulated", "step_ms")
    if df.empty:
        return None
    df = _at_paper_layout(df, 8)
    step = _by_path(df, "value")
    if not {"drop-gather", "monta"} <= step.keys():
        return None
    df = df[df["path"].isin(["drop-gather", "monta"])]
    gain = 100 * (1 - step["monta"] / step["drop-gather"])
    return gain, (
        f"{describe_testbeds(df)}, 2x70B-class on 16 GPUs, tp 8 x ep 2, 8K sequence: step "
        f"{step['drop-gather']:.0f} ms (drop-gather) -> {step['monta']:.0f} ms (monta)"
    )


@reproducer
def monta_model_chunks(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The chunk count MoNTA's performance model picks at the paper's setting (tp 8)."""
    df = select(records, paper="monta", experiment="monta_chunk_model", metric="chosen")
    chosen = df[df["value"] == 1]
    if chosen.empty:
        return None
    return float(chosen["chunks"].iloc[0]), f"{describe_testbeds(chosen)}, tp 8 x ep 2, the model's pick"


# ---- figures ----------------------------------------------------------------------------------


@figure(paper="monta")
def monta_a2a_vs_tp(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """(a) One exchange per dispatch path vs tensor-parallel size: measured, and simulated at scale."""
    measured = select(records, paper="monta", experiment="monta_a2a", metric="exchange_ms")
    simulated = _steps(records, "simulated")
    _required(pd.concat([measured, simulated]), "monta exchanges", "run experiments/monta_a2a.py or the simulator")
    fig.set_size_inches(12, 4.5)
    left, right = fig.subplots(1, 2)
    if not measured.empty:
        measured = one_testbed(measured).astype({"tensor_parallel": int})
        one_phase = measured["dispatcher"] != "hierarchical"
        shown = measured[one_phase & measured["chunks"].isin([1, CODE_DEFAULT_CHUNKS])]  # the code's 4 chunks
        sns.barplot(
            shown,
            x="tensor_parallel",
            y="value",
            hue="path",
            saturation=1,
            palette=_path_colours(shown),
            errorbar=None,
            ax=left,
        )
        left.set(
            xlabel="tensor-parallel size",
            ylabel="one exchange (ms, median of worst rank)",
            title=mode_title("measured", _testbed_words(measured)),
        )
    if not simulated.empty:
        paper = simulated[(simulated["expert_parallel"] == 2) & (simulated["tp_chunks"] == 0)]
        sns.lineplot(
            paper,
            x="tensor_parallel",
            y="exchange_ms",
            hue="path",
            palette=palette("dispatcher", paper["path"]),
            style="hardware",
            markers=True,
            ax=right,
        )
        _published_tp8_speedup(right, _by_path(_at_paper_layout(paper, 8), "exchange_ms"))
        right.set(
            xlabel="tensor-parallel size (ep 2, the rest data parallel)",
            ylabel="one exchange (ms)",
            title=mode_title("simulated", "2x70B-class, 16 A800 (the profile's 4 NICs per node)"),
            yscale="log",
        )
        right.set_xticks(sorted(paper["tensor_parallel"].unique()))
    fig.suptitle("MoNTA (a): all-to-all + all-gather of one MoE exchange per dispatch path")
    return pd.concat([measured, simulated])


def _published_tp8_speedup(ax, exchange_ms: dict[str, float]) -> None:
    """MoNTA's published all-to-all speedup at tp 8, drawn where it puts MoNTA's exchange: the
    duplicates' simulated exchange over the published speedup."""
    if "duplicate" in exchange_ms:
        speedup = published_value(load_registry(), "monta-a2a-speedup-tp8")
        label = f"published: monta at tp 8, duplicate / {speedup:g}"
        published_point(ax, 8, exchange_ms["duplicate"] / speedup, label)


@figure(paper="monta")
def monta_chunks(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """(b) The pipelined exchange vs chunk count: simulated, the model's curve and pick, and measured."""
    simulated = _steps(records, "simulated")
    simulated = simulated[(simulated["path"] == "monta") & (simulated["expert_parallel"] == 2)]
    simulated = simulated[simulated["tensor_parallel"] == simulated["tensor_parallel"].max()]
    model = select(records, paper="monta", experiment="monta_chunk_model", metric="model_exchange_ms")
    chosen = select(records, paper="monta", experiment="monta_chunk_model", metric="chosen")
    measured = select(records, paper="monta", experiment="monta_a2a", metric="exchange_ms")
    _required(
        pd.concat([simulated, model, measured]),
        "chunk sweeps",
        "run the simulator, experiments/monta.py or experiments/monta_a2a.py",
    )
    fig.set_size_inches(12, 4.5)
    left, right = fig.subplots(1, 2)
    _simulated_chunks(left, simulated, model, chosen)
    drawn = [simulated, model, measured]
    if not measured.empty:
        drawn = [simulated, model, *_measured_chunks(right, records, measured)]
    fig.suptitle("MoNTA (b): pipelined all-to-all + all-gather vs chunk count")
    return pd.concat(drawn)


def _simulated_chunks(ax, simulated: pd.DataFrame, model: pd.DataFrame, chosen: pd.DataFrame) -> None:
    """The left panel: the simulated step's exchange and MoNTA's model of it per chunk count, with
    the count the model picks and the code's default."""
    swept = simulated[simulated["tp_chunks"] > 0] if not simulated.empty else simulated
    if not swept.empty:
        for hardware, curve in swept.groupby("hardware"):
            curve = curve.sort_values("tp_chunks")
            ax.plot(
                curve["tp_chunks"],
                curve["exchange_ms"],
                marker="o",
                color=colour("testbed", hardware),
                label=f"simulated step, {hardware}",
            )
    if swept.empty and model.empty:
        ax.set_axis_off()
        ax.set_title("no simulated or modelled chunk sweep in these tables")
    for hardware, curve in model.groupby("hardware"):
        curve = curve.sort_values("chunks")
        ax.plot(curve["chunks"], curve["value"], ls=":", color=colour("testbed", hardware), label=f"model, {hardware}")
        pick = chosen[(chosen["hardware"] == hardware) & (chosen["value"] == 1)]
        for n in pick["chunks"]:
            ax.annotate(
                f"model picks {int(n)}",
                (n, curve["value"].min()),
                xytext=(0, -14),
                textcoords="offset points",
                ha="center",
                fontsize="x-small",
            )
    published_line(
        ax,
        published_value(load_registry(), "monta-code-default-chunks"),
        "published: MoNTA's code default chunks",
        horizontal=False,
    )
    _chunk_axis(ax, [*swept.get("tp_chunks", []), *model["chunks"]])
    ax.set(yscale="log", xlabel="chunks", ylabel="one exchange (ms)")
    ax.set_title(mode_title("simulated", "step (solid) vs MoNTA's model (dotted)"))


def _measured_chunks(ax, records: pd.DataFrame, measured: pd.DataFrame) -> list[pd.DataFrame]:
    """The right panel: the measured exchange per chunk count and tensor-parallel size (1 chunk:
    drop-gather), with the model's prediction where the profile states its links; returns the
    model's rows (where there are any) and the measured ones, as drawn."""
    measured = one_testbed(measured).astype({"tensor_parallel": int})
    measured = measured[measured["tensor_parallel"] > 1].copy()
    measured = measured[measured["dispatcher"].isin(["drop-gather", "monta"])].astype({"chunks": float})
    measured["tp"] = measured["tensor_parallel"].astype(str)
    tp_colours = dict(zip(sorted(measured["tp"].unique(), key=int), ("C0", "C3", "C2", "C4")))
    sns.lineplot(measured, x="chunks", y="value", hue="tp", palette=tp_colours, marker="o", ax=ax)
    model = select(records, experiment="monta_a2a", metric="model_ms", hardware=measured["hardware"].iloc[0])
    if not model.empty:  # the profile stated its links: the model's prediction of the same exchanges
        model = model.merge(measured[["point", "chunks"]], on="point")
        for tp, curve in model.groupby("tensor_parallel"):
            curve = curve.sort_values("chunks")
            ax.plot(curve["chunks"], curve["value"], ls=":", color=tp_colours[f"{tp:g}"], label=f"model, tp {tp:g}")
    _chunk_axis(ax, measured["chunks"])
    ax.set(
        xlabel="chunks (1 = drop-gather)",
        ylabel="one exchange (ms, median)",
        title=mode_title("measured", _testbed_words(measured)),
    )
    return [model, measured]


def _chunk_axis(ax, chunks) -> None:
    """A base-2 log axis of chunk counts, each count drawn written out (1, 2, 4, ...)."""
    counts = sorted({int(c) for c in chunks})
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()


@figure(paper="monta")
def monta_iteration_breakdown(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """(c) Iteration time by phase, drop-gather vs MoNTA (and duplicates), simulated at tp 8 and measured."""
    phases = ["a2a_ms", "expert_ms", "gate_ms", "dense_ms", "allreduce_exposed_ms"]
    panels = []
    for mode in ("simulated", "measured"):
        frames = [_steps(records, mode, phase) for phase in phases]
        df = pd.concat([f for f in frames if not f.empty]) if any(not f.empty for f in frames) else pd.DataFrame()
        if not df.empty:
            df = df[(df["tensor_parallel"] == df["tensor_parallel"].max()) & (df["tp_chunks"] == 0)]
            df = df[df["expert_parallel"] == 2]
            panels.append((mode, df))
    if not panels:
        raise FigureDataError("the records table has no monta training steps; run the simulator or the measured sweep")
    fig.set_size_inches(5 * len(panels), 4.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (mode, df) in zip(axes, panels):
        table = df.pivot_table(index=["hardware", "path"], columns="metric", values="value", aggfunc="median")
        table = table.reindex(columns=phases).rename(columns=phase_label)
        table.index = [f"{hw}\n{path}" for hw, path in table.index]
        table.plot.bar(stacked=True, ax=ax, rot=0, fontsize="x-small", color=[phase_colour(p) for p in phases])
        ax.set(ylabel="ms per iteration (phases)", title=mode_title(mode, f"tp {int(df['tensor_parallel'].max())}"))
        if mode == "simulated":
            _published_iteration_gain(ax, table)
        ax.legend()
    fig.suptitle("MoNTA (c): iteration latency, drop-gather vs pipelined (monta)")
    return pd.concat([df for _, df in panels])


def _published_iteration_gain(ax, table: pd.DataFrame) -> None:
    """MoNTA's published iteration gain, drawn as the step it gives: drop-gather's simulated step less
    the published share, over the monta bar of each testbed."""
    gain = published_value(load_registry(), "monta-iteration-gain")
    for i, label in enumerate(table.index):
        hardware, path = label.split("\n")
        if path == "monta" and f"{hardware}\ndrop-gather" in table.index:
            step = table.loc[f"{hardware}\ndrop-gather"].sum() * (1 - gain / 100)
            published_segment(ax, i, step, f"published: monta's iteration {gain:g}% under drop-gather's")


@table(paper="monta", file="monta_strategies")
def strategy_ranking(records: pd.DataFrame) -> pd.DataFrame:
    """Every (tp, ep, dp) layout per testbed: the model's predicted exchange, inter-node bytes, memory
    and rank next to the simulated step's exchange and the rank it implies."""
    metrics = ["model_exchange_ms", "inter_node_bytes", "memory_GB", "fits", "model_rank", "chunks"]
    model = select(records, paper="monta", experiment="monta_strategy")
    model = model[model["metric"].isin(metrics)]
    if model.empty:
        return model
    keys = ["hardware", "world_size", "tensor_parallel", "expert_parallel", "data_parallel"]
    table = model.pivot_table(index=keys, columns="metric", values="value").reset_index()
    simulated = _steps(records, "simulated")
    if simulated.empty:
        table["simulated_exchange_ms"] = float("nan")
    else:
        simulated = simulated[simulated["path"].isin(["monta", "none (tp 1)"]) & (simulated["tp_chunks"] == 0)]
        simulated = simulated[keys + ["exchange_ms"]].rename(columns={"exchange_ms": "simulated_exchange_ms"})
        table = table.merge(simulated, on=keys, how="left")
    # ranked by MoNTA's rule (layouts that fit first), on the simulated exchange instead of the model's
    key = (1 - table["fits"]) * 1e9 + table["simulated_exchange_ms"]
    table["simulated_rank"] = key.groupby(table["hardware"]).rank(method="min")
    table = table.sort_values(["hardware", "model_rank"])
    return table[
        [
            *keys,
            "model_rank",
            "fits",
            "memory_GB",
            "chunks",
            "model_exchange_ms",
            "inter_node_bytes",
            "simulated_exchange_ms",
            "simulated_rank",
        ]
    ]


@figure(paper="monta")
def monta_strategy_ranking(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """(d) MoNTA's ranking of (tp, ep, dp) layouts: predicted vs simulated exchange, layouts that fit marked."""
    table = _required(strategy_ranking(records), "monta_strategy records", "run experiments/monta.py")
    hardware = sorted(table["hardware"].unique())
    fig.set_size_inches(6 * len(hardware), 4.5)
    axes = fig.subplots(1, len(hardware), squeeze=False)[0]
    for ax, hw in zip(axes, hardware):
        df = table[table["hardware"] == hw].copy()
        df["layout"] = [
            f"tp{t:.0f} ep{e:.0f} dp{d:.0f}{' *' if f else ''}"
            for t, e, d, f in zip(df["tensor_parallel"], df["expert_parallel"], df["data_parallel"], df["fits"])
        ]
        long = df.melt(id_vars="layout", value_vars=["model_exchange_ms", "simulated_exchange_ms"], var_name="source")
        sns.barplot(long, x="layout", y="value", hue="source", palette=SOURCE_COLOURS, ax=ax)
        both = df.dropna(subset=["simulated_exchange_ms"])
        rho = (
            spearmanr(both["model_exchange_ms"], both["simulated_exchange_ms"]).statistic
            if len(both) > 2
            else float("nan")
        )
        ax.tick_params(axis="x", labelrotation=45, labelsize="x-small")
        ax.set(
            xlabel="layout in the model's rank order (* fits in memory)",
            ylabel="one exchange (ms)",
            title=f"{hw}: Spearman rho {rho:.2f}",
        )
    fig.suptitle("MoNTA (d): network-traffic-aware strategy ranking, model vs simulated step")
    return table.assign(mode="simulated")


@figure(paper="monta")
def monta_hierarchical(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """(e) Flat vs hierarchical all-to-all vs cluster size (simulated), and measured where the group spans nodes."""
    df = select(records, paper="monta", experiment="sim_train_step", metric="a2a_ms", tensor_parallel=1)
    df = df[df["num_experts"] == df["world_size"]].copy()
    measured = select(records, paper="monta", experiment="monta_a2a", metric="exchange_ms", tensor_parallel=1)
    _required(
        pd.concat([df, measured]), "flat and hierarchical exchanges", "run the simulator (monta.hierarchical_nodes)"
    )
    # A measured panel only where both exchanges ran: one bar compares nothing. The hierarchical one
    # needs a group that spans nodes (the emulated 2-node testbed), which the local runs lack.
    compared = not measured.empty and measured["path"].nunique() > 1
    if df.empty and not compared:
        raise FigureDataError("the records table has no simulated exchanges and no measured hierarchical one")
    fig.set_size_inches(12 if compared else 7, 4.5)
    left, right = fig.subplots(1, 2) if compared else (fig.subplots(), None)
    if not df.empty:
        df["exchange_ms"] = df["value"] / (EXCHANGES_PER_LAYER * df["moe_layers"])
        sns.lineplot(
            df,
            x="world_size",
            y="exchange_ms",
            hue="dispatcher",
            palette=palette("dispatcher", df["dispatcher"]),
            marker="o",
            ax=left,
        )
        sizes = sorted(df["world_size"].astype(int).unique())
        left.set_xscale("log", base=2)
        left.set_xticks(sizes, [str(n) for n in sizes])
        left.minorticks_off()
        left.set(
            xlabel="GPUs (8 per node, one expert each)",
            ylabel="one exchange (ms)",
            title=mode_title("simulated", describe_testbeds(df)),
        )
    if compared:
        measured = one_testbed(measured)
        sns.barplot(
            measured,
            x="path",
            y="value",
            hue="path",
            saturation=1,
            palette=_path_colours(measured),
            ax=right,
            errorbar=None,
            legend=False,
        )
        right.set(
            xlabel="all-to-all",
            ylabel="one exchange (ms, median)",
            title=mode_title("measured", _testbed_words(measured)),
        )
    title = "MoNTA/Tutel (e): flat vs hierarchical all-to-all"
    if not compared:
        measured = measured.iloc[0:0]
        title += "\n(measured: no hierarchical run; its group must span nodes, e.g. the emulated 2-node testbed)"
    fig.suptitle(title)
    return pd.concat([df, measured])
