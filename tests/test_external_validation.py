"""experiments/external_validation.py: the simulator against published hardware measurements (no torch work)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

import analysis.papers  # noqa: F401  (registers the tables)
from analysis.collect import collect
from analysis.registry import TABLE_REGISTRY
from experiments import external_validation as ev
from experiments.__main__ import main as run_entry_point
from experiments.advise import COLLECTIVE_MODEL_ERROR
from moe_core.config.load import CONFIG_DIR, load_config
from moe_core.records.results import record_path, write_record
from moe_core.sim.topology import build_topology


@pytest.fixture(scope="module")
def cfg():
    return load_config([CONFIG_DIR / "default.yaml"])


@pytest.fixture(scope="module")
def entries():
    with open(ev.HARDWARE_FILE) as f:
        return yaml.safe_load(f)["entries"]


def test_every_entry_simulates_into_a_record(tmp_path, entries):
    assert (
        run_entry_point(
            ["external_validation", "--config", str(CONFIG_DIR / "default.yaml"), f"results_dir={tmp_path}"]
        )
        == 0
    )
    for entry in entries:
        path = record_path(tmp_path, ev.PAPER, ev.EXPERIMENT, entry["id"])
        record = json.loads(path.read_text())
        assert (record["mode"], record["backend"], record["hardware"]) == ("simulated", "sim", entry["profile"])
        metrics = {name: stats["value"] for name, stats in record["metrics"].items()}
        assert math.isfinite(metrics["predicted"]) and metrics["predicted"] > 0
        assert metrics["published"] == entry["published"]
        assert metrics["rel_error"] == pytest.approx(metrics["predicted"] / entry["published"] - 1)
        assert metrics["published_low"] <= metrics["published"] <= metrics["published_high"]


def test_record_points_are_the_files_ids(cfg, entries):
    ids = [entry["id"] for entry in entries]
    assert ev.record_points(cfg) == ids and len(set(ids)) == len(ids)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"])
def test_busbw_of_two_ranks_on_one_link_is_the_link_bandwidth(collective):
    """2 ranks, one NVLink port each way, no latency: every collective moves (n-1)/n x size (2(n-1)/n for
    all-reduce) over the port, and the bus factor undoes exactly that."""
    hw = load_config(
        overrides=[
            "hardware_profile=h100-ndr-cluster",
            "hardware.nodes=1",
            "hardware.devices_per_node=2",
            "hardware.nics_per_node=2",
            "hardware.intra_node_latency_us=0",
        ]
    ).hardware
    # At the all-to-all curve's largest size, where it reaches the profile's share of the link
    size, link_GBps = 2**34, hw.intra_node_GBps * hw.intra_node_efficiency  # the rate NCCL reaches on it
    seconds = ev.collective_seconds(hw, build_topology(hw), collective, 2, size)
    factor = 1.0 if collective == "all_reduce" else 0.5
    assert seconds == pytest.approx(factor * size / (link_GBps * 1e9))
    assert ev.bus_bandwidth_GBps(collective, 2, size, seconds) == pytest.approx(link_GBps)


def test_nic_bandwidth_of_a_multi_node_all_to_all_is_the_nics_achieved_rate():
    """Without latency, a uniform all-to-all across nodes is NIC-bound: one NIC carries what NCCL reaches
    on it (line rate x the profile's published share)."""
    overrides = ["hardware_profile=h100-ndr-cluster", "hardware.nodes=3", "hardware.inter_node_latency_us=0"]
    hw = load_config(overrides=overrides).hardware
    seconds = ev.collective_seconds(hw, build_topology(hw), "all_to_all", 24, 1e9)
    assert ev.nic_GBps(hw, 24, 1e9, seconds) == pytest.approx(hw.nic_GBps * hw.nic_efficiency)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_deepep_routing_without_a_node_limit_is_uniform_top_k(nodes):
    """With every node a group, the top 8 of 256 experts are a uniform random subset: a rank holding e experts is
    missed with probability C(256 - e, 8) / C(256, 8), a node holding 256 / nodes likewise."""
    ranks, experts, k = 8 * nodes, 256, 8
    workload = {"top_k": k, "topk_groups": nodes, "num_experts": experts}
    routing = ev.deepep_routing(workload, ranks, nodes)
    missed = math.comb(experts - experts // ranks, k) / math.comb(experts, k)
    node_missed = math.comb(experts - experts // nodes, k) / math.comb(experts, k)
    assert routing.rank_hit == pytest.approx(1 - missed, abs=0.005)
    assert routing.nodes == pytest.approx(nodes * (1 - node_missed), abs=0.01)
    # the network carries one copy per remote node hit; NVLink one per rank hit beyond local index 0, which
    # receives the node's copy (each of the ranks - nodes other ranks is hit with the same probability)
    assert routing.remote_nodes == pytest.approx((nodes - 1) * (1 - node_missed), abs=0.01)
    assert routing.forwarded == pytest.approx((ranks - nodes) * (1 - missed), abs=0.02)


def test_deepep_routing_reaches_about_topk_groups_nodes():
    """Node-limited routing (8 nodes, 4 groups): each chosen node's best expert nearly always makes the top 8,
    so a token reaches ~4 nodes (uniform top 8 over those 128 experts would give ~3.6), and never more."""
    routing = ev.deepep_routing({"top_k": 8, "topk_groups": 4, "num_experts": 256}, 64, 8)
    assert 3.9 < routing.nodes <= 4 and 0 < routing.rank_hit * 64 <= 8


def _file_with(tmp_path, entries, edit):
    """A copy of the shipped file's first entry, changed by ``edit(entry)``, as the only entry of a new file."""
    entry = {**entries[0]}
    edit(entry)
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    return path


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda e: e.update(profile="no-such-profile"), "unknown profile"),
        (lambda e: e.update(collective="broadcast"), "unknown collective"),
        (lambda e: e.update(kind="astra"), "unknown kind"),
        (lambda e: e.pop("source"), "missing keys"),
        (lambda e: e.update(published_low=400), "published_low <= published"),
        (lambda e: e.update(world_size=12), "world_size 12"),
    ],
)
def test_malformed_entry_names_its_id(tmp_path, cfg, entries, edit, needle):
    path = _file_with(tmp_path, entries, edit)
    with pytest.raises(ValueError, match=needle) as err:
        ev.external_records(cfg, path)
    assert repr(entries[0]["id"]) in str(err.value)


def test_table_summarises_the_median_error(tmp_path, cfg):
    paths = []
    for record in ev.external_records(cfg):
        paths.append(
            write_record(record, record_path(tmp_path, record["paper"], record["experiment"], record["point"]))
        )
    table = TABLE_REGISTRY["external_validation"].build(collect(paths)[0])
    rows, summary = table.iloc[:-1], table.iloc[-1]
    assert len(rows) == len(paths) and summary["id"] == "median"
    assert summary["abs_rel_error"] == pytest.approx(rows["rel_error"].abs().median())
    assert (rows["within_target"] == (rows["rel_error"].abs() <= 0.15)).all()
    # the error advise quotes for its margin (experiments.advise) is at least the table's worst
    assert rows["rel_error"].abs().max() <= COLLECTIVE_MODEL_ERROR
