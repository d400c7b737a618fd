"""Lina's figures of its policies' training speedups: the step per policy and testbed (Figs 10, 14)
and the MoE layers and backward all-to-all on Lina's testbed (Figs 11-13)."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.collect import TESTBED_COLUMNS, select
from analysis.papers.lina.speedups import FIG13_POLICY, LINA_POLICIES_SHOWN, lina_speedups
from analysis.papers.lina.testbed import LINA_TESTBED
from analysis.published import load_registry, published_value
from analysis.registry import FigureDataError, figure
from analysis.style import colour, mode_title, palette, published_segment, verdict_range


@figure(paper="lina", judged=True)
def lina_step_speedup(
    records: pd.DataFrame, samples: pd.DataFrame, fig: Figure, judged: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Step-time speedup over DDP-style overlap per Lina policy vs experts (= GPUs): Lina's Fig 10
    (policy lina) and its cumulative ablation (Fig 14), one panel per testbed, with Fig 10's averages
    and, over policy lina's bars, the range its verdicts read (``judged``: the comparison)."""
    panels = [
        (testbed, lina_speedups(select(records, **testbed), "step_ms"))
        for testbed in records[TESTBED_COLUMNS].drop_duplicates().to_dict("records")
    ]
    panels = [(testbed, df) for testbed, df in panels if not df.empty]
    if not panels:
        raise FigureDataError(
            "the records table has no step_ms of Lina policies next to overlap with experts = "
            "GPUs; run the lina sweeps (configs/default.yaml: lina) and collect them"
        )
    registry = load_registry()
    fig.set_size_inches(4 + 2.5 * len(panels), 4.5)
    for ax, (testbed, df) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        experts = sorted(df["experts"].unique())
        sns.barplot(
            df,
            x="experts",
            y="speedup",
            hue="policy",
            saturation=1,
            palette=palette("policy", df["policy"]),
            order=experts,
            hue_order=(hue_order := [p for p in LINA_POLICIES_SHOWN if p in set(df["policy"])]),
            ax=ax,
        )
        lina_x = bar_centres(ax, hue_order, "lina")
        for i, n in enumerate(experts):
            entry = f"lina-fig10-step-speedup-{n}e"
            if entry in registry:
                label = "published: Lina Fig 10, lina over DeepSpeed"
                published_segment(ax, i, published_value(registry, entry), label)
                verdict_range(ax, lina_x.get(i, i), judged, entry, testbed)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(
            xlabel="experts (= GPUs)",
            ylabel="step-time speedup over overlap (×)",
            title=mode_title(testbed["mode"], testbed["hardware"]),
        )
        ax.legend()
    return pd.concat([df for _, df in panels])


def bar_centres(ax, hue_order: list[str], hue: str) -> dict[int, float]:
    """Category index -> the x of ``hue``'s bar in it, on a seaborn bar chart drawn with ``hue_order``
    (one bar container per hue level, in that order); {} when ``hue`` is not drawn."""
    if hue not in hue_order:
        return {}
    bars = ax.containers[hue_order.index(hue)]
    return {round(bar.get_x() + bar.get_width() / 2): bar.get_x() + bar.get_width() / 2 for bar in bars}


# metric, panel title, registry ids "<prefix>-<n>e" of the published values, the policy the verdicts
# score there (analysis.papers.lina.speedups)
LINA_FIGS_11_TO_13_PANELS = [
    ("moe_layer_fwd_ms", "MoE layers, forward (Fig 11)", "lina-fig11-moe-fwd-speedup", "lina"),
    ("moe_layer_bwd_ms", "MoE layers, backward (Fig 12)", "lina-fig12-moe-bwd-speedup", "lina"),
    ("a2a_bwd_ms", "backward all-to-all (Fig 13)", "lina-fig13-bwd-a2a-speedup", FIG13_POLICY),
]


@figure(paper="lina", judged=True)
def lina_moe_speedup(
    records: pd.DataFrame, samples: pd.DataFrame, fig: Figure, judged: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Lina's policies over overlap on Lina's testbed (simulated), per experts (= GPUs): policy lina in
    the MoE layers' forward (Fig 11) and backward (Fig 12) wall time, and in the backward all-to-all
    time (Fig 13) the unpacked policy the verdict scores, with the published speedups where the paper
    gives them and the range each verdict reads (``judged``: the comparison)."""
    sim = select(records, experiment="sim_train_step", hardware=LINA_TESTBED)
    panels = []
    for metric, title, prefix, policy in LINA_FIGS_11_TO_13_PANELS:
        df = lina_speedups(sim, metric)
        panels.append(
            (metric, f"{title}: {policy}", prefix, policy, df[df["policy"] == policy] if not df.empty else df)
        )
    if all(df.empty for *_, df in panels):
        raise FigureDataError(
            f"the records table has no simulated {'/'.join(m for m, *_ in LINA_FIGS_11_TO_13_PANELS)} of "
            f"Lina's policies next to overlap on {LINA_TESTBED}; run the lina sweep and collect it"
        )
    registry = load_registry()
    testbed = sim[TESTBED_COLUMNS].iloc[0].to_dict()  # sim_train_step's records: simulated, one profile
    fig.set_size_inches(12, 4)
    axes = fig.subplots(1, len(panels))  # own scales: packing can all but remove an all-to-all
    for ax, (metric, title, prefix, policy, df) in zip(axes, panels):
        ax.set_title(title)
        if df.empty:  # records from before the metric existed
            ax.text(0.5, 0.5, f"no {metric}", ha="center", transform=ax.transAxes)
            continue
        experts = sorted(df["experts"].unique())
        sns.barplot(
            df,
            x="experts",
            y="speedup",
            order=experts,
            saturation=1,
            color=colour("policy", policy),
            errorbar=None,
            ax=ax,
        )
        for i, n in enumerate(experts):
            if f"{prefix}-{n}e" in registry:
                label = "published: Lina over DeepSpeed"
                published_segment(ax, i, published_value(registry, f"{prefix}-{n}e"), label)
                verdict_range(ax, i, judged, f"{prefix}-{n}e", testbed)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(xlabel="experts (= GPUs)", ylabel="speedup over overlap (×)")
        ax.legend()
    fig.suptitle(f"Lina's MoE layers and backward all-to-all (simulated, {LINA_TESTBED})")
    return pd.concat([df for *_, df in panels])
