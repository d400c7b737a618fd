"""Lina's policies' training speedups over DeepSpeed-MoE's schedule (overlap): the step (Figs 10, 14),
the MoE layers' passes (Figs 11-12) and the backward all-to-all (Fig 13), and expert packing's own
gain, on one testbed's training-step records (measured or simulated)."""

from __future__ import annotations

import pandas as pd

from analysis.papers.lina.run_partition import run_partition_sizes, training_rows
from analysis.papers.lina.testbed import LINA_GPUS
from analysis.registry import Reproducer, describe_testbeds, reproducer

LINA_POLICIES_SHOWN = ["lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]
# Fig 13 times the same all-to-all with and without Lina's scheduling: the unpacked layout. With
# packing (policy lina) the exchange itself shrinks to fewer ranks, a different quantity (136x).
FIG13_POLICY = "lina-pipeline"


def lina_speedups(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Speedup of every Lina policy over ``overlap`` (DDP) in ``metric`` (baseline / policy) per expert
    count, experts = GPUs, from one testbed's training-step records (measured or simulated). Where a
    policy ran at several partition sizes (Fig 15's sweep), its run's size is the one kept
    (run_partition_sizes); a policy whose records single out none has no speedup there."""
    df = training_rows(records, metric)
    if df.empty:
        return df
    df = (
        df.assign(other_size=df["partition_mb"] != df["policy"].map(run_partition_sizes(df)))
        .sort_values("other_size")
        .drop_duplicates(["policy", "num_experts"])
    )
    df = df[~df["other_size"] | df["partition_mb"].isna()]  # a point of no partition size: the only one there is
    base = df[df["policy"] == "overlap"].set_index("num_experts")
    df = df[df["policy"].isin(LINA_POLICIES_SHOWN) & df["num_experts"].isin(base.index)]
    return df.assign(
        experts=df["num_experts"].astype(int),
        # a policy that removes the metric's time altogether (packing every expert on each GPU leaves
        # no all-to-all) has no speedup in it: NaN, not infinity
        speedup=base.loc[df["num_experts"], "value"].to_numpy() / df["value"].where(df["value"] > 0).to_numpy(),
        baseline_point=base.loc[df["num_experts"], "point"].to_numpy(),
    )


def _lina_speedup_reproducer(name: str, metric: str, experts: int, policy: str = "lina") -> Reproducer:
    """Register ``name``: ``policy``'s speedup over overlap in ``metric`` at ``experts`` experts (= GPUs)."""

    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        s = lina_speedups(records, metric)
        s = s if s.empty else s[(s["policy"] == policy) & (s["experts"] == experts)]
        if s.empty:
            return None
        return float(s["speedup"].iloc[0]), (
            f"{describe_testbeds(s)}, {experts} experts = GPUs, {metric} of overlap / "
            f"{policy}, micro-ops {s['partition_mb'].iloc[0]:g} MB"
        )

    return reproducer(reproduce, name)


for _experts in (2, 4, 8, 16):
    _lina_speedup_reproducer(f"lina_fig10_step_speedup_{_experts}e", "step_ms", _experts)
for _experts in (4, 8, 16):
    _lina_speedup_reproducer(f"lina_fig13_bwd_a2a_speedup_{_experts}e", "a2a_bwd_ms", _experts, FIG13_POLICY)
for _experts in (2, 8):  # Figs 11-12: the MoE layers' wall time per pass
    _lina_speedup_reproducer(f"lina_fig11_moe_fwd_speedup_{_experts}e", "moe_layer_fwd_ms", _experts)
    _lina_speedup_reproducer(f"lina_fig12_moe_bwd_speedup_{_experts}e", "moe_layer_bwd_ms", _experts)

LINA_FIG10_EXPERTS = (2, 4, 8, 16)


@reproducer
def lina_fig10_step_speedup_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The intro's average step-time speedup: the mean of Fig 10's four expert counts (all needed)."""
    s = lina_speedups(records, "step_ms")
    s = s if s.empty else s[(s["policy"] == "lina") & s["experts"].isin(LINA_FIG10_EXPERTS)]
    if s.empty or set(s["experts"]) != set(LINA_FIG10_EXPERTS):
        return None
    return float(s["speedup"].mean()), (
        f"{describe_testbeds(s)}, mean over {'/'.join(map(str, LINA_FIG10_EXPERTS))} experts = GPUs, "
        f"step_ms of overlap / lina, micro-ops {s['partition_mb'].iloc[0]:g} MB"
    )


@reproducer
def lina_packing_step_speedup(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Expert packing's own step-time gain: Lina without packing (lina-pipeline) over Lina, the mean
    over Fig 10's expert counts (all needed), the secondary summaries' "packing gives 1.19x" read so."""
    s = lina_speedups(records, "step_ms")
    s = s if s.empty else s[s["experts"].isin(LINA_FIG10_EXPERTS)]
    by_policy = s.pivot_table(index="experts", columns="policy", values="speedup") if not s.empty else s
    if s.empty or not {"lina", "lina-pipeline"} <= set(by_policy) or set(by_policy.index) != set(LINA_FIG10_EXPERTS):
        return None
    gain = by_policy["lina"] / by_policy["lina-pipeline"]
    return float(gain.mean()), (
        f"{describe_testbeds(s)}, mean over {'/'.join(map(str, LINA_FIG10_EXPERTS))} experts = GPUs, step_ms of "
        f"lina-pipeline / lina (packing alone: {', '.join(f'{g:.2f}x' for g in gain)})"
    )


@reproducer
def lina_fig12_moe_utilisation_gain_16e(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Relative gain (%) of the compute stream's busy share of the MoE layers' wall time, lina over
    overlap, 16 experts (the text's GPU utilisation in the MoE layer, "up by >= 16%")."""
    s = lina_speedups(records, "moe_compute_share")  # speedup = overlap's share / lina's
    s = s if s.empty else s[(s["policy"] == "lina") & (s["experts"] == LINA_GPUS)]
    if s.empty:
        return None
    return 100 * (1 / float(s["speedup"].iloc[0]) - 1), (
        f"{describe_testbeds(s)}, {LINA_GPUS} experts = GPUs, (gate + expert time) / MoE layers' wall time (forward + "
        f"backward) of lina over overlap, minus 1, micro-ops {s['partition_mb'].iloc[0]:g} MB"
    )
