"""Our numbers next to the published ones: one row per registry entry and testbed, with a verdict.

A reproducer is ``f(records, samples) -> (value, setting_description)``, or None when the tables lack
the data it needs. compare() calls it once per testbed (mode × backend × hardware), so measured and
simulated numbers, or numbers from different machines, are never pooled into one value.

    python -m analysis.compare --records results/tables/records.csv \
        --samples results/tables/samples.csv --out results/tables/comparison.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from analysis.collect import select
from analysis.files import read_tables, write_csv
from analysis.published import REGISTRY_PATH, load_registry
from analysis.units import MiB, format_bytes
from moe_core.config import CommConfig

Reproducer = Callable[[pd.DataFrame, pd.DataFrame], tuple[float, str] | None]
REPRODUCERS: dict[str, Reproducer] = {}
TESTBED = ["mode", "backend", "hardware"]
COLUMNS = ["id", "paper", "figure", "metric", "setting", "published", "unit", "status", "tolerance",
           *TESTBED, "reproduced", "reproduced_setting", "ratio", "verdict"]
CONSISTENT, DIFFERS, NOT_REPRODUCED = "consistent", "differs", "not-reproduced"
LINA_GPUS = 16  # Lina's testbed: 4 nodes x 4 A100


def reproducer(fn: Reproducer, name: str | None = None) -> Reproducer:
    """Register ``fn`` under its name (or ``name``, for functions made in a loop), so published.yaml
    entries can refer to it."""
    if name is not None:
        fn.__name__ = name
    REPRODUCERS[fn.__name__] = fn
    return fn


# ---- the data reproducers read ----------------------------------------------------------------

def contended_slowdowns(samples: pd.DataFrame, collectives=("all_to_all", "all_to_all_v")) -> pd.DataFrame:
    """Per-iteration slowdown samples of collectives run next to an all-reduce, messages >= 1 MiB.

    Lina's Fig 3 measures backward all-to-alls of real models, which move megabytes; smaller messages
    are latency-bound and say little about bandwidth sharing.
    """
    s = select(samples, paper="common", experiment="collectives", metric="slowdown", concurrent="all_reduce")
    return s if s.empty else s[s["collective"].isin(collectives) & (s["size_bytes"] >= MiB)]


def _span(values: pd.Series, fmt: Callable[[Any], str] = "{:g}".format) -> str:
    lo, hi = values.min(), values.max()
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def _where(df: pd.DataFrame) -> str:
    return ", ".join(sorted(set(df["hardware"] + " " + df["backend"])))


def _slowdown_setting(s: pd.DataFrame) -> str:
    return (f"{_where(s)}, {_span(s['world_size'])} ranks, {_span(s['size_bytes'], format_bytes)}, "
            f"{len(s)} samples")


def _train_step_mean_pct(records: pd.DataFrame, metric: str) -> tuple[float, str] | None:
    """Mean over training-step points of a fraction's median, in percent: measured points, else
    simulated points at Lina's scale (up to 16 GPUs)."""
    rows = select(records, paper="gshard", experiment="train_step", metric=metric)
    if rows.empty:
        rows = select(records, experiment="sim_train_step", metric=metric)
        rows = rows[rows["world_size"] <= LINA_GPUS] if not rows.empty else rows
    if rows.empty:
        return None
    setting = (f"{_where(rows)}, {len(rows)} points, {_span(rows['num_experts'])} experts, "
               f"{_span(rows['world_size'])} ranks, policy {'/'.join(sorted(rows['policy'].unique()))}")
    return 100 * float(rows["value"].mean()), setting


# ---- reproducers ------------------------------------------------------------------------------

def _fig3_slowdowns(samples: pd.DataFrame) -> tuple[pd.Series, str] | None:
    """Measured all_to_all slowdowns (collectives), else simulated backward all-to-all slowdowns at
    Lina's scale (16 GPUs); with the setting they come from."""
    s = contended_slowdowns(samples, ("all_to_all",))
    if not s.empty:
        return s["value"], _slowdown_setting(s)
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", world_size=LINA_GPUS)
    if s.empty:
        return None
    return s["value"], f"{_where(s)}, {LINA_GPUS} GPUs = experts, overlap vs sequential, {len(s)} backward all-to-alls"


@reproducer
def lina_fig3_slowdown_median(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].median()), found[1])


@reproducer
def lina_fig3_slowdown_worst(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].max()), found[1])


@reproducer
def lina_table1_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _train_step_mean_pct(records, "a2a_share")


@reproducer
def lina_fig2_a2a_share_of_moe(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _train_step_mean_pct(records, "a2a_share_of_moe")


# ---- Aurora (arXiv 2410.17043), simulated on its big-switch model (experiments/aurora.py) -------

def _fig4_units(records: pd.DataFrame, policy: str) -> tuple[float, str] | None:
    """Fig. 4's 3-GPU example in the paper's time units: our time over T*, times T* in units (each
    flow of FIG4_TOY_TOKENS is one unit), in barrier-separated rounds as the paper's slots are."""
    from moe_core.a2a_schedule import lower_bound
    from moe_core.workloads import FIG4_TOY_TOKENS

    rows = select(records, paper="aurora", experiment="aurora_order", workload="fig4-toy", policy=policy,
                  metric="rounds_over_lower_bound")
    if rows.empty:
        return None
    return float(rows["value"].iloc[0]) * lower_bound(FIG4_TOY_TOKENS), f"{_where(rows)}, Fig 4's matrix, {policy} order"


@reproducer
def aurora_fig4_naive(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig4_units(records, "naive")


@reproducer
def aurora_fig4_ordered(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig4_units(records, "aurora")


def _aurora_metric(records: pd.DataFrame, setting: str, policy: str, metric: str) -> pd.DataFrame:
    """Per-workload medians of ``metric`` of one policy in one deployment setting."""
    return select(records, paper="aurora", experiment="aurora_deployment", setting=setting, policy=policy,
                  metric=metric)


def _per_workload(records: pd.DataFrame, setting: str, policy: str, metric: str) -> pd.Series:
    """``_aurora_metric``'s values indexed by workload (empty when the tables have none)."""
    rows = _aurora_metric(records, setting, policy, metric)
    return pd.Series(dtype=float) if rows.empty else rows.set_index("workload")["value"]


def _aurora_speedup(records: pd.DataFrame, setting: str, baseline: str, reduce: str) -> tuple[float, str] | None:
    """min or max over workloads of Aurora's median speedup over ``baseline`` (inference time)."""
    rows = _aurora_metric(records, setting, baseline, "aurora_speedup")
    if rows.empty:
        return None
    value = float(rows["value"].agg(reduce))
    return value, (f"{_where(rows)}, {setting}, vs {baseline}, {reduce} over {len(rows)} workloads "
                   f"({', '.join(sorted(rows['workload']))})")


def _aurora_speedup_reproducer(figure: str, setting: str, baseline: str, reduce: str) -> None:
    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        return _aurora_speedup(records, setting, baseline, reduce)
    reproducer(reproduce, f"aurora_fig{figure}_{reduce}_vs_{baseline}")


# Fig 11: Aurora's speedup range per setting (published as "from min to max")
for _figure, _setting, _baseline, _reduces in [("11a", "exclusive-homogeneous", "sjf", ("max",)),
                                               ("11b", "exclusive-heterogeneous", "rga", ("min", "max")),
                                               ("11c", "colocated-homogeneous", "lina", ("min", "max")),
                                               ("11d", "colocated-heterogeneous", "lina", ("min", "max"))]:
    for _reduce in _reduces:
        _aurora_speedup_reproducer(_figure, _setting, _baseline, _reduce)


@reproducer
def aurora_fig11a_sjf_over_rcs(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Mean over workloads of SJF's inference time over RCS's (median over RCS's draws): "SJF ≈ RCS"."""
    sjf, rcs = (_per_workload(records, "exclusive-homogeneous", p, "inference_ms") for p in ("sjf", "rcs"))
    ratio = (sjf / rcs).dropna()
    if ratio.empty:
        return None
    return float(ratio.mean()), f"{_where(records)}, exclusive-homogeneous, mean over {len(ratio)} workloads"


@reproducer
def aurora_fig12_utilisation_gain_max(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Largest ratio of GPU utilisation, Aurora's colocation over Lina, over workloads of a colocated setting."""
    gains = []
    for setting in ("colocated-homogeneous", "colocated-heterogeneous"):
        aurora, lina = (_per_workload(records, setting, p, "gpu_utilisation") for p in ("aurora", "lina"))
        gains.append((aurora / lina).dropna())
    gain = pd.concat(gains)
    if gain.empty:
        return None
    return float(gain.max()), f"{_where(records)}, colocated, Aurora vs Lina, max over {len(gain)} workloads"


@reproducer
def aurora_fig13_gap_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    rows = select(records, paper="aurora", experiment="aurora_gap", metric="gap_to_optimum")
    if rows.empty:
        return None
    return float(rows["value"].mean()), (f"{_where(rows)}, colocated heterogeneous, {_span(rows['n_gpus'])} GPUs, "
                                         f"mean over {len(rows)} (model pair, layer) instances")


# ---- Lina's speedups (Figs 10-13) ------------------------------------------------------------

LINA_POLICIES_SHOWN = ["lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]


def lina_speedups(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Speedup of every Lina policy over ``overlap`` (DDP) in ``metric`` (baseline / policy) per expert
    count, experts = GPUs, from one testbed's training-step records (measured or simulated). Where a
    policy ran at several partition sizes (Fig 15's sweep), the default size is the one kept."""
    df = records[records["experiment"].isin(["train_step", "sim_train_step"]) & (records["metric"] == metric)]
    if df.empty or "partition_mb" not in df:
        return df.iloc[0:0]
    df = df[df["world_size"] == df["num_experts"]]
    df = (df.assign(non_default=df["partition_mb"] != CommConfig.partition_mb)
          .sort_values("non_default").drop_duplicates(["policy", "num_experts"]))
    base = df[df["policy"] == "overlap"].set_index("num_experts")["value"]
    df = df[df["policy"].isin(LINA_POLICIES_SHOWN) & df["num_experts"].isin(base.index)]
    return df.assign(experts=df["num_experts"].astype(int),
                     speedup=base.loc[df["num_experts"]].to_numpy() / df["value"].to_numpy())


def _lina_speedup_reproducer(name: str, metric: str, experts: int) -> Reproducer:
    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        s = lina_speedups(records, metric)
        s = s if s.empty else s[(s["policy"] == "lina") & (s["experts"] == experts)]
        if s.empty:
            return None
        return float(s["speedup"].iloc[0]), (f"{_where(s)}, {experts} experts = GPUs, {metric} of overlap / "
                                             f"lina, micro-ops {s['partition_mb'].iloc[0]:g} MB")
    return reproducer(reproduce, name)


for _experts in (2, 4, 8, 16):
    _lina_speedup_reproducer(f"lina_fig10_step_speedup_{_experts}e", "step_ms", _experts)
for _experts in (4, 8, 16):
    _lina_speedup_reproducer(f"lina_fig13_bwd_a2a_speedup_{_experts}e", "a2a_bwd_ms", _experts)
for _experts in (2, 8):  # Figs 11-12: the MoE layers' wall time per pass
    _lina_speedup_reproducer(f"lina_fig11_moe_fwd_speedup_{_experts}e", "moe_layer_fwd_ms", _experts)
    _lina_speedup_reproducer(f"lina_fig12_moe_bwd_speedup_{_experts}e", "moe_layer_bwd_ms", _experts)

FIG10_EXPERTS = (2, 4, 8, 16)


@reproducer
def lina_fig10_step_speedup_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """The intro's average step-time speedup: the mean of Fig 10's four expert counts (all needed)."""
    s = lina_speedups(records, "step_ms")
    s = s if s.empty else s[(s["policy"] == "lina") & s["experts"].isin(FIG10_EXPERTS)]
    if s.empty or set(s["experts"]) != set(FIG10_EXPERTS):
        return None
    return float(s["speedup"].mean()), (f"{_where(s)}, mean over {'/'.join(map(str, FIG10_EXPERTS))} experts = GPUs, "
                                        f"step_ms of overlap / lina, micro-ops {s['partition_mb'].iloc[0]:g} MB")


@reproducer
def lina_fig12_moe_utilisation_gain_16e(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    """Relative gain (%) of the compute stream's busy share of the MoE layers' wall time, lina over
    overlap, 16 experts (the text's GPU utilisation in the MoE layer, "up by >= 16%")."""
    s = lina_speedups(records, "moe_compute_share")  # speedup = overlap's share / lina's
    s = s if s.empty else s[(s["policy"] == "lina") & (s["experts"] == LINA_GPUS)]
    if s.empty:
        return None
    return 100 * (1 / float(s["speedup"].iloc[0]) - 1), (
        f"{_where(s)}, {LINA_GPUS} experts = GPUs, (gate + expert time) / MoE layers' wall time (forward + "
        f"backward) of lina over overlap, minus 1, micro-ops {s['partition_mb'].iloc[0]:g} MB")


# ---- Lina's inference (Figs 6, 9, 16-18, §5.2) -------------------------------------------------

LINA_PATH_LENGTH = 3  # Lina's default l; Figs 16-18 are measured with it (Table 5 varies it)
POINT_KEYS = ["world_size", "num_experts", "path_length", "seed", "a2a_policy"]  # one inference run; policy varies within


def _of_experts(rows: pd.DataFrame, experts: int | None) -> pd.DataFrame:
    """The rows of ``experts`` experts (all of them when None)."""
    return rows if experts is None or rows.empty else rows[rows["num_experts"] == experts]


def _inference(records: pd.DataFrame, policy: str, metric: str, experts: int | None = None) -> pd.DataFrame:
    """lina/inference rows of ``metric`` for ``policy`` at path length 3 (and ``experts`` if given)."""
    rows = select(records, paper="lina", experiment="inference", policy=policy, metric=metric,
                  path_length=LINA_PATH_LENGTH)
    return _of_experts(rows, experts)


def _our_inference(rows: pd.DataFrame, path_length: bool = True) -> str:
    """Our inference setting in words: model, experts, ranks (and Lina's path length, which the
    rows were selected on)."""
    known = [c for c in ("moe_layers", "data_zipf") if c in rows and rows[c].notna().all()]
    model = ", ".join([f"{_span(rows['moe_layers'])} MoE layers"] * ("moe_layers" in known) + ["top-1 gate"] +
                      [f"trained on Zipf {_span(rows['data_zipf'])} tokens"] * ("data_zipf" in known))
    return (f"{_where(rows)}, our MoE transformer ({model}) with {_span(rows['num_experts'])} experts on "
            f"{_span(rows['world_size'])} ranks" + (f", path length {LINA_PATH_LENGTH}" if path_length else ""))


def _inference_ratio(records: pd.DataFrame, num: str, den: str, metric: str, stat: str,
                     experts: int | None) -> tuple[float, pd.DataFrame] | None:
    """Mean over inference runs of ``stat`` of ``metric``, policy ``num`` over policy ``den``."""
    a, b = _inference(records, num, metric, experts), _inference(records, den, metric, experts)
    if a.empty or b.empty:
        return None
    keys = [k for k in POINT_KEYS if k in a]
    both = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if both.empty:
        return None
    return float((both[f"{stat}_a"] / both[f"{stat}_b"]).mean()), b


def _lina_inference_reproducer(name: str, num: str, den: str, metric: str, stat: str, experts: int | None,
                               as_percent_worse: bool = False) -> Reproducer:
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
    _lina_inference_reproducer(f"lina_fig16_median_reduction_{_experts}e", "static", "lina", "forward_ms",
                               "median", _experts)
_lina_inference_reproducer("lina_fig16_p95_reduction_16e", "static", "lina", "forward_ms", "p95", 16)
# Fig 16's ablations, "worse by %" than lina, 16 experts
_lina_inference_reproducer("lina_fig16_no_estimation_median_worse_16e", "lina-no-estimation", "lina", "forward_ms",
                           "median", 16, as_percent_worse=True)
_lina_inference_reproducer("lina_fig16_no_finetune_p95_worse_16e", "lina-no-finetune", "lina", "forward_ms",
                           "p95", 16, as_percent_worse=True)
# Fig 17: the MoE layers' tail, static over lina
for _experts in (8, 16):
    _lina_inference_reproducer(f"lina_fig17_moe_p95_reduction_{_experts}e", "static", "lina", "moe_layer_ms",
                               "p95", _experts)


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
    keys = [k for k in POINT_KEYS if k in static] + ["layer"]
    both = static.merge(lina, on=keys, suffixes=("_static", "_lina"))
    return both.assign(reduction=both["p95_static"] / both["p95_lina"])


def _fig18(records: pd.DataFrame, reduce: str) -> tuple[float, str] | None:
    r = tail_a2a_reduction(records, 16)
    if r.empty:
        return None
    rows = _inference(records, "lina", "moe_layer_ms", 16)
    return float(r["reduction"].agg(reduce)), (f"{_our_inference(rows)}, p95 all-to-all time per MoE layer, static / "
                                               f"lina, {reduce} over {len(r)} (run, layer) pairs")


@reproducer
def lina_fig18_tail_a2a_reduction_mean(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18(records, "mean")


@reproducer
def lina_fig18_tail_a2a_reduction_max(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _fig18(records, "max")


def _profile_statistic(records: pd.DataFrame, metric: str, experts: int | None, scale: float,
                       what: str) -> tuple[float, str] | None:
    """A statistic of the profiled gate choices (the same in every policy's record; static's is read)."""
    rows = select(records, paper="lina", experiment="inference", policy="static", metric=metric)
    rows = _of_experts(rows, experts)
    if rows.empty:
        return None
    return scale * float(rows["value"].mean()), f"{_our_inference(rows, path_length=False)}; {what}"


def _profile_reproducer(name: str, metric: str, experts: int | None, scale: float, what: str) -> Reproducer:
    def reproduce(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
        return _profile_statistic(records, metric, experts, scale, what)
    return reproducer(reproduce, name)


for _experts in (4, 16):  # Fig 6
    _profile_reproducer(f"lina_fig6_popularity_ratio_{_experts}e", "popularity_ratio", _experts, 1.0,
                        "profiled tokens of the most / least popular expert, mean over MoE layers")
for _k in (1, 2):  # Fig 9
    _profile_reproducer(f"lina_fig9_next_layer_top{_k}_share", f"path_topk_share_k{_k}", None, 100.0,
                        f"share of profiled tokens whose next-layer expert is among the top-{_k} of the tokens "
                        "that picked the same expert, over layers")


def _lina_policy_value(records: pd.DataFrame, metric: str, scale: float, what: str) -> tuple[float, str] | None:
    rows = select(records, paper="lina", experiment="inference", policy="lina", metric=metric)
    if rows.empty:
        return None
    return scale * float(rows["value"].mean()), f"{_where(rows)}, {_span(rows['num_experts'])} experts, policy lina, {what}"


@reproducer
def lina_inference_replan_rate(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(records, "replan_rate", 100.0, "share of (batch, layer) decisions that re-planned")


@reproducer
def lina_s52_schedule_decision_ms(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(records, "schedule_decision_ms", 1.0,
                              "median host time of one layer's placement decision (numpy, rank 0)")


@reproducer
def lina_s52_phase2_check_ms(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _lina_policy_value(records, "phase2_check_ms", 1.0,
                              "median host time of the phase-2 top-2k check where no re-plan was needed")


# ---- the comparison table ---------------------------------------------------------------------

def verdict(ratio: float, tolerance: float) -> str:
    return CONSISTENT if abs(ratio - 1) <= tolerance else DIFFERS


def compare(registry: dict[str, dict[str, Any]], records: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per entry and testbed that reproduces it; one not-reproduced row for an entry none does."""
    rows = []
    for entry in registry.values():
        published = {"published": entry["value"], **{k: entry[k] for k in COLUMNS if k in entry}}
        fn = _reproducer_of(entry)
        found = [] if fn is None else list(_reproductions(fn, records, samples))
        if not found:
            rows.append({**published, "verdict": NOT_REPRODUCED})
        for tb, value, setting in found:
            ratio = value / entry["value"]
            rows.append({**published, **tb, "reproduced": value, "reproduced_setting": setting,
                         "ratio": ratio, "verdict": verdict(ratio, entry["tolerance"])})
    return pd.DataFrame(rows, columns=COLUMNS)


def _reproducer_of(entry: dict[str, Any]) -> Reproducer | None:
    name = entry["reproducer"]
    if name is not None and name not in REPRODUCERS:
        raise ValueError(f"registry entry {entry['id']!r} names reproducer {name!r}, which "
                         f"analysis/compare.py does not define; add it with @reproducer or set it to null")
    return None if name is None else REPRODUCERS[name]


def _reproductions(fn: Reproducer, records: pd.DataFrame, samples: pd.DataFrame):
    """(testbed, value, setting) for every testbed whose records hold the data ``fn`` needs."""
    for testbed in records[TESTBED].drop_duplicates().to_dict("records"):
        result = fn(select(records, **testbed), select(samples, **testbed))
        if result is not None:
            yield testbed, *result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--out", type=Path, required=True, help="comparison CSV to write")
    parser.add_argument("--registry", type=Path, default=REGISTRY_PATH, help="published numbers (YAML)")
    args = parser.parse_args(argv)
    try:
        table = compare(load_registry(args.registry), *read_tables(args.records, args.samples))
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.compare: error: {err}")
    write_csv(table, args.out)
    print(table[["id", "mode", "published", "reproduced", "unit", "verdict"]].to_string(index=False))


if __name__ == "__main__":
    main()
