"""Lina (ATC'23): its reproducers and figures (results/figures/lina/). Training: all-to-all share and
slowdown under a concurrent all-reduce (Table 1, Figs 2-4), measured on this machine (gshard/train_step,
common/collectives) or simulated on Lina's testbed, and Lina's policies' speedups (Figs 10-15). Inference:
the placement policies' time and tail (Figs 6, 9, 16-18, §5.2), measured (lina/inference).
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from analysis.collect import TESTBED_COLUMNS, select
from analysis.published import load_registry, published_value
from analysis.registry import (
    FigureDataError,
    Reproducer,
    complete_points,
    describe_testbeds,
    figure,
    one_testbed,
    reproducer,
    train_step_rows,
)
from analysis.style import colour, mode_title, palette, published_line, published_segment
from analysis.units import format_bytes, span
from moe_core.config.load import CommConfig
from moe_core.records.units import MiB

LINA_GPUS = 16  # Lina's testbed: 4 nodes x 4 A100
LINA_TESTBED = "lina-a100-4x4"  # configs/hardware: Lina's 4 x 4 A100, 100 Gb/s IB per node
BASELINE_POLICIES = ["sequential", "overlap"]  # the paper-scale sweep's policies (Lina's are figures of their own)
LINA_FIG3_ENTRY_IDS = {"median": "lina-fig3-a2a-slowdown-median", "worst": "lina-fig3-a2a-slowdown-worst"}


# ---- the data reproducers and figures read ------------------------------------------------------


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
    return (
        f"{describe_testbeds(points)}, policy overlap (DeepSpeed-MoE's), {len(points)} training points, "
        f"{span(points['num_experts'])} experts = GPUs, {what}"
    )


# ---- reproducers: all-to-all share and slowdown (Table 1, Figs 2-3) -------------------------------


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


LINA_XL_EXPERTS = (4, 16)  # the Transformer-XL variants of Table 1 and Fig 6


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


# ---- reproducers: Lina's speedups (Figs 10-13) -----------------------------------------------

LINA_POLICIES_SHOWN = ["lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]


def lina_speedups(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Speedup of every Lina policy over ``overlap`` (DDP) in ``metric`` (baseline / policy) per expert
    count, experts = GPUs, from one testbed's training-step records (measured or simulated). Where a
    policy ran at several partition sizes (Fig 15's sweep), the default size is the one kept."""
    df = records[records["experiment"].isin(["train_step", "sim_train_step"]) & (records["metric"] == metric)]
    if df.empty or "partition_mb" not in df:
        return df.iloc[0:0]
    df = df[df["world_size"] == df["num_experts"]]
    df = (
        df.assign(non_default=df["partition_mb"] != CommConfig.partition_mb)
        .sort_values("non_default")
        .drop_duplicates(["policy", "num_experts"])
    )
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
    # Fig 13 times the same all-to-all with and without Lina's scheduling: the unpacked layout. With
    # packing (policy lina) the exchange itself shrinks to fewer ranks, a different quantity (136x).
    _lina_speedup_reproducer(f"lina_fig13_bwd_a2a_speedup_{_experts}e", "a2a_bwd_ms", _experts, "lina-pipeline")
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


def _lina_at_16(records: pd.DataFrame, metric: str, policy: str = "lina") -> pd.DataFrame:
    """Simulated ``metric`` of ``policy`` at Lina's 16 experts = GPUs, one row per micro-op size."""
    rows = select(records, experiment="sim_train_step", metric=metric, policy=policy, world_size=LINA_GPUS)
    if rows.empty or "partition_mb" not in rows:
        return rows.iloc[0:0]
    return rows[rows["num_experts"] == LINA_GPUS].drop_duplicates("partition_mb").set_index("partition_mb")


@reproducer
def lina_fig15_partition_overhead(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 15's partition + concatenation cost: Lina's copies into and out of micro-ops, share of its step."""
    copies, step = _lina_at_16(records, "partition_ms"), _lina_at_16(records, "step_ms")
    size = CommConfig.partition_mb
    if size not in copies.index or size not in step.index:
        return None
    return 100 * float(copies.loc[size, "value"] / step.loc[size, "value"]), (
        f"{describe_testbeds(step)}, {LINA_GPUS} experts = GPUs, policy lina, {size:g} MB micro-ops: partition "
        "and concatenation copies / step time"
    )


@reproducer
def lina_fig15_transmission_overhead(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 15's micro-op transmission overhead: Lina's gradient all-reduces each alone, in default
    micro-ops over the partition sweep's largest (whole tensors, where it exceeds every tensor), minus 1."""
    alone = _lina_at_16(records, "allreduce_alone_ms")
    size, largest = CommConfig.partition_mb, alone.index.max() if not alone.empty else None
    if size not in alone.index or largest is None or largest <= size:
        return None
    return 100 * float(alone.loc[size, "value"] / alone.loc[largest, "value"] - 1), (
        f"{describe_testbeds(alone)}, {LINA_GPUS} experts = GPUs, policy lina, the gradient all-reduces each "
        f"alone: {size:g} MB micro-ops over {largest:g} MB ones, minus 1"
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


# ---- reproducers: Lina's inference (Figs 6, 9, 16-18, §5.2) ------------------------------------

LINA_PATH_LENGTH = 3  # Lina's default l; Figs 16-18 are measured with it (Table 5 varies it)
# The parameters that identify one inference run; the policy varies within a run.
INFERENCE_RUN_KEYS = ["world_size", "num_experts", "path_length", "seed", "a2a_policy"]


def _of_experts(rows: pd.DataFrame, experts: int | None) -> pd.DataFrame:
    """The rows of ``experts`` experts (all of them when None)."""
    return rows if experts is None or rows.empty else rows[rows["num_experts"] == experts]


def _inference(records: pd.DataFrame, policy: str, metric: str, experts: int | None = None) -> pd.DataFrame:
    """lina/inference rows of ``metric`` for ``policy`` at path length 3 (and ``experts`` if given)."""
    rows = select(
        records, paper="lina", experiment="inference", policy=policy, metric=metric, path_length=LINA_PATH_LENGTH
    )
    return _of_experts(rows, experts)


def _our_inference(rows: pd.DataFrame, path_length: bool = True) -> str:
    """Our inference setting in words: model, experts, ranks (and Lina's path length, which the
    rows were selected on)."""
    known = {c for c in ("moe_layers", "data_zipf", "routing_zipf") if c in rows and rows[c].notna().all()}
    parts = [f"{span(rows['moe_layers'])} MoE layers"] if "moe_layers" in known else []
    parts.append("top-1 gate")
    if "data_zipf" in known:
        parts.append(f"trained on Zipf {span(rows['data_zipf'])} tokens")
    if "routing_zipf" in known:
        parts.append("synthetic routing with Lina's Fig 6 skew and Fig 9 paths")
    model = ", ".join(parts)
    return (
        f"{describe_testbeds(rows)}, our MoE transformer ({model}) with {span(rows['num_experts'])} experts on "
        f"{span(rows['world_size'])} ranks" + (f", path length {LINA_PATH_LENGTH}" if path_length else "")
    )


def _inference_ratio(
    records: pd.DataFrame, num: str, den: str, metric: str, stat: str, experts: int | None
) -> tuple[float, pd.DataFrame] | None:
    """Mean over inference runs of ``stat`` of ``metric``, policy ``num`` over policy ``den``."""
    a, b = _inference(records, num, metric, experts), _inference(records, den, metric, experts)
    if a.empty or b.empty:
        return None
    keys = [k for k in INFERENCE_RUN_KEYS if k in a]
    both = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if both.empty:
        return None
    used = pd.concat([a, b])
    used = used[used.set_index(keys).index.isin(both.set_index(keys).index)]  # the runs with both policies
    return float((both[f"{stat}_a"] / both[f"{stat}_b"]).mean()), used


def _lina_inference_reproducer(
    name: str, num: str, den: str, metric: str, stat: str, experts: int | None, as_percent_worse: bool = False
) -> Reproducer:
    """Register ``name``: ``stat`` of ``metric``, ``num`` / ``den`` (as "worse by %" if asked)."""
    what = {"forward_ms": "whole forward (inference) time", "moe_layer_ms": "MoE layers' time per batch"}[metric]

    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        found = _inference_ratio(records, num, den, metric, stat, experts)
        if found is None:
            return None
        ratio, rows = found
        setting = f"{_our_inference(rows)}, {stat} {what}, {num} / {den}"
        return (100 * (ratio - 1), setting) if as_percent_worse else (ratio, setting)

    return reproducer(reproduce, name)


# Fig 16: whole inference time, static over lina (the means: every expert count there is)
_lina_inference_reproducer("lina_fig16_median_reduction", "static", "lina", "forward_ms", "median", None)
_lina_inference_reproducer("lina_fig16_p95_reduction", "static", "lina", "forward_ms", "p95", None)
for _experts in (4, 16):
    _lina_inference_reproducer(
        f"lina_fig16_median_reduction_{_experts}e", "static", "lina", "forward_ms", "median", _experts
    )
_lina_inference_reproducer("lina_fig16_p95_reduction_16e", "static", "lina", "forward_ms", "p95", 16)
# Fig 16's ablations, "worse by %" than lina, 16 experts
_lina_inference_reproducer(
    "lina_fig16_no_estimation_median_worse_16e",
    "lina-no-estimation",
    "lina",
    "forward_ms",
    "median",
    16,
    as_percent_worse=True,
)
_lina_inference_reproducer(
    "lina_fig16_no_finetune_p95_worse_16e", "lina-no-finetune", "lina", "forward_ms", "p95", 16, as_percent_worse=True
)
# Fig 17: the MoE layers' tail, static over lina
for _experts in (8, 16):
    _lina_inference_reproducer(
        f"lina_fig17_moe_p95_reduction_{_experts}e", "static", "lina", "moe_layer_ms", "p95", _experts
    )


def layer_a2a(records: pd.DataFrame, policy: str, experts: int | None = None) -> pd.DataFrame:
    """Per-layer all-to-all rows (``a2a_layer<i>_ms``) of ``policy`` with the layer as an int column."""
    rows = select(records, paper="lina", experiment="inference", policy=policy, path_length=LINA_PATH_LENGTH)
    rows = rows if rows.empty else rows[rows["metric"].str.fullmatch(r"a2a_layer\d+_ms")]
    rows = _of_experts(rows, experts)
    return rows.assign(layer=rows["metric"].str.extract(r"a2a_layer(\d+)_ms", expand=False).astype(int))


def tail_a2a_reduction(records: pd.DataFrame, experts: int | None = None) -> pd.DataFrame:
    """Per run and MoE layer: p95 all-to-all time of static over lina (Lina Fig 18), column ``reduction``."""
    static, lina = layer_a2a(records, "static", experts), layer_a2a(records, "lina", experts)
    if static.empty or lina.empty:
        return static.iloc[0:0].assign(reduction=[])
    keys = [k for k in INFERENCE_RUN_KEYS if k in static] + ["layer"]
    both = static.merge(lina, on=keys, suffixes=("_static", "_lina")).copy()  # .copy(): one block, not fragments
    return both.assign(reduction=both["p95_static"] / both["p95_lina"])


def _fig18_tail_a2a_reduction(records: pd.DataFrame, reduce: str) -> tuple[float, str] | None:
    """``reduce`` (mean or max) over (run, MoE layer) pairs of static's p95 all-to-all time over lina's, 16 experts."""
    r = tail_a2a_reduction(records, 16).dropna(subset=["reduction"])  # the pairs counted are the pairs used
    if r.empty:
        return None
    rows = _inference(records, "lina", "moe_layer_ms", 16)
    return float(r["reduction"].agg(reduce)), (
        f"{_our_inference(rows)}, p95 all-to-all time per MoE layer, static / "
        f"lina, {reduce} over {len(r)} (run, layer) pairs"
    )


@reproducer
def lina_fig18_tail_a2a_reduction_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18_tail_a2a_reduction(records, "mean")


@reproducer
def lina_fig18_tail_a2a_reduction_max(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18_tail_a2a_reduction(records, "max")


def _profile_statistic(
    records: pd.DataFrame, metric: str, experts: int | None, scale: float, what: str
) -> tuple[float, str] | None:
    """A statistic of the profiled gate choices (the same in every policy's record; static's is read)."""
    rows = select(records, paper="lina", experiment="inference", policy="static", metric=metric)
    rows = _of_experts(rows, experts)
    if rows.empty:
        return None
    return scale * float(rows["value"].mean()), f"{_our_inference(rows, path_length=False)}; {what}"


def _profile_reproducer(name: str, metric: str, experts: int | None, scale: float, what: str) -> Reproducer:
    """Register ``name``: ``_profile_statistic`` of ``metric``."""

    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        return _profile_statistic(records, metric, experts, scale, what)

    return reproducer(reproduce, name)


for _experts in (4, 16):  # Fig 6
    _profile_reproducer(
        f"lina_fig6_popularity_ratio_{_experts}e",
        "popularity_ratio",
        _experts,
        1.0,
        "profiled tokens of the most / least popular expert, mean over MoE layers",
    )


@reproducer
def lina_fig6_idle_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Fig 6's idle expert: the largest share of a batch's pass that the least loaded device waits on the
    busiest one's compute, under static placement (one expert per device), at Fig 6's 4 and 16 experts."""
    s = select(samples, paper="lina", experiment="inference", policy="static", metric="least_busy_idle_share")
    s = s[s["num_experts"].isin(LINA_XL_EXPERTS)] if not s.empty else s
    if s.empty:
        return None
    return 100 * float(s["value"].max()), (
        f"{_our_inference(s, path_length=False)}, static placement, max over {len(s)} batches of the busiest "
        "device's compute time less the least busy one's, over the pass"
    )


for _k in (1, 2):  # Fig 9
    _profile_reproducer(
        f"lina_fig9_next_layer_top{_k}_share",
        f"path_topk_share_k{_k}",
        None,
        100.0,
        f"share of profiled tokens whose next-layer expert is among the top-{_k} of the tokens "
        "that picked the same expert, over layers",
    )


def _lina_policy_value(records: pd.DataFrame, metric: str, scale: float, what: str) -> tuple[float, str] | None:
    """Mean over inference runs of policy lina's single-value ``metric``, times ``scale``."""
    rows = select(records, paper="lina", experiment="inference", policy="lina", metric=metric)
    if rows.empty:
        return None
    setting = f"{describe_testbeds(rows)}, {span(rows['num_experts'])} experts, policy lina, {what}"
    return scale * float(rows["value"].mean()), setting


@reproducer
def lina_inference_replan_rate(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(records, "replan_rate", 100.0, "share of (batch, layer) decisions that re-planned")


@reproducer
def lina_s52_schedule_decision_ms(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(
        records, "schedule_decision_ms", 1.0, "median host time of one layer's placement decision (numpy, rank 0)"
    )


@reproducer
def lina_s52_phase2_check_ms(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(
        records, "phase2_check_ms", 1.0, "median host time of the phase-2 top-2k check where no re-plan was needed"
    )


# ---- figures: all-to-all share and slowdown (Figs 3-4), measured and simulated --------------------


@figure(paper="lina")
def a2a_share_vs_experts(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """All-to-all share of step time vs experts, with the all-to-all data per rank dashed (Lina Fig 4)."""
    df = train_step_rows(records, ["a2a_share", "a2a_bytes"], shown=["policy", "world_size", "num_experts"])
    share = df[df["metric"] == "a2a_share"].assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(
        share,
        x="num_experts",
        y="a2a_share_pct",
        hue="policy",
        palette=palette("policy", share["policy"]),
        style="world_size",
        markers=True,
        dashes=False,
        estimator="median",
        errorbar=None,
        ax=ax,
    )
    ax.set(
        xlabel="experts (total)",
        ylabel="all-to-all share of step time (%, median)",
        title="All-to-all share of step time vs number of experts",
    )
    table1 = published_value(load_registry(), "lina-table1-a2a-share-of-step")
    published_line(ax, table1, f"published: Lina Table 1, {table1:g}% (mean of its models)")
    ax.legend()
    data_mb = df[df["metric"] == "a2a_bytes"].groupby(["world_size", "num_experts"])["value"].median() / 1e6
    twin = ax.twinx()
    grays = sns.color_palette("Greys", data_mb.index.get_level_values("world_size").nunique() + 1)[1:]
    for (world_size, line), color in zip(data_mb.groupby(level="world_size"), grays):
        twin.plot(
            line.index.get_level_values("num_experts"),
            line.to_numpy(),
            ls="--",
            marker=".",
            color=color,
            label=f"a2a data, {world_size} ranks",
        )
    twin.set_ylabel("all-to-all data sent per rank per step (MB)")
    twin.grid(False)
    twin.legend()
    experts = sorted(share["num_experts"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(experts, [str(n) for n in experts])
    ax.xaxis.set_minor_locator(NullLocator())
    return df


@figure(paper="lina")
def a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Empirical CDF of all-to-all slowdown next to an all-reduce, with Lina's Fig 3 numbers."""
    s = contended_slowdowns(samples)
    if s.empty:
        raise FigureDataError(
            "the samples table has no slowdown samples of all_to_all/all_to_all_v "
            ">= 1 MiB with a concurrent all_reduce; run the collectives sweep with "
            "concurrent: all_reduce and collect its records"
        )
    s = one_testbed(s)
    _slowdown_cdf(
        fig.subplots(),
        s,
        "collective",
        "fraction of iterations (CDF)",
        "All-to-all slowdown under a concurrent all-reduce",
    )
    return s


@figure(paper="lina")
def sim_a2a_slowdown_cdf(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Simulated backward all-to-all slowdown (overlap / sequential) on Lina's testbed, per cluster size."""
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", hardware=LINA_TESTBED)
    if s.empty:
        raise FigureDataError(
            f"the samples table has no a2a_bwd_slowdown samples of sim_train_step on "
            f"{LINA_TESTBED}; run the simulated sweep with policy overlap and collect it"
        )
    s = s.astype({"world_size": int})
    _slowdown_cdf(
        fig.subplots(),
        s,
        "world_size",
        "fraction of backward all-to-alls (CDF)",
        f"Simulated all-to-all slowdown under DDP all-reduce ({LINA_TESTBED})",
    )
    return s


def _slowdown_cdf(ax, s: pd.DataFrame, hue: str, ylabel: str, title: str) -> None:
    """Empirical CDF of the slowdown samples ``s``, one line per ``hue``, with Lina's Fig 3 median and worst."""
    for key, group in s.groupby(hue):
        sns.ecdfplot(group, x="value", ax=ax, label=f"{hue} {key} (n={len(group)})")
    registry = load_registry()
    for name, entry_id in LINA_FIG3_ENTRY_IDS.items():
        value = published_value(registry, entry_id)
        published_line(ax, value, f"published: Lina Fig 3 {name}, {value:g}×", horizontal=False)
        ax.annotate(f"Fig 3 {name}", (value, 0.02), xytext=(3, 0), textcoords="offset points", rotation=90, fontsize=7)
    ax.set(xlabel="all-to-all time with concurrent all-reduce / alone (×)", ylabel=ylabel, title=title)
    ax.legend()


@figure(paper="lina")
def sim_a2a_share_vs_cluster_size(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Simulated all-to-all share of step time vs GPUs (experts = GPUs), per cluster and policy."""
    df = select(records, experiment="sim_train_step", metric="a2a_share")
    df = df[df["policy"].isin(BASELINE_POLICIES)] if not df.empty else df
    if df.empty:
        raise FigureDataError("the records table has no sim_train_step a2a_share rows; run the simulated sweep")
    df = df.astype({"world_size": int}).assign(a2a_share_pct=lambda d: 100 * d["value"])
    ax = fig.subplots()
    sns.lineplot(
        df,
        x="world_size",
        y="a2a_share_pct",
        hue="hardware",
        palette=palette("testbed", df["hardware"]),
        style="policy",
        markers=True,
        estimator="median",
        errorbar=None,
        ax=ax,
    )
    sizes = sorted(df["world_size"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(
        xlabel="GPUs (= experts)",
        ylabel="all-to-all share of step time (%, simulated)",
        title="All-to-all share of step time vs cluster size (simulated)",
    )
    return df


# ---- figures: Lina's speedups (simulated on its testbed; measured on this machine) --------------


@figure(paper="lina")
def lina_step_speedup(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Step-time speedup over DDP-style overlap per Lina policy vs experts (= GPUs): Lina's Fig 10
    (policy lina) and its cumulative ablation (Fig 14), one panel per testbed, with Fig 10's averages."""
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
            hue_order=[p for p in LINA_POLICIES_SHOWN if p in set(df["policy"])],
            ax=ax,
        )
        for i, n in enumerate(experts):
            entry = f"lina-fig10-step-speedup-{n}e"
            if entry in registry:
                label = "published: Lina Fig 10, lina over DeepSpeed"
                published_segment(ax, i, published_value(registry, entry), label)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(
            xlabel="experts (= GPUs)",
            ylabel="step-time speedup over overlap (×)",
            title=mode_title(testbed["mode"], testbed["hardware"]),
        )
        ax.legend()
    return pd.concat([df for _, df in panels])


LINA_FIGS_11_TO_13_PANELS = [  # metric, panel title, registry ids "<prefix>-<n>e" of the published values
    ("moe_layer_fwd_ms", "MoE layers, forward (Fig 11)", "lina-fig11-moe-fwd-speedup"),
    ("moe_layer_bwd_ms", "MoE layers, backward (Fig 12)", "lina-fig12-moe-bwd-speedup"),
    ("a2a_bwd_ms", "backward all-to-all (Fig 13)", "lina-fig13-bwd-a2a-speedup"),
]


@figure(paper="lina")
def lina_moe_speedup(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Policy lina over overlap on Lina's testbed (simulated), per experts (= GPUs): the MoE layers'
    forward (Fig 11) and backward (Fig 12) wall time and the backward all-to-all time (Fig 13), with
    the published speedups where the paper gives them."""
    sim = select(records, experiment="sim_train_step", hardware=LINA_TESTBED)
    panels = []
    for metric, title, prefix in LINA_FIGS_11_TO_13_PANELS:
        df = lina_speedups(sim, metric)
        panels.append((metric, title, prefix, df[df["policy"] == "lina"] if not df.empty else df))
    if all(df.empty for *_, df in panels):
        raise FigureDataError(
            f"the records table has no simulated {'/'.join(m for m, *_ in LINA_FIGS_11_TO_13_PANELS)} of "
            f"policy lina next to overlap on {LINA_TESTBED}; run the lina sweep and collect it"
        )
    registry = load_registry()
    fig.set_size_inches(12, 4)
    axes = fig.subplots(1, len(panels))  # own scales: packing can all but remove an all-to-all
    for ax, (metric, title, prefix, df) in zip(axes, panels):
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
            color=colour("policy", "lina"),
            errorbar=None,
            ax=ax,
        )
        for i, n in enumerate(experts):
            if f"{prefix}-{n}e" in registry:
                label = "published: Lina over DeepSpeed"
                published_segment(ax, i, published_value(registry, f"{prefix}-{n}e"), label)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(xlabel="experts (= GPUs)", ylabel="speedup of lina over overlap (×)")
        ax.legend()
    fig.suptitle(f"Lina's MoE layers and backward all-to-all (simulated, {LINA_TESTBED})")
    return pd.concat([df for *_, df in panels])


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
    ax.set(
        xlabel="micro-op (partition) size (MB)",
        ylabel="step time (ms, simulated)",
        title=f"Lina step time vs partition size, {int(df['num_experts'].iloc[0])} experts ({LINA_TESTBED})",
    )
    return df


# ---- figures: Lina's inference (measured) --------------------------------------------------------

LINA_INFERENCE_POLICIES_SHOWN = ("ideal", "static", "lina", "lina-no-estimation", "lina-no-finetune")


def _normalised_to_ideal(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Median and p95 of ``metric`` per policy over the ideal policy's median in the same run, long
    form (policy, num_experts, statistic, normalised)."""
    df = select(records, paper="lina", experiment="inference", metric=metric, path_length=LINA_PATH_LENGTH)
    if df.empty:
        return df.assign(statistic=[], normalised=[])
    keys = [k for k in INFERENCE_RUN_KEYS if k in df]
    ideal = df[df["policy"] == "ideal"][[*keys, "median"]].rename(columns={"median": "ideal_median"})
    df = df.merge(ideal, on=keys)
    long = df.melt(
        id_vars=["policy", "num_experts", "ideal_median"],
        value_vars=["median", "p95"],
        var_name="statistic",
        value_name="ms",
    )
    return long.assign(normalised=long["ms"] / long["ideal_median"])


@figure(paper="lina")
def lina_inference(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """Measured inference per placement policy, one row per expert count: whole inference time (Fig
    16) and the MoE layers' time (Fig 17), median and p95 normalised to a perfectly balanced gate's
    median; and each MoE layer's p95 all-to-all time, static vs lina (Fig 18)."""
    return _draw_inference(select(records, mode="measured"), fig, "experiments/inference.py (rule lina_inference)")


@figure(paper="lina")
def lina_inference_simulated(records: pd.DataFrame, samples: pd.DataFrame, fig: Figure) -> pd.DataFrame:
    """As lina_inference, simulated at the paper's scale (experts = GPUs of Lina's testbed, synthetic
    routing with the paper's skew and path following)."""
    return _draw_inference(
        select(records, mode="simulated"),
        fig,
        "experiments/lina_inference_sim.py (rule lina_inference_simulated)",
    )


STATISTIC_GREYS = {"median": "0.35", "p95": "0.7"}  # greys: the bars' policy is on the axis, not in a colour


def _draw_inference(records: pd.DataFrame, fig: Figure, producer: str) -> pd.DataFrame:
    """The inference figure of one testbed's records; returns its rows."""
    rows = select(records, paper="lina", experiment="inference")
    if rows.empty or not {"forward_ms", "moe_layer_ms"} & set(rows["metric"]):
        raise FigureDataError(
            f"the records table has no lina inference forward_ms / moe_layer_ms rows; run {producer} and "
            "collect its records"
        )
    one_testbed(rows)
    panels = [
        (_normalised_to_ideal(records, "forward_ms"), "whole inference time (Fig 16)"),
        (_normalised_to_ideal(records, "moe_layer_ms"), "MoE layers' time (Fig 17)"),
    ]
    tails = tail_a2a_reduction(records)
    experts = sorted(
        {int(n) for df, _ in panels for n in df["num_experts"].unique()}
        | {int(n) for n in tails["num_experts"].unique()}
    )
    if not experts:
        raise FigureDataError(
            f"the lina inference records have no ideal policy at path length {LINA_PATH_LENGTH} "
            "to normalise to, nor per-layer all-to-all times"
        )
    fig.set_size_inches(13, 0.8 + 3.6 * len(experts))
    axes = fig.subplots(len(experts), 3, squeeze=False)
    for row, n in zip(axes, experts):
        for ax, (df, what) in zip(row[:2], panels):
            df = df[df["num_experts"] == n]
            ax.set_title(f"{n} experts: {what}")
            if df.empty:
                ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
                continue
            order = [p for p in LINA_INFERENCE_POLICIES_SHOWN if p in set(df["policy"])]
            sns.barplot(
                df,
                x="policy",
                y="normalised",
                hue="statistic",
                palette=STATISTIC_GREYS,
                order=order,
                errorbar=None,
                ax=ax,
            )
            ax.axhline(1.0, color="0.5", lw=0.8)
            ax.tick_params(axis="x", labelrotation=20, labelsize="x-small")
            ax.set(xlabel="placement policy", ylabel="time / ideal's median (×)")
        _tail_a2a_panel(row[2], tails[tails["num_experts"] == n] if not tails.empty else tails, n)
    fig.suptitle(
        f"Lina inference, path length {LINA_PATH_LENGTH}, {rows['backend'].iloc[0]} on "
        f"{rows['hardware'].iloc[0]}, {span(rows['world_size'])} ranks"
    )
    return rows


def _tail_a2a_panel(ax, tails: pd.DataFrame, experts: int) -> None:
    """p95 all-to-all time per MoE layer, static vs lina, with the reduction's mean and max (Fig 18)."""
    if tails.empty:
        ax.set_title(f"{experts} experts: tail all-to-all per layer (Fig 18)")
        ax.text(0.5, 0.5, "no per-layer all-to-all times", ha="center", transform=ax.transAxes)
        return
    long = tails.melt(id_vars=["layer"], value_vars=["p95_static", "p95_lina"], var_name="policy", value_name="p95_ms")
    long["policy"] = long["policy"].str.removeprefix("p95_")
    sns.barplot(
        long,
        x="layer",
        y="p95_ms",
        hue="policy",
        saturation=1,
        palette=palette("policy", long["policy"]),
        hue_order=["static", "lina"],
        errorbar=None,
        ax=ax,
    )
    ax.set(
        xlabel="MoE layer",
        ylabel="p95 all-to-all time per batch (ms)",
        title=f"{experts} experts: tail all-to-all per layer (Fig 18); static / lina "
        f"mean {tails['reduction'].mean():.2f}×, max {tails['reduction'].max():.2f}×",
    )
    ax.title.set_fontsize("small")
