"""Single statistics of Lina's inference runs: the profiled gate's skew and path following (Figs 6, 9),
the least loaded device's idle share under static placement (Fig 6) and the cost of Lina's placement
decisions (§5.2)."""

from __future__ import annotations

import pandas as pd

from analysis.collect import select
from analysis.papers.lina.inference import inference_setting, of_experts
from analysis.papers.lina.testbed import LINA_XL_EXPERTS
from analysis.registry import Reproducer, describe_testbeds, reproducer
from analysis.units import span


def _profile_statistic(
    records: pd.DataFrame, metric: str, experts: int | None, scale: float, what: str
) -> tuple[float, str] | None:
    """A statistic of the profiled gate choices (the same in every policy's record; static's is read)."""
    rows = select(records, paper="lina", experiment="inference", policy="static", metric=metric)
    rows = of_experts(rows, experts)
    if rows.empty:
        return None
    return scale * float(rows["value"].mean()), f"{inference_setting(rows, path_length=False)}; {what}"


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
        f"{inference_setting(s, path_length=False)}, static placement, max over {len(s)} batches of the busiest "
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
