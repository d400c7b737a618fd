"""Which micro-op (partition) size is a run's, read from its training-step records alone.

A run's training steps use one partition size (``comm.partition_mb``, which a config may set; the
measured Lina points ``lina.measured_partition_mb``), except Lina's Fig 15 sweep: policy lina at more
sizes, at the largest expert count only (moe_core/papers/lina/sweeps.py). So a policy's size is the
one its records carry at every expert count it ran; where it ran at one count only, at several sizes,
the one of them that another policy ran at. Where the records single out none, the policy has none:
its rows are left out rather than guessed at. A record without a partition size says nothing of it.
"""

from __future__ import annotations

import pandas as pd


def training_rows(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One testbed's training-step rows of ``metric`` (measured or simulated) with experts = GPUs; none
    when the records carry no partition size."""
    df = records[records["experiment"].isin(["train_step", "sim_train_step"]) & (records["metric"] == metric)]
    if df.empty or "partition_mb" not in df:
        return df.iloc[0:0]
    return df[df["world_size"] == df["num_experts"]]


def run_partition_sizes(rows: pd.DataFrame) -> dict[str, float]:
    """Policy -> the micro-op size of its run, from ``rows`` (training_rows); a policy whose records
    single out no size, or carry none, is absent."""
    if rows.empty:
        return {}
    sizes = rows.dropna(subset=["partition_mb"]).groupby(["policy", "num_experts"])["partition_mb"].agg(frozenset)
    shared = {policy: frozenset.intersection(*per_count) for policy, per_count in sizes.groupby(level="policy")}
    settled = {policy: next(iter(s)) for policy, s in shared.items() if len(s) == 1}
    others = set(settled.values())
    for policy, candidates in shared.items():
        if policy not in settled and len(candidates & others) == 1:
            settled[policy] = next(iter(candidates & others))
    return settled
