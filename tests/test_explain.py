"""The unstated parameters' joint design (moe_core.schema.points) and what the analysis reads off it
(analysis.explain): needs, the reason of a differs row, every row's first sentence, the verdict summary."""

import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis import explain
from moe_core.config.load import ConfigError, derive_config, load_config
from moe_core.schema.points import (
    UNSTATED_PARAMS,
    Unstated,
    parse_setting,
    register_unstated,
    sensitivity_settings,
    setting_text,
    unstated_variants,
)

LINK = Unstated("hardware.intra_node_GBps", chosen=70.0, low=50.0, high=82.0)  # chosen inside its range
LAUNCH = Unstated("hardware.kernel_launch_us", chosen=38.0, low=10.0, high=38.0)  # chosen at an end
CHOSEN_RUN = OmegaConf.create({"unstated": ""})  # a run at the chosen values: it has a sensitivity design


def test_design_is_one_at_a_time_ends_then_the_corners_that_move_two_or_more():
    settings = sensitivity_settings([LINK, LAUNCH])
    assert settings == [
        {"hardware.intra_node_GBps": 50.0},
        {"hardware.intra_node_GBps": 82.0},
        {"hardware.kernel_launch_us": 10.0},
        # corners: (50, 10) and (82, 10) move both; (50, 38) and (82, 38) are one-at-a-time runs above
        {"hardware.intra_node_GBps": 50.0, "hardware.kernel_launch_us": 10.0},
        {"hardware.intra_node_GBps": 82.0, "hardware.kernel_launch_us": 10.0},
    ]
    assert sensitivity_settings([LAUNCH]) == [{"hardware.kernel_launch_us": 10.0}]


def test_variants_set_every_parameter_and_record_the_setting():
    variants = unstated_variants(CHOSEN_RUN, "p", ["model.d_model=8"], [LINK, LAUNCH])
    assert variants["p_intra_node_GBps50_kernel_launch_us10"] == [
        "model.d_model=8",
        "hardware.intra_node_GBps=50",
        "hardware.kernel_launch_us=10",
        "unstated=hardware.intra_node_GBps=50,hardware.kernel_launch_us=10",
    ]
    text = setting_text({"a.b": 1.5, "c": 2.0})
    assert text == "a.b=1.5,c=2" and parse_setting(text) == {"a.b": 1.5, "c": 2.0}


def test_a_joint_setting_loads_and_a_malformed_one_is_refused():
    cfg = load_config(["configs/ci.yaml"], ["unstated=hardware.intra_node_GBps=50,train.batch_size=4"])
    assert cfg.unstated == "hardware.intra_node_GBps=50,train.batch_size=4"
    with pytest.raises(ConfigError, match="unstated"):
        load_config(["configs/ci.yaml"], ["unstated=a=1,,b=2"])


def test_a_run_at_a_setting_keeps_it_in_derived_points_and_has_no_design_of_its_own():
    """The run at a fitted testbed: a point that loads another profile keeps the fitted rate, and the
    run is simulated at its setting alone (no sensitivity runs around it)."""
    cfg = load_config(
        ["configs/ci.yaml"], ["hardware.kernel_launch_us=12.5", "unstated=hardware.kernel_launch_us=12.5"]
    )
    assert unstated_variants(cfg, "p", [], [LAUNCH]) == {}
    point = derive_config(cfg, ["hardware_profile=lina-a100-4x4"])
    assert point.hardware.name == "lina-a100-4x4" and point.hardware.kernel_launch_us == 12.5
    assert (
        derive_config(load_config(["configs/ci.yaml"]), ["hardware_profile=lina-a100-4x4"]).hardware.kernel_launch_us
        != 12.5
    )


def test_bad_ranges_and_conflicting_declarations_are_refused():
    with pytest.raises(ValueError, match="low <= chosen <= high"):
        Unstated("x", chosen=5.0, low=1.0, high=4.0)
    register_unstated("test-paper", Unstated("x", chosen=1.0, low=1.0, high=2.0))
    with pytest.raises(ValueError, match="declared twice"):
        register_unstated("test-paper", Unstated("x", chosen=1.5, low=1.0, high=2.0))
    del UNSTATED_PARAMS["test-paper"]


def test_every_declared_chosen_value_is_the_one_the_paper_runs_at():
    """The registry's chosen values are the profiles' and config's, so the verdicts' setting is the
    one declared; each says why (its evidence, which the fit table shows)."""
    profiles = {
        "lina": "lina-a100-4x4",
        "gshard": "gshard-tpuv3-torus",
        "aurora": "aurora-bigswitch-100g",
        "monta": "monta-a800-2x8",
        "axonn": "axonn-perlmutter",
    }
    base = load_config(["configs/default.yaml"])
    for paper, params in UNSTATED_PARAMS.items():
        model = list(base.lina.overrides) if paper == "lina" else []  # Lina's batch is its model's
        run = derive_config(base, [f"hardware_profile={profiles[paper]}", *model])
        for key, param in params.items():
            assert OmegaConf.select(run, key) == pytest.approx(param.chosen), (paper, key)
            assert len(param.evidence) > 40, f"{paper} {key}: say in evidence= why the value and the range"


@pytest.mark.parametrize(
    ("points", "target", "expected"),
    [
        ([(1.0, 10.0), (3.0, 30.0)], 20.0, 2.0),  # inside a segment
        ([(1.0, 10.0), (3.0, 30.0)], 50.0, 5.0),  # past the high end, along the end segment
        ([(1.0, 10.0), (2.0, 20.0), (4.0, 20.0)], 5.0, 0.5),  # below the low end
        ([(1.0, 10.0), (3.0, 10.0)], 20.0, None),  # flat: nothing reaches it
    ],
)
def test_the_curve_is_solved_piecewise_linearly(points, target, expected):
    got = explain.solve_curve(points, target)
    assert got == (None if expected is None else pytest.approx(expected))


def test_needs_names_the_most_influential_parameter_and_whether_its_value_is_plausible():
    UNSTATED_PARAMS["test-paper"] = {p.key: p for p in (LINK, LAUNCH)}
    try:
        variants = {
            "hardware.intra_node_GBps=50": 1.0,  # moves 1.1 -> 1.0
            "hardware.intra_node_GBps=82": 1.2,
            "hardware.kernel_launch_us=10": 1.6,  # moves 1.1 -> 1.6: the most influential
            "hardware.intra_node_GBps=50,hardware.kernel_launch_us=10": 1.5,  # corners are not read
        }
        text = explain.needs("test-paper", 1.1, 1.35, variants)
        assert text.startswith("hardware.kernel_launch_us=24 gives 1.35 (inside")
        outside = explain.needs("test-paper", 1.1, 2.1, variants)
        assert "kernel_launch_us=-" in outside or "no positive value" in outside
        assert explain.swept_keys(variants) == ["hardware.intra_node_GBps", "hardware.kernel_launch_us"]
    finally:
        del UNSTATED_PARAMS["test-paper"]


def test_reason_and_step_terms_come_from_the_points_records():
    records = pd.DataFrame(
        [
            {"point": "a", "metric": m, "value": v}
            for m, v in {
                "step_ms": 100.0,
                "dense_ms": 40.0,
                "gate_ms": 10.0,
                "expert_ms": 20.0,
                "a2a_ms": 25.0,
                "allreduce_exposed_ms": 5.0,
            }.items()
        ]
    )
    shares = explain.term_shares(records, {"a"})
    assert shares == pytest.approx(
        {"dense_ms": 0.4, "gate_ms": 0.1, "expert_ms": 0.2, "a2a_ms": 0.25, "allreduce_exposed_ms": 0.05}
    )
    assert explain.term_shares(records, {"other"}) == {}
    text = explain.reason(1.0, 2.0, ["hardware.x"], "hardware.x=9 gives 2 (outside ...)", shares)
    assert text.startswith("at the chosen values ours is 1, 0.50x the published 2; swept: hardware.x")
    assert "dense compute 40%, exposed all-to-all 25%" in text


def _step_records(points: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Long-format records of step points: the five terms, their sums and the all-to-all share."""
    rows = []
    for point, terms in points.items():
        metrics = {
            **terms,
            "step_ms": sum(terms.values()),
            "moe_layer_ms": terms["gate_ms"] + terms["expert_ms"] + terms["a2a_ms"],
            "a2a_fwd_ms": terms["a2a_ms"] / 4,
            "a2a_bwd_ms": 3 * terms["a2a_ms"] / 4,
            "a2a_share": terms["a2a_ms"] / sum(terms.values()),
            "steps_per_s": 1e3 / sum(terms.values()),
            "unrelated_GBps": 7.0,
        }
        rows += [{"point": point, "metric": m, "value": v} for m, v in metrics.items()]
    return pd.DataFrame(rows)


TERMS = {"dense_ms": 40.0, "gate_ms": 10.0, "expert_ms": 20.0, "a2a_ms": 25.0, "allreduce_exposed_ms": 5.0}


def _metric(records: pd.DataFrame, point: str, metric: str) -> float:
    return float(records[(records["point"] == point) & (records["metric"] == metric)]["value"].iloc[0])


def test_scaling_a_term_moves_its_parts_sums_and_shares_and_nothing_else():
    records = _step_records({"a": TERMS, "b": TERMS})
    scaled = explain.scale_term(records, {"a"}, "a2a_ms", 3.0)
    assert _metric(scaled, "a", "a2a_ms") == 75.0
    assert _metric(scaled, "a", "step_ms") == 150.0
    assert _metric(scaled, "a", "moe_layer_ms") == 105.0
    assert _metric(scaled, "a", "a2a_bwd_ms") == pytest.approx(56.25)
    assert _metric(scaled, "a", "a2a_share") == pytest.approx(0.5)
    assert _metric(scaled, "a", "steps_per_s") == pytest.approx(1e3 / 150)
    assert _metric(scaled, "a", "dense_ms") == 40.0 and _metric(scaled, "a", "unrelated_GBps") == 7.0
    assert scaled[scaled["point"] == "b"].equals(records[records["point"] == "b"])  # another point: untouched
    assert list(scaled.columns) == list(records.columns) and len(scaled) == len(records)
    # the sums stay sums of the terms after scaling another term
    dense = explain.scale_term(records, {"a", "b"}, "dense_ms", 0.5)
    assert _metric(dense, "b", "step_ms") == 80.0 and _metric(dense, "b", "moe_layer_ms") == 55.0


def test_implied_factors_solve_a_share_and_a_speedup_exactly():
    records = _step_records({"base": TERMS, "fast": {**TERMS, "a2a_ms": 5.0}})

    def share(recs: pd.DataFrame) -> float:  # a reproducer of the all-to-all's share of the base step
        return _metric(recs, "base", "a2a_share")

    # 25 / (75 + 25 f) = 0.4 -> f = 2: the all-to-all alone would have to double
    factors = explain.term_factors(share, records, {"base"}, 0.4, share(records))
    assert factors["a2a_ms"] == pytest.approx(2.0, rel=1e-4)
    # the dense compute: 25 / (60 + 40 f) = 0.4 -> f = 0.0625
    assert factors["dense_ms"] == pytest.approx(0.0625, rel=1e-4)

    def speedup(recs: pd.DataFrame) -> float:  # base step over fast step
        return _metric(recs, "base", "step_ms") / _metric(recs, "fast", "step_ms")

    value = speedup(records)  # 100 / 80 = 1.25
    factors = explain.term_factors(speedup, records, {"base", "fast"}, 1.5, value)
    # (75 + 25 f) / (75 + 5 f) = 1.5 -> f = 2.1428...
    assert factors["a2a_ms"] == pytest.approx(37.5 / 17.5, rel=1e-4)
    # a term both steps hold alike can only pull the speedup toward 1: no factor gives 1.5
    assert factors["dense_ms"] is None
    text = explain.factors_text(factors)
    assert text.startswith("exposed all-to-all x2.1") and "dense compute" in text and "no factor in" in text


def test_a_number_that_does_not_read_the_terms_gets_no_factor():
    records = _step_records({"a": TERMS})

    def bandwidth(recs: pd.DataFrame) -> float:
        return _metric(recs, "a", "unrelated_GBps")

    assert explain.term_factors(bandwidth, records, {"a"}, 9.0, 7.0) == {}
    text = explain.reason(7.0, 9.0, [], None, explain.term_shares(records, {"a"}), {})
    assert text.endswith("the number does not move with the step terms")
    no_terms = explain.reason(7.0, 9.0, [], None, {}, {})
    assert no_terms.endswith("not built from a training step's terms")


def test_verdict_summary_counts_the_comparisons_verdicts_and_weak_ones():
    table = pd.DataFrame(
        {
            "paper": ["p", "p", "p", "p", "q"],
            "verdict": ["consistent", "differs", "differs", "baseline-not-reproduced", "not-comparable"],
            "weak": [True, False, True, None, None],
        }
    )
    summary = explain.verdict_summary(table).set_index("paper")
    kinds = ["consistent", "differs", "baseline-not-reproduced", "total", "weak"]
    assert summary.loc["p", kinds].tolist() == [1, 2, 1, 4, 2]
    assert summary.loc["q", "not-comparable"] == 1 and summary.loc["q", "weak"] == 0
    assert summary.loc["all", "total"] == 5
    # one count everywhere: the summary's verdicts are the comparison's, row for row
    assert summary.loc["all", list(explain.VERDICTS)].sum() == len(table)


def _row(kind, role="claim", **columns):
    entry = {"value": 2.0, "unit": "x", "role": role}
    cols = {"reproduced": 1.9, "reproduced_low": 1.8, "reproduced_high": 2.0, "range_width": 1.1, "weak": False}
    return explain.first_sentence(kind, entry, {**cols, **columns}, reason="another model")


def test_every_row_opens_with_a_plain_first_sentence():
    assert _row("consistent").startswith("holds: at the chosen values (the paper gives no baseline")
    assert _row("consistent", role="baseline").startswith("reproduced: ")
    assert _row("differs").startswith("does not hold: ") and _row("differs", role="baseline").startswith(
        "baseline missed"
    )
    assert "(weak: x3 wide)" in _row("differs", weak=True, range_width=3.0)
    assert "fitted without this row, the testbed predicts 1.7" in _row("consistent", role="baseline", loo=1.7)
    assert _row("not-comparable") == "not comparable: another model"
    assert _row("not-reproduced").startswith("not reproduced: ")


def test_a_value_that_stands_for_another_link_class_sets_it_too():
    """Lina's NVLink3-rate end is an NVSwitch-class node, not the PCIe tree of the chosen value."""
    link = Unstated("hardware.intra_node_GBps", 25.0, 25.0, 240.0, implies={240.0: ("hardware.intra_node=switch",)})
    (overrides,) = unstated_variants(CHOSEN_RUN, "p", [], [link]).values()
    assert overrides == [
        "hardware.intra_node_GBps=240",
        "hardware.intra_node=switch",
        "unstated=hardware.intra_node_GBps=240",
    ]
