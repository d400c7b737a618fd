"""Lina's inference: the placement policies' whole inference and MoE-layer time against static
placement (Figs 16-17) and the tail all-to-all per MoE layer (Fig 18), measured (lina/inference) or
simulated; and the helpers that select and describe inference runs."""

from __future__ import annotations

import pandas as pd

from analysis.collect import select
from analysis.registry import Reproducer, describe_testbeds, reproducer
from analysis.units import span

LINA_PATH_LENGTH = 3  # Lina's default l; Figs 16-18 are measured with it (Table 5 varies it)
# The parameters that identify one inference run; the policy varies within a run.
INFERENCE_RUN_KEYS = ["world_size", "num_experts", "path_length", "seed", "a2a_policy"]


def of_experts(rows: pd.DataFrame, experts: int | None) -> pd.DataFrame:
    """The rows of ``experts`` experts (all of them when None)."""
    return rows if experts is None or rows.empty else rows[rows["num_experts"] == experts]


def _inference(records: pd.DataFrame, policy: str, metric: str, experts: int | None = None) -> pd.DataFrame:
    """lina/inference rows of ``metric`` for ``policy`` at path length 3 (and ``experts`` if given)."""
    rows = select(
        records, paper="lina", experiment="inference", policy=policy, metric=metric, path_length=LINA_PATH_LENGTH
    )
    return of_experts(rows, experts)


def inference_setting(rows: pd.DataFrame, path_length: bool = True) -> str:
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
        setting = f"{inference_setting(rows)}, {stat} {what}, {num} / {den}"
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
    rows = of_experts(rows, experts)
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
        f"{inference_setting(rows)}, p95 all-to-all time per MoE layer, static / "
        f"lina, {reduce} over {len(r)} (run, layer) pairs"
    )


@reproducer
def lina_fig18_tail_a2a_reduction_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18_tail_a2a_reduction(records, "mean")


@reproducer
def lina_fig18_tail_a2a_reduction_max(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18_tail_a2a_reduction(records, "max")
