"""Every hardware profile in configs/hardware/ loads through the schema and is self-consistent."""

import math

import pytest
from omegaconf import OmegaConf

from moe_core.config.load import CONFIG_DIR, ConfigError, hardware_profile, load_config

PROFILES = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))


def test_profiles_exist():
    assert "local-cpu" in PROFILES and len(PROFILES) > 1


@pytest.mark.parametrize("name", PROFILES)
def test_profile_loads_and_is_consistent(name):
    hw = load_config(overrides=[f"hardware_profile={name}"]).hardware
    devices = hw.nodes * hw.devices_per_node
    # The file's own `name` (not the schema default) must match its stem.
    raw = OmegaConf.load(CONFIG_DIR / "hardware" / f"{name}.yaml")
    assert raw.get("name") == name and hw.name == name
    assert hw.nodes >= 1 and hw.devices_per_node >= 1
    for key in ("intra_node_GBps", "nic_GBps", "intra_node_latency_us", "inter_node_latency_us", "peak_tflops"):
        assert hw[key] >= 0, key
    assert 0 < hw.compute_efficiency <= 1 and hw.oversubscription >= 1 and hw.nics_per_node >= 1
    if hw.topology == "cluster" and hw.nodes > 1:
        assert hw.nic_GBps > 0, "a multi-node cluster needs nic_GBps > 0"
    if hw.topology == "torus2d":
        assert len(hw.torus_dims) == 2 and math.prod(hw.torus_dims) == devices
        assert hw.intra_node_GBps > 0, "torus2d: intra_node_GBps is the per-link bandwidth"
    if hw.gpu_classes:
        assert sum(c.count for c in hw.gpu_classes) == devices
        assert all(c.nic_GBps > 0 and c.peak_tflops > 0 for c in hw.gpu_classes)


@pytest.mark.parametrize("header", ["", "name:\n", "name: ''\n"], ids=["no name", "null name", "empty name"])
def test_a_profile_without_a_name_is_named_after_its_file(tmp_path, header):
    """Never the schema's default (this machine's local-cpu): its records would be filed under it."""
    path = tmp_path / "my-cluster.yaml"
    path.write_text(f"{header}nodes: 2\ndevices_per_node: 8\n")
    assert load_config(overrides=[f"hardware_profile={path}"]).hardware.name == "my-cluster"
    assert hardware_profile(str(path)).name == "my-cluster"


def test_an_unnamed_profile_whose_file_name_is_no_name_is_refused(tmp_path):
    path = tmp_path / "my cluster.yaml"
    path.write_text("nodes: 2\n")
    with pytest.raises(ConfigError, match=r"key 'hardware.name': profile '.*my cluster.yaml' sets none.*add one"):
        load_config(overrides=[f"hardware_profile={path}"])


def test_paper_testbed_values():
    """Spot checks of the bits-to-bytes conversions and the paper facts the profiles encode."""
    hw = {
        n: load_config(overrides=[f"hardware_profile={n}"]).hardware
        for n in (
            "lina-a100-4x4",
            "gshard-tpuv3-torus",
            "axonn-perlmutter",
            "aurora-bigswitch-hetero",
            "h100-ndr-cluster",
        )
    }
    assert (
        hw["lina-a100-4x4"].nic_GBps == 100 / 8
        and hw["lina-a100-4x4"].nodes * hw["lina-a100-4x4"].devices_per_node == 16
    )
    assert hw["gshard-tpuv3-torus"].nodes == 2048 // 2  # 2048 TPU v3 cores = 1024 chips
    assert hw["axonn-perlmutter"].nodes * hw["axonn-perlmutter"].devices_per_node == 1024
    assert [c.nic_GBps for c in hw["aurora-bigswitch-hetero"].gpu_classes] == [g / 8 for g in (100, 80, 50, 40)]
    assert hw["h100-ndr-cluster"].nic_GBps == 400 / 8
