"""AxoNN's experiments and the simulated grid: the step simulator issues exactly the planned grid
collectives, agrees with Megatron's tensor parallelism where the two are the same split, hides
communication behind compute with the overlaps; the measured sweep writes every declared point,
measurements only, and the model's predictions for them are records of their own that join them
one to one; the Perlmutter-scale study writes every declared record."""

import subprocess
import sys
from collections import Counter

import pytest
from omegaconf import OmegaConf

import analysis.papers  # noqa: F401  (registers every paper's tables)
from analysis.collect import collect
from analysis.registry import TABLE_REGISTRY
from experiments.__main__ import main as run_entry_point
from experiments.axonn import records
from experiments.axonn_grid_predictions import grid_prediction_records
from moe_core.config.load import hardware_profile, load_config
from moe_core.model.capacity import moe_blocks
from moe_core.papers.axonn.config import AXONN_UNSTATED, OVERLAP_VARIANTS, UNSTATED, AxonnConfig, overlap_overrides
from moe_core.papers.axonn.models import WEAK_SCALING
from moe_core.papers.axonn.study import megatron_scaling, record_points
from moe_core.papers.axonn.sweeps import grid_points, measured_communication, point_config
from moe_core.parallel.grid import block_collectives
from moe_core.records.results import read_record
from moe_core.schema.sections import ConfigError
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

# A dense GPT on 2 nodes x 4 A100 of Perlmutter (bf16), the simulator's unit of test
DENSE = [
    "hardware_profile=axonn-perlmutter",
    "hardware.nodes=2",
    "model.moe_every=0",
    "moe.num_experts=1",
    "moe.top_k=1",
    "model.d_model=1024",
    "model.n_heads=16",
    "model.d_ff=4096",
    "model.n_layers=4",
    "model.seq_len=512",
    "model.vocab_size=1024",
    "train.dtype=bfloat16",
    "train.batch_size=2",
    "comm.policy=sequential",
]


def _simulate(*overrides):
    cfg = load_config(overrides=[*DENSE, *overrides])
    return cfg, StepModel(cfg, build_topology(cfg.hardware)).run()


def _grid(depth, row, col, world=8):
    return [f"parallel.world_size={world}", f"parallel.grid.depth={depth}", f"parallel.grid.row={row}"] + [
        f"parallel.grid.col={col}"
    ]


@pytest.mark.parametrize("depth,row,col", [(2, 2, 1), (1, 2, 2), (2, 1, 4), (8, 1, 1)])
def test_simulated_step_issues_exactly_the_planned_grid_collectives(depth, row, col):
    cfg, sim = _simulate(*_grid(depth, row, col))
    layout_grid = load_config(overrides=[*DENSE, *_grid(depth, row, col)]).parallel.grid
    assert (layout_grid.depth, layout_grid.row, layout_grid.col) == (depth, row, col)
    m, tokens = cfg.model, cfg.train.batch_size * cfg.model.seq_len
    from moe_core.parallel.layout import layout_of

    grid = layout_of(cfg).grid
    planned = Counter(
        (c.kind, c.axis, c.pass_)
        for i in range(m.n_layers)
        for c in block_collectives(grid, m.d_model, m.d_ff, i not in moe_blocks(m.n_layers, m.moe_every), tokens, False)
    )
    issued = Counter(
        (op.phase.removeprefix("grid_"), op.name.split(".")[-2].split("_")[-1], op.name.split(".")[-1])
        for op in sim.ops
        if op.phase.startswith("grid_")
    )
    assert issued == planned and sum(planned.values()) > 0


@pytest.mark.parametrize("tp", [2, 4])
def test_a_grid_of_rows_is_megatron_tensor_parallelism(tp):
    """row = t (no col, no depth) splits and communicates as Megatron's t-way tensor parallelism: one
    activation all-reduce per pair and pass, the same FLOPs per rank, so the same simulated step."""
    _, grid = _simulate(*_grid(1, tp, 1, world=tp))
    _, megatron = _simulate(f"parallel.world_size={tp}", f"parallel.tensor_parallel={tp}", "moe.dispatcher=duplicate")
    assert grid.metrics()["step_ms"] == pytest.approx(megatron.metrics()["step_ms"], rel=1e-9)
    assert grid.metrics()["grid_all_reduce_busy_ms"] > 0


def test_overlaps_hide_grid_communication_without_changing_it():
    # launches off: at this size the host's launches bound the step on its own, and hiding collectives
    # behind compute cannot shorten a host-bound step (moe_core.sim.engine.issued_by_host)
    free = "hardware.kernel_launch_us=0"
    _, plain = _simulate(*_grid(2, 2, 1), free)
    _, hidden = _simulate(*_grid(2, 2, 1), free, *overlap_overrides("all", 0))
    p, h = plain.metrics(), hidden.metrics()
    assert h["grid_comm_ms"] < 0.7 * p["grid_comm_ms"]  # what the compute stream waits for
    assert h["step_ms"] < p["step_ms"]
    for kind in ("all_gather", "all_reduce", "reduce_scatter"):  # the same collectives are in flight
        assert h[f"grid_{kind}_busy_ms"] == pytest.approx(p[f"grid_{kind}_busy_ms"], rel=0.25)
    _, cached = _simulate(*_grid(2, 2, 1), *overlap_overrides("all+cache", 4))  # every block keeps its weights

    def depth_gathers(sim):
        return sum(op.name.endswith(("all_gather_depth.fwd", "all_gather_depth.bwd")) for op in sim.ops)

    assert depth_gathers(cached) == depth_gathers(plain) / 2 > 0  # forward only


def test_overlap_variants_switch_what_they_name():
    assert overlap_overrides("none", 3)[-1] == "comm.grid_overlap.cached_layers=0"
    assert overlap_overrides("all+cache", 3) == [
        "comm.grid_overlap.all_reduce=true",
        "comm.grid_overlap.reduce_scatter=true",
        "comm.grid_overlap.all_gather=true",
        "comm.grid_overlap.cached_layers=3",
    ]
    assert "comm.grid_overlap.reduce_scatter=true" in overlap_overrides("reduce_scatter", 0)
    assert "comm.grid_overlap.all_gather=false" in overlap_overrides("reduce_scatter", 0)


def test_bad_axonn_settings_name_the_key():
    with pytest.raises(ConfigError, match="axonn.ablation_grid"):
        load_config(["configs/default.yaml"], ["axonn.ablation_grid=[3,1,1]"])
    with pytest.raises(ConfigError, match="axonn.global_sequences"):
        load_config(["configs/default.yaml"], ["axonn.global_sequences=6"])
    with pytest.raises(ConfigError, match="axonn.sequences_per_gpu"):
        load_config(["configs/default.yaml"], ["axonn.sequences_per_gpu=0"])


def test_unstated_parameters_list_the_chosen_values_the_run_uses():
    """Every listed parameter's chosen value is what AxoNN's simulated points resolve to; the
    simulated sensitivity runs are listed parameters, each at values other than the chosen one."""
    cfg = load_config(["configs/default.yaml"], [f"hardware_profile={AxonnConfig.hardware}"])
    for key, param in UNSTATED.items():
        assert OmegaConf.select(cfg, key) == pytest.approx(param.chosen), key
        assert param.chosen not in param.ends
    assert all(UNSTATED[param.key] == param for param in AXONN_UNSTATED)


# A profile that states the link rates AxoNN's model prices (a calibrated profile's stand-in)
LINKED_PROFILE = "axonn.model_profile=dgx-a100-40gb-hdr"


def _read_records(folder):
    return {p.stem: read_record(p) for p in folder.glob("*.json")}


def test_measured_grid_sweep_on_two_ranks_writes_every_declared_point_and_its_prediction(tmp_path):
    overrides = [
        f"results_dir={tmp_path}",
        "axonn.world_size=2",
        "axonn.global_sequences=2",
        "axonn.ablation_grid=[2,1,1]",
        "axonn.cached_layers=1",
        "axonn.warmup_iters=0",
        "axonn.iters=2",
        "axonn.measured_overrides=[model.moe_every=0,moe.num_experts=1,moe.top_k=1,model.n_layers=2,model.n_heads=2]",
    ]
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "configs/default.yaml", *overrides, "--nproc", "2"]
    result = subprocess.run([*cmd, "--", "-m", "experiments", "axonn_grids"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = load_config(["configs/default.yaml"], overrides)
    measured = _read_records(tmp_path / "raw" / "axonn" / "axonn_grids")
    grids = {"data2xdepth1xrow1xcol1", "data1xdepth2xrow1xcol1", "data1xdepth1xrow2xcol1", "data1xdepth1xrow1xcol2"}
    variants = [f"ws2_data1xdepth2xrow1xcol1_{v}" for v in OVERLAP_VARIANTS]
    assert set(measured) == set(grid_points(cfg)) == {f"ws2_{g}_none" for g in grids} | set(variants)
    for name, record in measured.items():  # measurements only: no model's number in a measured record
        m = record["metrics"]
        assert m["comm_ms"]["n"] == 2 and m["comm_ms"]["median"] > 0, name
        assert not [k for k in m if k.startswith("predicted_")], name

    assert (
        run_entry_point(["axonn_grid_predictions", "--config", "configs/default.yaml", *overrides, LINKED_PROFILE]) == 0
    )
    predicted = _read_records(tmp_path / "raw" / "axonn" / "axonn_grid_predictions")
    assert set(predicted) == set(measured)  # one prediction per measured point, the same params
    for name, record in predicted.items():
        assert (record["mode"], record["hardware"]) == ("simulated", measured[name]["hardware"]), name
        assert record["params"] == measured[name]["params"] and record["metrics"]["predicted_comm_ms"]["value"] > 0
    # the analysis joins them one to one: each grid without overlap with its own point's prediction
    table = TABLE_REGISTRY["axonn_grid_validation"].build(collect((tmp_path / "raw").glob("*/*/*.json"))[0])
    assert len(table) == len(grids) and table["hardware"].eq(cfg.hardware.name).all()
    for row in table.itertuples():
        point = f"ws2_data{row.grid_data}xdepth{row.grid_depth}xrow{row.grid_row}xcol{row.grid_col}_none"
        assert row.predicted_comm_ms == predicted[point]["metrics"]["predicted_comm_ms"]["value"]
        assert row.comm_ms == measured[point]["metrics"]["comm_ms"]["median"]


def test_grid_predictions_are_the_models_on_the_given_profile():
    cfg = load_config(["configs/default.yaml"], [LINKED_PROFILE])
    written = {r["point"]: r for r in grid_prediction_records(cfg)}
    assert list(written) == list(grid_points(cfg))
    for name, (grid, variant) in grid_points(cfg).items():
        seconds = measured_communication(point_config(cfg, grid, variant), hardware_profile("dgx-a100-40gb-hdr"), grid)
        metrics = {k: v["value"] for k, v in written[name]["metrics"].items()}
        assert metrics.pop("predicted_comm_ms") == pytest.approx(seconds.pop("total_s") * 1e3, rel=1e-12)
        assert metrics == pytest.approx({f"predicted_{k.removesuffix('_s')}_ms": v * 1e3 for k, v in seconds.items()})
        assert (written[name]["experiment"], written[name]["backend"]) == ("axonn_grid_predictions", "model")


def test_grid_predictions_refuse_a_profile_without_link_rates(tmp_path, capsys):
    # the run's own profile (axonn.model_profile empty), local-cpu, states no link rate
    assert (
        run_entry_point(["axonn_grid_predictions", "--config", "configs/default.yaml", f"results_dir={tmp_path}"]) == 2
    )
    assert "axonn.model_profile" in capsys.readouterr().err
    assert not (tmp_path / "raw").exists()


def test_megatron_baseline_composes_its_pipeline():
    cfg = load_config(["configs/default.yaml"])
    params, metrics = megatron_scaling(cfg, WEAK_SCALING[-1])
    assert params["tp"] * params["pp"] * params["dp"] == WEAK_SCALING[-1].gpus
    slots = params["microbatches"] + params["pp"] - 1
    expected = slots * (metrics["stage_ms"] + metrics["p2p_ms"]) + metrics["dp_allreduce_ms"] + metrics["optimizer_ms"]
    assert metrics["batch_s"] * 1e3 == pytest.approx(expected)
    assert metrics["dp_allreduce_ms"] > 0 and 0 < metrics["peak_share"] < 1


def test_simulated_study_writes_every_declared_record():
    cfg = load_config(["configs/default.yaml"])
    written = records(cfg)
    declared = record_points(cfg)
    assert {e: sorted(r["point"] for r in written if r["experiment"] == e) for e in declared} == {
        e: sorted(points) for e, points in declared.items()
    }
    # the chosen batch (one sequence per GPU) in the chosen runs; the sensitivity runs say their setting
    chosen = {r["point"]: r["params"] for r in written if "unstated" not in r["params"]}
    assert chosen["80B_axonn"]["global_sequences"] == chosen["80B_megatron"]["global_sequences"] == 1024
    assert chosen["2B_none"]["global_sequences"] == 64
    varied = {r["point"]: r["params"] for r in written if "unstated" in r["params"]}
    # each parameter alone at its other end, then both together (the joint corner)
    assert {(point, params["unstated"]) for point, params in varied.items()} == {
        (f"{point}_{suffix}", setting)
        for point in ("80B_axonn", "80B_megatron", "2B_none", "2B_all")
        for suffix, setting in (
            ("sequences_per_gpu2", "axonn.sequences_per_gpu=2"),
            ("nic_efficiency0.67", "hardware.nic_efficiency=0.67"),
            ("sequences_per_gpu2_nic_efficiency0.67", "axonn.sequences_per_gpu=2,hardware.nic_efficiency=0.67"),
        )
    }
    assert varied["80B_axonn_sequences_per_gpu2"]["global_sequences"] == 2048
    assert varied["80B_axonn_nic_efficiency0.67"]["global_sequences"] == 1024
    batch_s = {r["point"]: r["metrics"]["batch_s"]["value"] for r in written if r["experiment"] == "axonn_scaling"}
    assert batch_s["80B_axonn_nic_efficiency0.67"] > batch_s["80B_axonn"]  # slower NICs reach the simulator
    ranking = [r for r in written if r["experiment"] == "axonn_ranking"]
    simulated = sorted(
        (r["metrics"]["model_rank"]["value"], r["metrics"]["sim_comm_ms"]["value"])
        for r in ranking
        if "sim_comm_ms" in r["metrics"]
    )
    assert len(simulated) == cfg.axonn.ranked_grids
