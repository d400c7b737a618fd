"""MoNTA's decisions, points and experiments: the chunk count, the strategy ranking at the paper's
setting, the measured exchange on gloo ranks, and the reproducers on the records they write."""

import subprocess
import sys

import pandas as pd
import pytest

import analysis.papers  # noqa: F401  (registers the reproducers)
from analysis.collect import at_setting, collect, read_valid_record
from analysis.papers.monta import strategy_ranking
from analysis.registry import REPRODUCERS
from experiments.__main__ import main as run_entry_point
from experiments.monta_a2a import measured_points as a2a_points
from moe_core.config.load import ConfigError, load_config
from moe_core.papers.monta.config import MONTA_UNSTATED
from moe_core.papers.monta.decisions import monta_chunks
from moe_core.papers.monta.study import model_points
from moe_core.schema.points import measured_points, sim_points, unstated_param

CONFIGS = ["configs/default.yaml", "configs/ci.yaml"]
TP2 = ["parallel.tensor_parallel=2", "moe.num_experts=2", "moe.experts_per_rank=1", "moe.dispatcher=monta"]
NICS_8 = "hardware.nics_per_node=8"  # the other end of the unstated NIC count (MONTA_UNSTATED)


def _paper(*extra):
    """MoNTA's setting: the paper's model on 2 x 8 A800, tp 8 x ep 2, MoNTA's dispatch."""
    base = load_config(["configs/default.yaml"])
    overrides = [*base.monta.overrides, "hardware_profile=monta-a800-2x8", "parallel.world_size=16"]
    overrides += ["parallel.tensor_parallel=8", "moe.num_experts=2", "moe.dispatcher=monta", *extra]
    return load_config(["configs/default.yaml"], overrides, whole_run=False)


def test_chunk_count_is_forced_modelled_or_the_code_default():
    assert monta_chunks(load_config(overrides=[*TP2, "comm.tp_chunks=2"])) == 2
    # local-cpu states no link numbers: the released code's 4 chunks (the default model's 640 slots / 2)
    assert monta_chunks(load_config(["configs/default.yaml"], TP2)) == 4
    # MoNTA's testbed: the model weighs NVLink gathers against NIC-bound all-to-alls per chunk
    assert monta_chunks(_paper()) == 8
    assert monta_chunks(_paper("monta.chunk_overhead_us=500")) < 8  # costly chunks: fewer of them
    assert monta_chunks(_paper(NICS_8)) < 8  # a faster all-to-all hides fewer gathers


def test_points_are_named_uniquely_and_load():
    cfg = load_config(["configs/default.yaml"])
    points = {name: ov for name, (paper, ov) in sim_points(cfg).items() if paper == "monta"}
    assert len(points) >= 30
    tps, hardware = set(), set()
    for name, overrides in points.items():
        point_cfg = load_config(["configs/default.yaml"], overrides, whole_run=False)  # every point is a valid config
        tps.add(point_cfg.parallel.tensor_parallel)
        hardware.add(point_cfg.hardware.name)
        assert name.startswith(point_cfg.hardware.name)
    assert tps == {1, 2, 4, 8}
    assert hardware == {"monta-a800-2x8"}  # one testbed: the NIC count is a setting of it, not a testbed
    measured = [name for name, p in measured_points(cfg).items() if p["paper"] == "monta"]
    assert measured == [f"ws4_e2_epr1_overlap_s0_tp2-{d}" for d in ("duplicate", "drop-gather", "monta")]
    # the CI sweep's 2 ranks cannot hold tp 2 x ep 2: it measures no MoNTA steps (monta.measured_dispatch=[]);
    # a measured layout the sweep cannot hold is an error (tests/test_config.py)
    assert not [p for p in measured_points(load_config(CONFIGS)).values() if p["paper"] == "monta"]


def test_the_chosen_nic_count_runs_everywhere_and_the_other_end_at_the_abstracts_layout():
    """Chosen points carry the profile's 4 NICs and no ``unstated``; the sensitivity runs are the tp 8
    dispatches at 8 NICs, recorded as such (MONTA_UNSTATED)."""
    cfg = load_config(["configs/default.yaml"])
    points = {name: ov for name, (paper, ov) in sim_points(cfg).items() if paper == "monta"}
    varied = {}
    for name, overrides in points.items():
        point_cfg = load_config(["configs/default.yaml"], overrides, whole_run=False)
        if point_cfg.unstated:
            varied[name] = point_cfg
        else:
            assert point_cfg.hardware.nics_per_node == 4 and not unstated_param(point_cfg)
    assert {p.key for p in MONTA_UNSTATED} == {"hardware.nics_per_node"}
    assert sorted(varied) == [
        f"monta-a800-2x8_ws16_e2_epr1_overlap_s0_tp8-{d}_nics_per_node8" for d in ("drop-gather", "duplicate", "monta")
    ]
    for point_cfg in varied.values():
        assert point_cfg.hardware.nics_per_node == 8 and point_cfg.parallel.tensor_parallel == 8
        assert unstated_param(point_cfg) == {"unstated": "hardware.nics_per_node=8"}


def test_model_ranks_8_card_tensor_parallelism_first_at_the_paper_setting(tmp_path):
    assert run_entry_point(["monta", "--config", "configs/default.yaml", f"results_dir={tmp_path}"]) == 0
    files = sorted((tmp_path / "raw" / "monta").glob("*/*.json"))
    cfg = load_config(["configs/default.yaml"])
    declared = {(e, p) for e, points in model_points(cfg).items() for p in points}
    assert {(f.parent.name, f.stem) for f in files} == declared
    records, _ = collect(files)
    layouts = strategy_ranking(at_setting(records))  # the table shows the chosen NIC count only
    assert set(layouts["hardware"]) == {"monta-a800-2x8"} and set(records["hardware"]) == {"monta-a800-2x8"}
    assert set(records.loc[records["experiment"] == "monta_strategy", "nics_per_node"]) == {4}  # chosen only
    best = layouts.sort_values("model_rank").iloc[0]
    assert (best["tensor_parallel"], best["expert_parallel"], best["data_parallel"]) == (8, 2, 1)
    assert layouts["fits"].sum() == 1  # 2 experts of 80 layers fit 80 GB only split 16 ways
    assert (layouts["tensor_parallel"] * layouts["expert_parallel"] * layouts["data_parallel"] == 16).all()
    curves = [r for r in map(read_valid_record, files) if r["experiment"] == "monta_chunk_model"]
    # one pick per setting, the fastest of its curve: the chosen 4 NICs' and the 8 of the other end
    picks = {r["params"].get("unstated"): r["params"]["chunks"] for r in curves if r["metrics"]["chosen"]["value"]}
    assert picks == {None: monta_chunks(_paper()), "hardware.nics_per_node=8": monta_chunks(_paper(NICS_8))}
    for setting, n in picks.items():
        curve = {
            r["params"]["chunks"]: r["metrics"]["model_exchange_ms"]["value"]
            for r in curves
            if r["params"].get("unstated") == setting
        }
        assert curve[n] == min(curve.values())
    pick = REPRODUCERS["monta_model_chunks"]
    assert pick(at_setting(records), records.iloc[0:0])[0] == picks[None]
    assert pick(at_setting(records, NICS_8), records.iloc[0:0])[0] == picks[NICS_8]


@pytest.mark.parametrize("override", ["monta.sim_chunks=[0]", "monta.nics_per_node=[4,8]"])
def test_model_run_refuses_a_bad_config_without_writing(tmp_path, override):
    """A bad value, or the NIC-count list that became the profile's unstated parameter: exit 2, nothing written."""
    assert run_entry_point(["monta", "--config", "configs/default.yaml", f"results_dir={tmp_path}", override]) == 2
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize(
    "override,key",
    [
        ("monta.tensor_parallel=[3]", "monta.tensor_parallel"),
        ("monta.bytes_per_rank=100", "monta.bytes_per_rank"),
        ("monta.measured_dispatch=[scatter]", "monta.measured_dispatch"),
        ("monta.hardware=nowhere", "monta.hardware"),
        ("monta.nics_per_node=[4,8]", "monta.nics_per_node"),  # now hardware.nics_per_node (the profile's)
    ],
)
def test_bad_monta_settings_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(["configs/default.yaml"], [override])


def test_measured_exchange_on_two_ranks_writes_every_declared_point(tmp_path):
    """experiments/monta_a2a.py under the launcher: every path checked against the whole all-to-all."""
    overrides = [f"results_dir={tmp_path}", "monta.world_size=2", "monta.tensor_parallel=[1,2]", "monta.iters=2"]
    overrides += ["monta.bytes_per_rank=262144", "monta.chunks=[2,4]", "monta.warmup_iters=0"]
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "configs/default.yaml", *overrides, "--nproc", "2"]
    result = subprocess.run([*cmd, "--", "-m", "experiments", "monta_a2a"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = load_config(["configs/default.yaml"], overrides)
    found = {p.stem: read_valid_record(p) for p in (tmp_path / "raw" / "monta" / "monta_a2a").glob("*.json")}
    assert (
        set(found)
        == set(a2a_points(cfg))
        == {
            "ws2_tp1_flat",
            "ws2_tp2_duplicate",
            "ws2_tp2_drop-gather",
            "ws2_tp2_monta-n2",
            "ws2_tp2_monta-n4",
        }
    )
    for record in found.values():
        assert record["metrics"]["exchange_ms"]["n"] == 2 and record["metrics"]["exchange_ms"]["median"] > 0


def test_reproducers_compute_the_papers_quantities():
    rows = []
    for path, step, a2a in (("duplicate", 5000.0, 2000.0), ("drop-gather", 4000.0, 400.0), ("monta", 3500.0, 250.0)):
        for metric, value in (("step_ms", step), ("a2a_ms", a2a)):
            rows.append(
                dict(
                    paper="monta",
                    experiment="sim_train_step",
                    point=path,
                    mode="simulated",
                    backend="sim",
                    hardware="monta-a800-2x8",
                    tensor_parallel=8,
                    expert_parallel=2,
                    data_parallel=1,
                    tp_chunks=0,
                    dispatcher=path,
                    moe_layers=10,
                    metric=metric,
                    value=value,
                )
            )
    records = pd.DataFrame(rows)
    speedup, _ = REPRODUCERS["monta_a2a_speedup_tp8"](records, records.iloc[0:0])
    gain, _ = REPRODUCERS["monta_iteration_gain"](records, records.iloc[0:0])
    assert speedup == pytest.approx(2000 / 250) and gain == pytest.approx(12.5)
    assert REPRODUCERS["monta_a2a_speedup_tp8"](records[records["point"] != "monta"], records.iloc[0:0]) is None
