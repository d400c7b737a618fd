"""Lina's training all-to-all: its share of the step (Table 1, Fig 2) and its slowdown next to a
concurrent all-reduce (Fig 3), measured on this machine (gshard/train_step, common/collectives) or
simulated on Lina's testbed."""

from __future__ import annotations

import pandas as pd

from analysis.collect import select
from analysis.papers.lina.testbed import LINA_GPUS, LINA_XL_EXPERTS
from analysis.registry import Reproducer, complete_points, describe_testbeds, reproducer
from analysis.units import format_bytes, span
from moe_core.units import MiB


def contended_slowdowns(samples: pd.DataFrame, collectives=("all_to_all", "all_to_all_v")) -> pd.DataFrame:
    """Per-iteration slowdown samples of collectives run next to an all-reduce, messages >= 1 MiB.

    Lina's Fig 3 measures backward all-to-alls of real models, which move megabytes; smaller messages
    are latency-bound and say little about bandwidth sharing.
    """
    s = select(samples, paper="common", experiment="collectives", metric="slowdown", concurrent="all_reduce")
    return s if s.empty else s[s["collective"].isin(collectives) & (s["size_bytes"] >= MiB)]


def _slowdown_setting(s: pd.DataFrame) -> str:
    """Where the slowdown samples ``s`` come from, in words, with their count."""
    return (
        f"{describe_testbeds(s)}, {span(s['world_size'])} ranks, {span(s['size_bytes'], format_bytes)}, "
        f"{len(s)} samples"
    )


def _baseline_points(records: pd.DataFrame, metrics: list[str], experts: tuple[int, ...]) -> pd.DataFrame:
    """One row per training-step point of DeepSpeed-MoE's schedule (policy ``overlap``) with experts =
    ranks in ``experts``, a column per metric: the measured points, else the simulated ones."""
    for experiment in ("train_step", "sim_train_step"):
        rows = select(records, experiment=experiment, policy="overlap")
        if rows.empty:
            continue
        rows = rows[(rows["world_size"] == rows["num_experts"]) & rows["num_experts"].isin(experts)]
        index = ["point", "hardware", "backend", "num_experts"]
        wide = complete_points(rows, index, metrics, f"DeepSpeed-MoE's {experiment} points")
        if not wide.empty:
            return wide
    return pd.DataFrame()


def _baseline_setting(points: pd.DataFrame, what: str) -> str:
    """The setting of DeepSpeed-MoE's training ``points`` in words, then ``what`` was taken of them."""
    return (
        f"{describe_testbeds(points)}, policy overlap (DeepSpeed-MoE's), {len(points)} training points, "
        f"{span(points['num_experts'])} experts = GPUs, {what}"
    )


def _fig3_slowdowns(samples: pd.DataFrame) -> tuple[pd.Series, str] | None:
    """Measured all_to_all slowdowns (collectives), else simulated backward all-to-all slowdowns at
    Lina's scale (16 GPUs); with the setting they come from."""
    s = contended_slowdowns(samples, ("all_to_all",))
    if not s.empty:
        return s["value"], _slowdown_setting(s)
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", world_size=LINA_GPUS)
    if s.empty:
        return None
    return s[
        "value"
    ], f"{describe_testbeds(s)}, {LINA_GPUS} GPUs = experts, overlap vs sequential, {len(s)} backward all-to-alls"


@reproducer
def lina_fig3_slowdown_median(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].median()), found[1])


@reproducer
def lina_fig3_slowdown_worst(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].max()), found[1])


@reproducer
def lina_table1_training_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Table 1's training rows: the all-to-all's share of the step under DeepSpeed-MoE, 4 and 16 experts."""
    points = _baseline_points(records, ["a2a_share"], LINA_XL_EXPERTS)
    if points.empty:
        return None
    return 100 * float(points["a2a_share"].mean()), _baseline_setting(points, "mean of a2a_share")


@reproducer
def lina_table1_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Table 1's average over training and inference: the training rows' shares and the inference
    pass's under static placement (Lina's baseline), 4 and 16 experts; both needed."""
    points = _baseline_points(records, ["a2a_share"], LINA_XL_EXPERTS)
    inference = select(records, experiment="inference", policy="static", metric="a2a_share")
    inference = inference[inference["num_experts"].isin(LINA_XL_EXPERTS)] if not inference.empty else inference
    if points.empty or inference.empty:
        return None
    shares = [*points["a2a_share"], *inference["value"]]
    what = f"mean of a2a_share over them and over {len(inference)} inference runs (static placement)"
    return 100 * float(sum(shares) / len(shares)), _baseline_setting(points, what)


@reproducer
def lina_fig2_a2a_share_of_moe(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 2: the all-to-alls' share of the MoE layers' forward time under DeepSpeed-MoE, 16 experts."""
    points = _baseline_points(records, ["a2a_fwd_ms", "moe_layer_fwd_ms"], (LINA_GPUS,))
    if points.empty:
        return None
    share = points["a2a_fwd_ms"] / points["moe_layer_fwd_ms"]
    return 100 * float(share.mean()), _baseline_setting(points, "forward all-to-alls / MoE layers' forward time")


# Table 1's rows: (mode, what) -> the record metric and the factor to the published unit (ms, %).
TABLE1_METRICS = {"a2a_ms": ("a2a_ms", 1.0), "a2a_share": ("a2a_share", 100.0)}


def _table1_row_reproducer(mode: str, what: str, experts: int) -> Reproducer:
    """Register one of Table 1's rows for the simulated 24-layer model: DeepSpeed-MoE's all-to-all time
    (``what`` a2a_ms) or share (a2a_share) at ``experts`` experts = GPUs, in training (the step, policy
    overlap) or inference (the forward pass under static placement, mean over the run's batches)."""
    metric, factor = TABLE1_METRICS[what]

    def training(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        points = _baseline_points(records, [metric], (experts,))
        if points.empty:
            return None
        return factor * float(points[metric].mean()), _baseline_setting(points, f"{metric} per step")

    def inference(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        rows = select(records, experiment="inference", policy="static", metric=metric, num_experts=experts)
        if rows.empty:
            return None
        setting = f"{describe_testbeds(rows)}, static placement (DeepSpeed-MoE's), {experts} experts = GPUs"
        return factor * float(rows["value"].mean()), f"{setting}, {len(rows)} runs, {metric} per forward pass"

    return reproducer({"training": training, "inference": inference}[mode], f"lina_table1_{mode}_{what}_{experts}e")


for _mode in ("training", "inference"):
    for _what in TABLE1_METRICS:
        for _experts in LINA_XL_EXPERTS:
            _table1_row_reproducer(_mode, _what, _experts)
