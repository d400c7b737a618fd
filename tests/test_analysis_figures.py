"""analysis.figures: every registered figure drawn from synthetic tables (PNG and PDF), refused without
its data, and the command-line pipeline collect -> compare -> figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from analysis_records import TABLE_FIGURES, write_collectives, write_train_step
from matplotlib.figure import Figure

from analysis import collect as collect_mod
from analysis import compare as compare_mod
from analysis import figures as figures_mod
from analysis import style
from analysis.collect import collect
from analysis.compare import NOT_COMPARABLE
from analysis.figures import draw, render
from analysis.registry import FIGURE_REGISTRY, FigureDataError


def test_figures_register_with_their_paper():
    """Each figure's paper is its folder results/figures/<paper>/ in the workflow; each has a report caption."""
    papers = {name: fig.paper for name, fig in FIGURE_REGISTRY.items()}
    assert papers == {
        "step_breakdown": "gshard",
        "busbw_vs_size": "common",
        "sim_validation": "common",
        "verdicts": "common",
        "dispatchers_under_skew": "common",
        "dispatcher_winner_map": "common",
        "external_validation_errors": "common",
        "external_dispatch_errors": "common",
        "external_steps_errors": "common",
        **dict.fromkeys(
            [
                "a2a_share_vs_experts",
                "a2a_slowdown_cdf",
                "sim_a2a_share_vs_cluster_size",
                "sim_a2a_slowdown_cdf",
                "lina_step_speedup",
                "lina_moe_speedup",
                "lina_partition_sweep",
                "lina_inference",
                "lina_inference_simulated",
            ],
            "lina",
        ),
        **dict.fromkeys(
            [
                "aurora_order_speedup",
                "aurora_gpu_utilisation",
                "aurora_gap_to_optimum",
                "aurora_imprecision",
                "aurora_ordered_vs_library",
            ],
            "aurora",
        ),
        **dict.fromkeys(
            [
                "monta_a2a_vs_tp",
                "monta_chunks",
                "monta_iteration_breakdown",
                "monta_strategy_ranking",
                "monta_hierarchical",
            ],
            "monta",
        ),
        **dict.fromkeys(
            ["axonn_model_validation", "axonn_overlap_ablation", "axonn_weak_scaling", "axonn_grid_ranking"], "axonn"
        ),
        **dict.fromkeys(["gshard_runtime_breakdown", "gshard_collective_scaling", "gshard_memory"], "gshard"),
    }
    assert {name: fig.reads for name, fig in FIGURE_REGISTRY.items() if fig.reads != "tables"} == {
        "sim_validation": "validation",
        "verdicts": "comparison",
    }
    captions = Path(figures_mod.__file__).with_name("captions")
    assert all((captions / f"{name}.rst").is_file() for name in FIGURE_REGISTRY)


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_figure_renders_png_and_pdf(tmp_path, figure_tables, name):
    outputs = render(name, *figure_tables, tmp_path / "fig" / f"{name}.png")
    assert [p.name for p in outputs] == [f"{name}.png", f"{name}.pdf"]
    assert all(p.stat().st_size > 1000 for p in outputs)
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == sorted(p.name for p in outputs)


NEEDS = {
    "step_breakdown": "train_step",
    "a2a_share_vs_experts": "train_step",
    "a2a_slowdown_cdf": "collectives",
    "busbw_vs_size": "collectives",
    "sim_a2a_share_vs_cluster_size": "sim_train_step",
    "sim_a2a_slowdown_cdf": "sim_train_step",
    "aurora_order_speedup": "aurora_deployment",
    "aurora_gpu_utilisation": "aurora_deployment",
    "aurora_gap_to_optimum": "aurora_gap",
    "aurora_imprecision": "aurora_imprecision",
    "aurora_ordered_vs_library": "aurora_a2a",
    "lina_step_speedup": "sim_train_step",
    "lina_moe_speedup": "sim_train_step",
    "lina_partition_sweep": "sim_train_step",
    "lina_inference": "inference",
    "lina_inference_simulated": "inference",
    # MoNTA's figures draw measured and simulated panels: each needs all of its sources gone
    "monta_a2a_vs_tp": ("monta_a2a", "sim_train_step"),
    "monta_chunks": ("sim_train_step", "monta_chunk_model", "monta_a2a"),
    "monta_iteration_breakdown": ("sim_train_step", "train_step"),
    "monta_strategy_ranking": "monta_strategy",
    "monta_hierarchical": ("sim_train_step", "monta_a2a"),
    "dispatchers_under_skew": ("dispatchers", "dispatchers_sim"),
    "dispatcher_winner_map": "dispatchers_sim",
    "external_validation_errors": "external_validation",
    "external_dispatch_errors": "external_dispatch",
    "external_steps_errors": "external_steps",
    "axonn_model_validation": "axonn_grids",
    "axonn_overlap_ablation": ("axonn_grids", "axonn_ablation"),
    "axonn_weak_scaling": "axonn_scaling",
    "axonn_grid_ranking": "axonn_ranking",
    "gshard_runtime_breakdown": "gshard_scaling",
    "gshard_collective_scaling": "gshard_collectives",
    "gshard_memory": "gshard_memory",
}


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_figure_without_data_raises_and_writes_nothing(tmp_path, figure_tables, name):
    records, samples = figure_tables
    needs = NEEDS[name] if isinstance(NEEDS[name], tuple) else (NEEDS[name],)
    with pytest.raises(FigureDataError):
        render(
            name,
            records[~records["experiment"].isin(needs)],
            samples[~samples["experiment"].isin(needs)],
            tmp_path / f"{name}.png",
        )
    assert not any(tmp_path.iterdir())


def test_winner_map_names_the_fastest_path_and_its_margin(figure_tables, monkeypatch):
    """The winner map's cells: per cluster, size and skew the fastest simulated path and its time over
    the runner-up's (the fixture: capacity 5 ms, dropless 4 x imbalance, allgather 9 ms)."""
    records, samples = figure_tables
    texts = []
    monkeypatch.setattr("matplotlib.axes.Axes.text", lambda self, x, y, s, **kw: texts.append(s))
    fig = Figure()
    FIGURE_REGISTRY["dispatcher_winner_map"].draw(records, samples, fig)
    # uniform (imbalance 1): dropless 4 ms beats capacity 5 ms; zipf (imbalance 2): capacity 5 ms beats
    # dropless 8 ms, and drops 10% of the tokens
    assert sorted(texts) == ["capacity 1.60x\ndrops 10%", "dropless 1.25x"]


def test_validation_figure_renders_and_needs_its_table(tmp_path, figure_tables):
    validation = pd.DataFrame(
        {
            "experiment": ["collectives", "train_step"],
            "setting": ["a", "b"],
            "hardware": ["local-cpu"] * 2,
            "measured_ms": [10.0, 200.0],
            "predicted_ms": [11.0, 180.0],
            "rel_error": [0.1, -0.1],
            "noisy": [False, True],
            "contention": [0.01, 0.6],
            "profile_noisy": [False, False],
        }
    )
    outputs = render("sim_validation", *figure_tables, tmp_path / "v.png", validation)
    assert all(p.stat().st_size > 1000 for p in outputs)
    with pytest.raises(ValueError, match="validation table"):
        render("sim_validation", *figure_tables, tmp_path / "w.png")


def test_figure_refuses_to_pool_testbeds(tmp_path):
    measured = write_train_step(tmp_path / "m")
    simulated = write_train_step(tmp_path / "s", mode="simulated", backend="sim", hardware="a100-ib")
    with pytest.raises(FigureDataError, match="several testbeds"):
        render("step_breakdown", *collect(measured + simulated), tmp_path / "out" / "step_breakdown.png")
    assert not (tmp_path / "out").exists()


def test_cli_pipeline_through_csv(tmp_path):
    """collect -> compare -> figures on the CSV files, as the workflow runs them."""
    raw = write_collectives(tmp_path / "results")
    tables = ["--records", str(tmp_path / "records.csv"), "--samples", str(tmp_path / "samples.csv")]
    collect_mod.main(["--out-records", tables[1], "--out-samples", tables[3], *map(str, raw)])
    compare_mod.main([*tables, "--out", str(tmp_path / "comparison.csv")])
    comparison = pd.read_csv(tmp_path / "comparison.csv").set_index("id")
    fig3 = comparison.loc["lina-fig3-a2a-slowdown-median"]  # measured here, not on Lina's A100s
    assert (
        fig3["verdict"] == NOT_COMPARABLE and "local-cpu, not on the paper's testbed (lina-a100-4x4)" in fig3["reason"]
    )
    # several figures in one call, as a paper's figures rule draws them: one --out per --figure
    pairs = [["--figure", "busbw_vs_size", "--out", str(tmp_path / "fig" / f"busbw{i}.png")] for i in range(2)]
    figures_mod.main([*tables, *pairs[0], *pairs[1]])
    assert all((tmp_path / "fig" / f"busbw{i}.pdf").is_file() for i in range(2))
    with pytest.raises(SystemExit):
        figures_mod.main([*tables, *pairs[0], "--figure", "busbw_vs_size"])
    # as the workflow's figures rules run it: the PNGs name their figures
    figures_mod.main([*tables, "--out", str(tmp_path / "named" / "busbw_vs_size.png")])
    assert (tmp_path / "named" / "busbw_vs_size.pdf").is_file()
    # as the workflow runs it, with the runs at the fits (here the same tables: every point covered)
    figures_mod.main([*tables, "--at-fit", tables[1], tables[3], "--out", str(tmp_path / "fit" / "busbw_vs_size.png")])
    assert (tmp_path / "fit" / "busbw_vs_size.pdf").is_file()
    with pytest.raises(SystemExit, match="no figure 'busbw'"):
        figures_mod.main([*tables, "--out", str(tmp_path / "named" / "busbw.png")])
    with pytest.raises(SystemExit) as exit_info:  # no train_step records in these tables
        figures_mod.main([*tables, "--figure", "step_breakdown", "--out", str(tmp_path / "fig" / "steps.png")])
    assert exit_info.value.code != 0 and not (tmp_path / "fig" / "steps.png").exists()
    # as the workflow runs it: `python -m` runs a second copy of the module, which must still see the papers'
    # reproducers (registered with analysis.compare)
    subprocess.run(
        [sys.executable, "-m", "analysis.compare", *tables, "--out", str(tmp_path / "m.csv")],
        check=True,
        capture_output=True,
        cwd=Path(compare_mod.__file__).parents[1],
    )
    assert pd.read_csv(tmp_path / "m.csv").equals(pd.read_csv(tmp_path / "comparison.csv"))


@pytest.mark.parametrize("name", ["step_breakdown", "gshard_runtime_breakdown", "monta_iteration_breakdown"])
def test_step_phases_have_one_colour_and_name_in_every_figure(figure_tables, name):
    """A figure that splits a step names each phase in words and draws it in the phase's colour from
    analysis/style.py, so the same colour is the same phase in every figure."""
    fig = draw(name, *figure_tables)
    try:
        legend = fig.legends[0]
        shown = {text.get_text(): handle for text, handle in zip(legend.get_texts(), legend.legend_handles)}
    finally:
        plt.close(fig)
    phases = {label: colour for label, colour in style.PHASES.values()}
    drawn = {label: handle.get_facecolor()[:3] for label, handle in shown.items() if label in phases}
    assert len(drawn) >= 4 and not any(label.endswith("_ms") for label in shown)
    assert all(np.allclose(colour, phases[label]) for label, colour in drawn.items())


@pytest.mark.parametrize(
    "name, prefix, experts",
    [
        ("lina_step_speedup", "lina-fig10-step-speedup", (4, 8)),
        ("lina_moe_speedup", "lina-fig12-moe-bwd-speedup", (8,)),
    ],
)
def test_judged_figures_draw_each_verdicts_range(figure_tables, name, prefix, experts):
    """A judged figure draws, over the bar a verdict scores, the range the comparison gives that verdict
    (reproduced_low to reproduced_high on the bar's testbed); not a row that judges nothing (not
    comparable) nor another testbed's, and nothing when drawn without the comparison."""
    records, samples = figure_tables
    testbed = {"mode": "simulated", "backend": "sim", "hardware": "lina-a100-4x4"}
    judged = [
        {"id": f"{prefix}-{n}e", **testbed, "verdict": "differs", "reproduced_low": 1.1 * n, "reproduced_high": 1.3 * n}
        for n in experts
    ]
    unjudged = {**judged[0], "verdict": NOT_COMPARABLE, "reproduced_low": 0.1, "reproduced_high": 0.2}
    elsewhere = [{**row, "hardware": "another-cluster", "reproduced_low": 0.3} for row in judged]
    fig = draw(name, records, samples, pd.DataFrame([unjudged, *elsewhere, *judged]))
    try:
        drawn = [
            segment
            for ax in fig.axes
            for artist in ax.collections
            if artist.get_gid() == "verdict-range"
            for segment in artist.get_segments()
        ]
        ranges = sorted((round(s[0][1], 6), round(s[1][1], 6)) for s in drawn)
    finally:
        plt.close(fig)
    assert ranges == [(round(1.1 * n, 6), round(1.3 * n, 6)) for n in experts]
    fig = draw(name, records, samples)
    try:
        assert not [a for ax in fig.axes for a in ax.collections if a.get_gid() == "verdict-range"]
    finally:
        plt.close(fig)
