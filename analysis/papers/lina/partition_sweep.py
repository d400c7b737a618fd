"""Lina's micro-op (partition) size, Fig 15: what partitioning costs at the run's size (the copies, the
all-reduces' transmission overhead) and the step time over the partition sweep, simulated on Lina's
testbed at its 16 experts = GPUs."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.collect import select
from analysis.papers.lina.run_partition import run_partition_sizes, training_rows
from analysis.papers.lina.testbed import LINA_GPUS, LINA_TESTBED
from analysis.registry import FigureDataError, describe_testbeds, figure, reproducer
from analysis.style import colour


def _lina_at_16(records: pd.DataFrame, metric: str, policy: str = "lina") -> pd.DataFrame:
    """Simulated ``metric`` of ``policy`` at Lina's 16 experts = GPUs, one row per micro-op size."""
    rows = select(records, experiment="sim_train_step", metric=metric, policy=policy, world_size=LINA_GPUS)
    if rows.empty or "partition_mb" not in rows:
        return rows.iloc[0:0]
    return rows[rows["num_experts"] == LINA_GPUS].drop_duplicates("partition_mb").set_index("partition_mb")


def _lina_run_size(records: pd.DataFrame) -> float | None:
    """The micro-op size of policy lina's run (run_partition_sizes); None where its records single out none."""
    return run_partition_sizes(training_rows(records, "step_ms")).get("lina")


@reproducer
def lina_fig15_partition_overhead(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 15's partition + concatenation cost: Lina's copies into and out of micro-ops, share of its step."""
    copies, step = _lina_at_16(records, "partition_ms"), _lina_at_16(records, "step_ms")
    size = _lina_run_size(records)
    if size not in copies.index or size not in step.index:
        return None
    return 100 * float(copies.loc[size, "value"] / step.loc[size, "value"]), (
        f"{describe_testbeds(step)}, {LINA_GPUS} experts = GPUs, policy lina, {size:g} MB micro-ops: partition "
        "and concatenation copies / step time"
    )


@reproducer
def lina_fig15_transmission_overhead(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 15's micro-op transmission overhead: Lina's gradient all-reduces each alone, in the run's
    micro-ops over the partition sweep's largest (whole tensors, where it exceeds every tensor), minus 1."""
    alone = _lina_at_16(records, "allreduce_alone_ms")
    size, largest = _lina_run_size(records), alone.index.max() if not alone.empty else None
    if size not in alone.index or largest is None or largest <= size:
        return None
    return 100 * float(alone.loc[size, "value"] / alone.loc[largest, "value"] - 1), (
        f"{describe_testbeds(alone)}, {LINA_GPUS} experts = GPUs, policy lina, the gradient all-reduces each "
        f"alone: {size:g} MB micro-ops over {largest:g} MB ones, minus 1"
    )


@figure(paper="lina")
def lina_partition_sweep(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Step time of policy lina vs micro-op (partition) size at the largest expert count (Lina Fig 15)."""
    df = select(records, experiment="sim_train_step", hardware=LINA_TESTBED, policy="lina", metric="step_ms")
    if df.empty:
        raise FigureDataError(
            f"the records table has no simulated step_ms of policy lina on {LINA_TESTBED}; "
            "run the lina partition sweep and collect it"
        )
    df = df[df["num_experts"] == df["num_experts"].max()]
    ax = fig.subplots()
    sns.lineplot(df, x="partition_mb", y="value", marker="o", color=colour("policy", "lina"), ax=ax)
    # From zero, with the spread in words: a y axis fitted to the data draws a 0.5% change as a cliff.
    spread = 100 * (df["value"].max() / df["value"].min() - 1)
    ax.set_ylim(0, 1.1 * df["value"].max())
    ax.set(
        xlabel="micro-op (partition) size (MB)",
        ylabel="step time (ms, simulated)",
        title=f"Lina step time vs partition size, {int(df['num_experts'].iloc[0])} experts ({LINA_TESTBED}):\n"
        f"slowest {spread:.1f}% over fastest",
    )
    return df
