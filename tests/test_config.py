"""Configuration: schema checks, layouts, sweep expansion, and bad input at the command line."""

import os
import subprocess
import sys

import pytest

from moe_core.config import ConfigError, check_layout, load_config, point_name, sweep_points


def test_defaults_and_files_merge_with_overrides():
    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], ["moe.num_experts=8", "moe.experts_per_rank=2"])
    assert cfg.moe.num_experts == 8 and cfg.sweep.name == "ci" and cfg.hardware.name == "local-cpu"


@pytest.mark.parametrize("override,needle", [
    ("moe.num_experts=abc", "moe.num_experts"),
    ("comm.policy=lifo", "expected one of ['sequential', 'overlap', 'aurora'"),
    ("moe.bogus=1", "moe.bogus"),
    ("moe.top_k=3", "moe.top_k"),
    ("moe.capacity_factor=0", "moe.capacity_factor"),
    ("model.n_heads=3", "model.n_heads"),
    ("moe.group_size=7", "moe.group_size"),
    ("hardware_profile=nowhere", "allowed: ["),
    ("sweep.policy=[sequential,fifo]", "sweep.policy"),
    ("noequals", "key=value"),
    ("comm.packing_interval_iters=0", "comm.packing_interval_iters"),
])
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(overrides=[override])
    assert needle in str(err.value)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "missing.yaml"])


def test_impossible_layouts():
    assert check_layout(4, 4, 1) is None and check_layout(4, 8, 2) is None and check_layout(4, 4, 2) is None
    assert "must divide moe.num_experts" in check_layout(4, 6, 4)
    assert "must divide world_size=4" in check_layout(4, 8, 1)
    with pytest.raises(ConfigError, match="parallel.world_size"):
        load_config(overrides=["parallel.world_size=3", "moe.num_experts=4", "moe.experts_per_rank=1"])


def test_sweep_expansion_derives_experts_per_rank_and_skips_impossible_points():
    cfg = load_config(overrides=["sweep.world_size=[4]", "sweep.num_experts=[4,8]", "sweep.policy=[overlap]"])
    points, skipped = sweep_points(cfg)
    assert [p["experts_per_rank"] for p in points] == [1, 2] and not skipped
    cfg = load_config(overrides=["sweep.world_size=[4]", "sweep.num_experts=[8]", "sweep.experts_per_rank=[1,2]"])
    points, skipped = sweep_points(cfg)
    assert len(points) == 2 and len(skipped) == 2  # experts_per_rank=1 needs 8 ranks
    assert point_name(points[0]) == "ws4_e8_epr2_sequential_s0"


def test_config_is_read_only():
    cfg = load_config()
    with pytest.raises(Exception, match="read-only"):
        cfg.moe.num_experts = 2


@pytest.mark.parametrize("args", [["moe.num_experts=abc"], ["--config", "configs/none.yaml"],
                                  ["parallel.world_size=3"]])
def test_train_step_cli_rejects_bad_input_before_starting(tmp_path, args):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "experiments.train_step", f"results_dir={out}", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: config")
    assert not out.exists()


def test_switching_profile_drops_a_saved_hardware_section(tmp_path):
    from moe_core.config import save_config

    save_config(load_config(["configs/default.yaml"], ["hardware.devices_per_node=2"]), tmp_path / "resolved.yaml")
    same = load_config([tmp_path / "resolved.yaml"])
    assert same.hardware.name == "local-cpu" and same.hardware.devices_per_node == 2
    other = load_config([tmp_path / "resolved.yaml"], ["hardware_profile=lina-a100-4x4"])
    assert other.hardware.name == "lina-a100-4x4" and other.hardware.nic_GBps == 12.5


def test_saving_the_same_config_leaves_the_file_alone(tmp_path):
    """The workflow reruns what is older than the resolved config: an unchanged config must not
    move its modification time, a changed one must."""
    from moe_core.config import save_config

    path = tmp_path / "config" / "resolved.yaml"
    assert save_config(load_config(["configs/default.yaml"]), path)
    os.utime(path, (1.0, 1.0))
    assert not save_config(load_config(["configs/default.yaml"]), path) and path.stat().st_mtime == 1.0
    assert save_config(load_config(["configs/default.yaml"], ["train.iters=11"]), path)
    assert path.stat().st_mtime > 1.0 and load_config([path]).train.iters == 11
