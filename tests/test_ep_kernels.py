"""The two kernel-library dispatchers (node-deduplicated forwarding, low-latency direct sends): the
study's correctness gate on gloo under every imbalance workload, their bytes checked by hand on one
routing, and the kernel model's pricing."""

import numpy as np
import pytest
import yaml

from experiments import dispatchers
from experiments.advise import KERNEL_MODEL_ERROR
from moe_core.config.load import load_config
from moe_core.dispatch import dispatcher
from moe_core.dispatch.workloads import IMBALANCE_WORKLOADS
from moe_core.dispatch_study import study_steps

NEW = ("node-forwarding", "direct-sends")


def _gate_worker(rank, world, init_file, out_dir, devices_per_node):
    import torch
    import torch.distributed as dist

    from moe_core.runtime.distributed import Env

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    overrides = [f"dispatch_study.world_size={world}", "dispatch_study.d_model=4", "dispatch_study.tokens_per_rank=48"]
    cfg = load_config(overrides=[*overrides, f"hardware.devices_per_node={devices_per_node}"])
    paths = dispatchers.Paths(cfg, Env(rank, world, rank, torch.device("cpu"), "gloo", None, 60.0))
    wrong = {}
    for skew in ("uniform", *IMBALANCE_WORKLOADS):
        if not dispatchers.routes_on(cfg, skew, NEW[0]):
            continue
        for step in range(study_steps(skew, world)):
            w = paths.workload(skew, step)
            for name in NEW:
                wrong[skew, name] = wrong.get((skew, name), 0) + paths.wrong_rows(name, w)
    torch.save(wrong, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("world,devices_per_node", [(4, 2), (2, 8)])
def test_the_gate_passes_both_under_every_imbalance_workload(tmp_path, world, devices_per_node):
    """Two nodes of two ranks (network leg, then forwarding) and one node: every row comes back as
    its expert left it, with its exact gradient, under every workload that routes on the ranks."""
    import torch
    import torch.multiprocessing as mp

    args = (world, str(tmp_path / "init"), str(tmp_path), devices_per_node)
    mp.spawn(_gate_worker, args=args, nprocs=world, join=True)
    wrong = torch.load(tmp_path / "rank0.pt")
    assert {skew for skew, _ in wrong} >= {"uniform", "balanced", "source_ragged", "zero_expert_rank"}
    assert all(count == 0 for count in wrong.values()), wrong


def test_bytes_moved_by_hand_on_one_routing():
    """Two nodes of two ranks, top-1, 10-byte rows. Rank 0 sends 1 row to rank 1 (its node), 2 to rank 2
    and 1 to rank 3 (the other node); rank 3 sends 3 rows to rank 0. Node forwarding: rank 0's 3 rows
    for node 1 cross the network once to rank 2 (its local-index peer), which forwards 1 to rank 3;
    rank 3's 3 rows cross to rank 1 (local index 1 on node 0), which forwards them to rank 0; rank 0's
    row for rank 1 goes straight over NVLink. Direct sends: each row once, straight."""
    counts = np.zeros((4, 4))
    counts[0, 1:] = [1, 2, 1]
    counts[3, 0] = 3
    notify, forwarded, *_ = dispatcher("node-forwarding").traffic(counts, 0, 10)
    assert notify.bytes_moved(2) == 4 * 4 * 3  # an int32 count each way between every pair of ranks
    ordered, network, inside = forwarded.legs(np.arange(4), np.arange(4) // 2)
    assert network[0, 0, 1] == 30 and network[1, 1, 0] == 30 and network.sum() == 60  # (n, l, n2)
    assert inside[1, 0, 1] == 10 and inside[0, 1, 0] == 30 and inside[0, 0, 1] == 10 and inside.sum() == 50
    assert forwarded.bytes_moved(devices_per_node=2) == 110
    direct, back = dispatcher("direct-sends").traffic(counts, 0, 10)
    assert direct.bytes_moved(2) == back.bytes_moved(2) == 70


def test_a_token_crosses_the_network_once_per_destination_node():
    """Top-8 of 256 experts on 4 nodes of 8 ranks: the expected tokens per (source, node) pair that the
    traffic states match a sampled routing's exact count to 1%, and sit far below the selections."""
    rng = np.random.default_rng(0)
    tokens, ranks, experts, k, row = 4096, 32, 256, 8, 1
    choices = np.argsort(rng.random((ranks, tokens, experts)), axis=2)[:, :, :k]  # (ranks, tokens, k) distinct
    counts = np.stack([np.bincount(c.ravel() // (experts // ranks), minlength=ranks) for c in choices])
    _, forwarded, *_ = dispatcher("node-forwarding").traffic(counts, 0, row, top_k=k)
    _, network, _ = forwarded.legs(np.arange(ranks), np.arange(ranks) // 8)
    node_of_choice = choices // (experts // 4)  # (ranks, tokens, k)
    own = (np.arange(ranks) // 8)[:, None, None]
    exact = sum(((node_of_choice == n).any(axis=2) & (own[:, :, 0] != n)).sum() for n in range(4))
    selections = (node_of_choice != own).sum()
    assert network.sum() == pytest.approx(exact, rel=0.01) and exact < 0.6 * selections


def test_the_profile_kernel_parameters_are_the_stated_fit_and_the_simulator_prices_them():
    """h800-cx7-cluster's ep_kernels are the one fit over analysis/external_dispatch.yaml (to the digits the
    profile gives), and the simulator's time of every entry is the closed form the fit uses."""
    from experiments import external_dispatch as ed

    cases = ed.entry_cases()
    fit = ed.fit_kernel_parameters(cases)
    hw = cases[0][1]
    assert (hw.ep_kernels.nvlink_efficiency, hw.ep_kernels.nic_efficiency) == pytest.approx(
        (fit.nvlink_efficiency, fit.nic_efficiency), abs=5e-4
    )
    assert hw.ep_kernels.latency_us == pytest.approx(fit.latency_us, abs=0.05)
    for entry, hw, case in cases:
        simulated = ed.kernel_seconds(entry, hw, case)
        closed = ed.lone_seconds(
            case, hw, *(hw.ep_kernels[k] for k in ("nvlink_efficiency", "nic_efficiency", "latency_us"))
        )
        assert simulated == pytest.approx(closed, rel=1e-5), entry["id"]  # the notify's bytes: ~1e-6 of it


def test_the_kernel_level_table_meets_the_target_in_and_out_of_sample(tmp_path):
    """Every DeepEP number predicted on the profile as it is: the records' errors are their predictions'
    against the published numbers, the median |error| in-sample and leave-one-out is within the 15%
    target, and the table ends with the median and worst rows, its bandwidths labelled by kind."""
    import analysis.papers  # noqa: F401  (registers the tables)
    from analysis.collect import collect
    from analysis.registry import TABLE_REGISTRY
    from experiments import external_dispatch as ed
    from moe_core.records.results import write_records

    records = ed.external_dispatch_records(load_config(whole_run=False))
    assert [r["point"] for r in records] == [e["id"] for e in ed.load_entries()]
    for r in records:
        m = {name: metric["value"] for name, metric in r["metrics"].items()}
        assert m["rel_error"] == pytest.approx(m["predicted"] / m["published"] - 1)
    df = TABLE_REGISTRY["external_dispatch"].build(collect(write_records(records, tmp_path))[0])
    summary = df.set_index("id").loc[["median", "worst"]]
    assert summary.loc["median", "rel_error"] <= 0.15 and summary.loc["median", "loo_rel_error"] <= 0.15
    assert summary.loc["worst", "loo_rel_error"] == pytest.approx(df["loo_rel_error"].iloc[:-2].abs().max())
    # the error advise quotes for its margin (experiments.advise) is at least the table's
    assert abs(summary.loc["worst", "loo_rel_error"]) <= KERNEL_MODEL_ERROR
    assert "logical_GBps [logical (the library's count)]" in df and "nic_wire_GBps [wire (busiest NIC)]" in df


def test_bad_kernel_tables_and_profiles_are_refused_by_name(tmp_path):
    from experiments import external_dispatch as ed
    from moe_core.config.load import ConfigError

    entry = ed.load_entries()[0]
    for change, message in (
        ({"kernel": "nccl"}, "unknown kernel 'nccl'"),
        ({"metric": "busbw_GBps"}, "unknown metric 'busbw_GBps'"),
        ({"workload": {**entry["workload"], "format": "fp4"}}, "format must be one of"),
        ({"published": 0}, "published must be a positive number"),
    ):
        path = tmp_path / "table.yaml"
        path.write_text(yaml.safe_dump({"entries": [{**entry, **change}]}))
        with pytest.raises(ValueError, match=message):
            ed.load_entries(path)
    with pytest.raises(ConfigError, match=r"hardware\.ep_kernels\.nic_efficiency"):
        load_config(overrides=["hardware.ep_kernels.nic_efficiency=1.5"])
    with pytest.raises(ConfigError, match=r"hardware\.ep_kernels': give all of .* got only \['nic_efficiency'\]"):
        load_config(overrides=["hardware.ep_kernels.nic_efficiency=0.5"])
