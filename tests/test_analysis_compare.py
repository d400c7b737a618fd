"""analysis.published and analysis.compare: the published-numbers registry and the verdicts beside our
numbers, on synthetic records."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import yaml
from analysis_records import SHARE, write_point, write_train_step

from analysis.collect import collect
from analysis.compare import (
    BASELINE_NOT_REPRODUCED,
    CONSISTENT,
    DIFFERS,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    compare,
    fitted_settings,
    write_setting_layer,
)
from analysis.fit import SIMULATED_AT_FIT
from analysis.published import RegistryError, load_registry
from analysis.registry import REPRODUCERS, reproducer
from moe_core.config.load import load_config
from moe_core.schema.points import UNSTATED_PARAMS, setting_text
from moe_core.units import MiB


def test_shipped_registry_is_valid():
    registry = load_registry()
    assert registry["lina-fig3-a2a-slowdown-median"]["value"] == 1.83
    assert registry["lina-table1-a2a-share-of-step-secondary"]["status"] == "DER"
    named = {e["reproducer"] for e in registry.values()} - {None}
    assert named <= set(REPRODUCERS)


def _registry_file(tmp_path, entries, testbeds=("local-cpu", "a100-ib")):
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump({"testbeds": {"lina": list(testbeds)}, "numbers": entries}))
    return path


def _entry(entry_id, value, reproducer):
    return {
        "id": entry_id,
        "paper": "lina",
        "figure": "Fig 3",
        "metric": "m",
        "setting": "s",
        "value": value,
        "unit": "x",
        "source": "url",
        "status": "FT",
        "role": "claim",
        "role_evidence": "a gain of the mechanism",
        "reproducer": reproducer,
    }


def test_registry_validation(tmp_path):
    with pytest.raises(RegistryError, match="duplicate id 'a'"):
        load_registry(_registry_file(tmp_path, [_entry("a", 1.0, None), _entry("a", 2.0, None)]))
    no_status = _entry("b", 1.0, None)
    del no_status["status"]
    with pytest.raises(RegistryError, match=r"'b'.*missing key 'status'"):
        load_registry(_registry_file(tmp_path, [no_status]))
    with pytest.raises(RegistryError, match="'status'"):
        load_registry(_registry_file(tmp_path, [{**_entry("c", 1.0, None), "status": "maybe"}]))


def test_registry_requires_a_role_with_evidence(tmp_path):
    untagged = _entry("d", 1.0, None)
    del untagged["role"]
    with pytest.raises(RegistryError, match=r"'d'.*missing key 'role'"):
        load_registry(_registry_file(tmp_path, [untagged]))
    with pytest.raises(RegistryError, match="'role' is 'gain'; use one of"):
        load_registry(_registry_file(tmp_path, [{**_entry("e", 1.0, None), "role": "gain"}]))
    with pytest.raises(RegistryError, match="'role_evidence' must say why"):
        load_registry(_registry_file(tmp_path, [{**_entry("f", 1.0, None), "role_evidence": ""}]))


def test_shipped_registry_tags_the_papers_baselines():
    """The issue's tagging: Lina's Table 1, Figs 2, 3 and 6 and GShard's Table 3 throughput are
    baselines; Lina's and Aurora's speedups are claims; all 24 rows of Table 1 are there."""
    registry = load_registry()
    roles = {key: entry["role"] for key, entry in registry.items()}
    assert {roles[k] for k in registry if k.startswith(("lina-table1", "lina-fig2", "lina-fig3", "lina-fig6"))} == {
        "baseline"
    }
    assert {roles[k] for k in registry if "steps-per-s" in k} == {"baseline"}
    assert {roles[k] for k in registry if k.startswith(("lina-fig10", "aurora-fig11c"))} == {"claim"}
    assert len([k for k in registry if k.startswith("lina-table1-") and k.endswith(("e-12l", "e-24l", "e-36l"))]) == 24


def test_compare_verdicts(tmp_path, tables):
    registry = load_registry(
        _registry_file(
            tmp_path,
            [
                _entry("near", 1.83, "lina_fig3_slowdown_median"),  # 1.9 / 1.83 = 1.04
                _entry("far", 4.14, "lina_fig3_slowdown_worst"),  # 2.5 / 4.14 = 0.60
                _entry("share", 34.1, "lina_table1_training_a2a_share"),
                _entry("none", 1.71, None),
            ],
        )
    )
    table = compare(registry, *tables).set_index("id")
    assert table.loc["near", "verdict"] == CONSISTENT and table.loc["near", "reproduced"] == 1.9
    assert table.loc["near", "reproduced_setting"] == "local-cpu gloo, 4 ranks, 1 MiB–64 MiB, 15 samples"
    assert table.loc["far", "verdict"] == DIFFERS and table.loc["far", "ratio"] == pytest.approx(2.5 / 4.14)
    assert table.loc["share", "verdict"] == CONSISTENT
    assert table.loc["share", "reproduced"] == pytest.approx(34.1) and table.loc["share", "mode"] == "measured"
    assert table.loc["none", "verdict"] == NOT_REPRODUCED
    assert table.loc[["none"], ["reproduced", "ratio", "mode"]].isna().all(axis=None)


@functools.partial(reproducer, name="test_mean_a2a_share")
def _mean_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str]:
    """Every point's a2a_share, pooled: what compare() lets a reproducer see."""
    rows = records[records["metric"] == "a2a_share"]
    return 100 * float(rows["value"].mean()), f"{len(rows)} points"


def test_registry_rejects_bad_like_for_like_keys(tmp_path):
    with pytest.raises(RegistryError, match="'bound' is 'above'"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "bound": "above"}]))
    with pytest.raises(RegistryError, match="'not_comparable' must say why"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "not_comparable": ""}]))
    with pytest.raises(RegistryError, match=r"'a'.*no testbed.*testbeds: \{aurora"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "paper": "aurora"}]))
    own = load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "testbed": ["x"]}]))
    assert own["a"]["testbed"] == ["x"]  # the entry's own testbed over its paper's


def test_compare_judges_only_like_for_like(tmp_path, tables):
    """A reproduction off the paper's testbed, or of an entry no run matches, keeps its value but gets
    no verdict; a published bound is met by anything beyond it."""
    entries = [
        _entry("elsewhere", 1.83, "lina_fig3_slowdown_median"),
        {**_entry("unlike", 1.83, "lina_fig3_slowdown_median"), "not_comparable": "another model"},
        {**_entry("unlike-none", 1.83, None), "not_comparable": "a GPU counter"},
        {**_entry("at-least", 1.0, "lina_fig3_slowdown_median"), "bound": "lower"},  # 1.9 is above 1
        {**_entry("at-most", 1.0, "lina_fig3_slowdown_median"), "bound": "upper"},
    ]
    registry = load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"]))
    registry["at-least"]["testbed"] = registry["at-most"]["testbed"] = ["local-cpu"]
    table = compare(registry, *tables).set_index("id")
    assert table.loc["elsewhere", "verdict"] == NOT_COMPARABLE and table.loc["elsewhere", "reproduced"] == 1.9
    assert table.loc["elsewhere", "reason"].startswith("not comparable: measured on local-cpu, not on the paper's")
    assert table.loc["unlike", "verdict"] == NOT_COMPARABLE
    assert table.loc["unlike", "reason"] == "not comparable: another model"
    assert table.loc["unlike-none", "verdict"] == NOT_COMPARABLE and pd.isna(table.loc["unlike-none", "reproduced"])
    assert table.loc["at-least", "verdict"] == CONSISTENT and table.loc["at-least", "reason"].startswith("holds: ")
    assert table.loc["at-most", "verdict"] == DIFFERS  # 1.9 > 1.0 x (1 + 0.25)


def test_compare_counts_the_points_it_used(tmp_path, tables):
    """Points whose value is missing or not finite are not used, and the reproduced setting's count says so."""
    records, samples = tables
    registry = load_registry(
        _registry_file(
            tmp_path,
            [_entry("share", 34.1, "test_mean_a2a_share"), _entry("slow", 1.83, "lina_fig3_slowdown_median")],
        )
    )
    nan_row, inf_row, missing_row, high_row = records.index[records["metric"] == "a2a_share"][:4]
    records = records.copy()
    records.loc[nan_row, "value"] = np.nan  # an empty cell of records.csv
    records.loc[inf_row, "value"] = np.inf
    records = records.drop(missing_row)  # a point without the metric
    records.loc[high_row, "value"] = 0.5  # used: 4 points of 0.341, one of 0.5
    slowdowns = samples[
        (samples["metric"] == "slowdown") & (samples["size_bytes"] >= MiB) & (samples["collective"] == "all_to_all")
    ].index
    samples = samples.copy()
    samples.loc[slowdowns[:2], "value"] = np.nan
    table = compare(registry, records, samples).set_index("id")
    assert table.loc["share", "reproduced"] == pytest.approx(100 * (4 * SHARE + 0.5) / 5)
    assert table.loc["share", "reproduced_setting"] == "5 points"
    assert table.loc["slow", "reproduced_setting"].endswith(", 13 samples")


def test_compare_keeps_testbeds_apart(tmp_path):
    measured = write_train_step(tmp_path / "m")
    simulated = write_train_step(tmp_path / "s", mode="simulated", backend="sim", hardware="a100-ib")
    registry = load_registry(_registry_file(tmp_path, [_entry("share", 34.1, "lina_table1_training_a2a_share")]))
    table = compare(registry, *collect(measured + simulated))
    assert sorted(table["mode"]) == ["measured", "simulated"]
    assert (table["verdict"] == CONSISTENT).all()


def test_compare_verdicts_the_chosen_values_and_ranges_the_unstated_ones(tmp_path):
    """Records of sensitivity runs (param ``unstated``) never enter the verdict; the same reproducer on
    each run gives the reproduced range beside it."""
    paths = []
    for setting, share in ((None, 0.34), ("hardware.intra_node_GBps=240", 0.10), ("lina.x=1", 0.50)):
        params = {"world_size": 4, "num_experts": 4, "experts_per_rank": 1, "policy": "overlap", "seed": 0}
        params |= {"unstated": setting} if setting else {}
        paths.append(
            write_point(
                tmp_path,
                paper="gshard",
                experiment="sim_train_step",
                point=f"p_{share}",
                mode="simulated",
                backend="sim",
                hardware="a100-ib",
                params=params,
                samples={"a2a_share": [share], "step_ms": [100.0]},
            )
        )
    registry = load_registry(_registry_file(tmp_path, [_entry("share", 34.0, "lina_table1_training_a2a_share")]))
    row = compare(registry, *collect(paths)).iloc[0]
    assert row["reproduced"] == pytest.approx(34.0) and row["verdict"] == CONSISTENT
    assert (row["reproduced_low"], row["reproduced_high"]) == pytest.approx((10.0, 50.0))
    assert row["unstated"] == "hardware.intra_node_GBps=240; lina.x=1"
    chosen = compare(registry, *collect(paths[:1])).iloc[0]
    assert chosen["reproduced_low"] == chosen["reproduced_high"] == chosen["reproduced"]
    assert pd.isna(chosen["unstated"])


def test_compare_rejects_unknown_reproducer(tmp_path, tables):
    registry = load_registry(_registry_file(tmp_path, [_entry("x", 1.0, "no_such_function")]))
    with pytest.raises(ValueError, match="no_such_function"):
        compare(registry, *tables)


def _link_sweep(tmp_path, shares=((None, 0.34), ("12.4", 0.50), ("240", 0.10))):
    """Simulated overlap points of Lina's testbed at the chosen link rate and at each end of its range."""
    paths = []
    for link, share in shares:
        params = {"world_size": 4, "num_experts": 4, "experts_per_rank": 1, "policy": "overlap", "seed": 0}
        params |= {"unstated": f"hardware.intra_node_GBps={link}"} if link else {}
        paths.append(
            write_point(
                tmp_path,
                paper="lina",
                experiment="sim_train_step",
                point=f"p_{share}",
                mode="simulated",
                backend="sim",
                hardware="lina-a100-4x4",
                params=params,
                samples={"a2a_share": [share], "step_ms": [100.0]},
            )
        )
    return collect(paths)


def _fitted(tmp_path, tables, baseline, claim):
    entries = [
        {**_entry("base", baseline, "lina_table1_training_a2a_share"), "role": "baseline"},
        _entry("claim", claim, "lina_table1_training_a2a_share"),
    ]
    table = compare(load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"])), *tables)
    return table.set_index("id"), table.attrs["fits"][("lina", "simulated", "sim")]


def test_claims_are_predicted_at_the_testbed_fitted_to_the_baselines_and_never_fitted_to(tmp_path):
    tables = _link_sweep(tmp_path)
    table, fit = _fitted(tmp_path, tables, baseline=20.0, claim=34.0)
    assert set(fit.targets) == {"base"}  # the claim row is no target of the fit
    assert (
        table.loc["base", "reproduced"] == pytest.approx(20.0, rel=1e-3) and table.loc["base", "verdict"] == CONSISTENT
    )
    assert 25.0 < fit.setting["hardware.intra_node_GBps"] < 240.0
    # the claim reads the same simulated number: at the fit it is 20, not the chosen values' 34
    assert table.loc["claim", "reproduced_chosen"] == pytest.approx(34.0)
    assert (
        table.loc["claim", "reproduced"] == pytest.approx(20.0, rel=1e-3) and table.loc["claim", "verdict"] == DIFFERS
    )
    assert table.loc["claim", "reason"].startswith("does not hold: with the testbed fitted to 1 baseline row within")
    # the range spans the baseline-consistent settings only: shares within 25% of 20
    assert 15.0 - 1e-6 <= table.loc["claim", "reproduced_low"] < table.loc["claim", "reproduced_high"] <= 25.0 + 1e-6
    # moving the claim's published number moves nothing the fit decides
    other, other_fit = _fitted(tmp_path, tables, baseline=20.0, claim=22.0)
    assert other_fit.setting == fit.setting
    assert other.loc["claim", "reproduced"] == table.loc["claim", "reproduced"]
    assert other.loc["claim", "verdict"] == CONSISTENT  # 20 is within 25% of 22
    assert pd.isna(table.loc["claim", "loo"])


def test_a_baseline_no_plausible_setting_reaches_makes_its_claims_baseline_not_reproduced(tmp_path):
    table, fit = _fitted(tmp_path, _link_sweep(tmp_path), baseline=2.0, claim=34.0)
    assert len(fit.consistent) == 0 and fit.unreached.startswith("base: published 2")
    assert table.loc["claim", "verdict"] == BASELINE_NOT_REPRODUCED
    assert table.loc["claim", "reason"].startswith("baseline not reproduced: no plausible setting")
    assert table.loc["base", "verdict"] == DIFFERS


def _at_fit(tmp_path, fit, share, setting=None):
    """The tables of the run at ``fit``'s setting (the workflow's second stage): the point's share there."""
    params = {"world_size": 4, "num_experts": 4, "experts_per_rank": 1, "policy": "overlap", "seed": 0}
    params["unstated"] = setting or setting_text(fit.run_setting())
    out = tmp_path / "at_fit"
    out.mkdir(exist_ok=True)
    path = write_point(
        out,
        paper="lina",
        experiment="sim_train_step",
        point="p_fit",
        mode="simulated",
        backend="sim",
        hardware="lina-a100-4x4",
        params=params,
        samples={"a2a_share": [share], "step_ms": [100.0]},
    )
    return collect([path])


def test_the_run_at_the_fit_gives_the_value_and_the_baselines_residual_not_the_surface(tmp_path):
    """The surface says 20 at the fit; the simulator, run there, says 30: the verdicts read 30."""
    tables = _link_sweep(tmp_path)
    _, fit = _fitted(tmp_path, tables, baseline=20.0, claim=34.0)
    entries = [
        {**_entry("base", 20.0, "lina_table1_training_a2a_share"), "role": "baseline"},
        _entry("claim", 34.0, "lina_table1_training_a2a_share"),
    ]
    registry = load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"]))
    table = compare(registry, *tables, at_fit=_at_fit(tmp_path, fit, 0.30)).set_index("id")
    refit = table.attrs["fits"][("lina", "simulated", "sim")]
    assert refit.setting == fit.setting  # the run at the fit moves nothing the fit decides
    for row in ("base", "claim"):
        assert (
            table.loc[row, "reproduced"] == pytest.approx(30.0) and table.loc[row, "reproduced_by"] == SIMULATED_AT_FIT
        )
        assert table.loc[row, "reproduced_surface"] == pytest.approx(20.0, rel=1e-3)
    assert table.loc["base", "verdict"] == DIFFERS and refit.ratios["base"] == pytest.approx(1.5)
    assert refit.surface_ratios["base"] == pytest.approx(1.0, rel=1e-3)
    assert table.loc["claim", "verdict"] == CONSISTENT  # 30 is within 25% of 34
    assert "the surface through the sensitivity runs said 20" in table.loc["claim", "reason"]
    assert table.loc["claim", "reproduced_low"] <= 30.0 <= table.loc["claim", "reproduced_high"]


def test_runs_at_another_setting_than_the_fit_are_refused(tmp_path):
    tables = _link_sweep(tmp_path)
    _, fit = _fitted(tmp_path, tables, baseline=20.0, claim=34.0)
    entries = [{**_entry("base", 20.0, "lina_table1_training_a2a_share"), "role": "baseline"}]
    registry = load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"]))
    stale = _at_fit(tmp_path, fit, 0.30, setting="hardware.intra_node_GBps=99")
    with pytest.raises(ValueError, match="run the workflow's at_fit jobs again"):
        compare(registry, *tables, at_fit=stale)


def test_fitted_settings_are_config_layers_of_whole_counts(tmp_path):
    """The first stage's output: each paper's fit as a layer a run loads with --config; a count (Lina's
    sequences per GPU) is a whole number, a paper without a fit keeps its chosen values."""
    tables = _link_sweep(tmp_path)
    entries = [{**_entry("base", 20.0, "lina_table1_training_a2a_share"), "role": "baseline"}]
    registry = load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"]))
    settings = fitted_settings(registry, *tables, ["lina", "gshard"])
    assert 25.0 < settings["lina"]["hardware.intra_node_GBps"] < 240.0
    assert settings["lina"]["train.batch_size"] == 8  # no baseline row moves it: the chosen value
    assert settings["gshard"] == {p.key: p.chosen for p in UNSTATED_PARAMS["gshard"].values()}
    write_setting_layer(settings["lina"], tmp_path / "lina.yaml")
    cfg = load_config(["configs/ci.yaml", tmp_path / "lina.yaml"])
    assert cfg.unstated == setting_text(settings["lina"])
    assert cfg.hardware.intra_node_GBps == settings["lina"]["hardware.intra_node_GBps"]
    with pytest.raises(ValueError, match="no unstated parameters declared"):
        fitted_settings(registry, *tables, ["no-such-paper"])
