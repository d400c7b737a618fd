"""The report's answer up front: the verdicts figure's data, on small synthetic comparison tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.compare import COMPARISON_COLUMNS
from analysis.figures import render
from analysis.papers.common import verdict_points
from analysis.registry import FigureDataError


def comparison_table() -> pd.DataFrame:
    """Six rows of a comparison table: one per kind of verdict, a published bound each way, a zero."""
    rows = [
        # id, verdict, explainable, published, reproduced, low, high, tolerance, bound, hardware
        ("lina-fig3-median", "differs", True, 1.83, 1.2, 1.1, 2.0, 0.25, "lower", "lina-a100-4x4"),
        ("lina-fig15-overhead", "differs", False, 1.7, 0.0, 0.0, 0.5, 0.25, None, "lina-a100-4x4"),
        ("aurora-fig12-gain", "consistent", True, 1.5, 1.6, 1.4, 1.7, 0.5, "upper", "aurora-bigswitch-100g"),
        ("aurora-fig12-gain", "differs", False, 1.5, 0.8, 0.7, 0.9, 0.25, None, "aurora-bigswitch-hetero"),
        ("lina-fig6-ratio", "not-comparable", None, 4.02, 11.6, 11.6, 11.6, 0.25, None, "local-cpu"),
        ("lina-fig2-sm-share", "not-reproduced", None, 3.7, np.nan, np.nan, np.nan, 0.25, None, None),
    ]
    names = ["id", "verdict", "explainable", "published", "reproduced", "reproduced_low", "reproduced_high"]
    df = pd.DataFrame(rows, columns=[*names, "tolerance", "bound", "hardware"])
    df["paper"] = df["id"].str.split("-").str[0]
    df["reason"] = ["ours <1.2> is 0.66x & below", *["a reason"] * 5]
    return df.reindex(columns=COMPARISON_COLUMNS)


# ---- the verdicts figure -----------------------------------------------------------------------------------


def test_verdict_points_are_the_judged_rows_as_log_ratios_with_their_band():
    df = verdict_points(comparison_table())
    assert df["id"].tolist() == ["lina-fig3-median", "lina-fig15-overhead", "aurora-fig12-gain", "aurora-fig12-gain"]
    assert df["kind"].tolist() == ["explainable", "differs", "consistent", "differs"]
    assert df.loc[0, "log_ratio"] == pytest.approx(math.log2(1.2 / 1.83))
    assert df.loc[0, ["log_low", "log_high"]].tolist() == pytest.approx([math.log2(1.1 / 1.83), math.log2(2.0 / 1.83)])
    assert df.loc[1, "log_ratio"] == -math.inf and df.loc[1, "log_low"] == -math.inf  # zero: at the axis' edge
    # consistent between 1 - tolerance and 1 + tolerance, open beyond a published bound
    assert df.loc[0, ["band_low", "band_high"]].tolist() == [pytest.approx(math.log2(0.75)), math.inf]
    assert df.loc[1, ["band_low", "band_high"]].tolist() == pytest.approx([math.log2(0.75), math.log2(1.25)])
    assert df.loc[2, ["band_low", "band_high"]].tolist() == [-math.inf, pytest.approx(math.log2(1.5))]
    assert df["label"].tolist() == [
        "fig3-median",
        "fig15-overhead",
        "fig12-gain (aurora-bigswitch-100g)",  # one id on two testbeds: told apart
        "fig12-gain (aurora-bigswitch-hetero)",
    ]


def test_verdict_points_name_the_missing_columns():
    with pytest.raises(FigureDataError, match=r"lacks columns \['bound'\].*analysis.compare"):
        verdict_points(comparison_table().drop(columns=["bound"]))


def test_the_verdicts_figure_renders_from_the_comparison_alone(tmp_path):
    empty = pd.DataFrame()
    outputs = render("verdicts", empty, empty, tmp_path / "verdicts.png", comparison_table())
    assert [p.name for p in outputs] == ["verdicts.png", "verdicts.pdf"]
    assert all(p.stat().st_size > 1000 for p in outputs)
    with pytest.raises(ValueError, match="needs the comparison table"):
        render("verdicts", empty, empty, tmp_path / "a.png")
    unjudged = comparison_table().assign(verdict="not-comparable")
    with pytest.raises(FigureDataError, match="no row with a verdict"):
        render("verdicts", empty, empty, tmp_path / "b.png", unjudged)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts.pdf", "verdicts.png"]
