"""The simulated training step: same decisions as the measured executor, sane timelines, records."""

import json

import numpy as np
import pytest
import torch.distributed as dist

from experiments.simulate import main as simulate_main
from moe_core.config import layout_of, load_config
from moe_core.model import MoETransformer
from moe_core.parallel import build_groups, shard_experts
from moe_core.policies import make_buckets
from moe_core.sim.step import StepModel
from moe_core.sim.topology import GB, build_topology

LINA = ["hardware_profile=lina-a100-4x4", "parallel.world_size=16", "moe.num_experts=16", "moe.experts_per_rank=1",
        "model.d_model=512", "model.d_ff=2048", "model.n_heads=8", "model.seq_len=512", "model.moe_every=1",
        "train.dtype=bfloat16"]


def step(overrides):
    cfg = load_config(overrides=overrides)
    return cfg, StepModel(cfg, build_topology(cfg.hardware)).run()


def test_buckets_are_the_measured_policys_buckets():
    """One decision, two executors: the simulator all-reduces exactly make_buckets' buckets."""
    common = ["moe.num_experts=4", "moe.experts_per_rank=4", "comm.bucket_mb=0.25", "hardware_profile=lina-a100-4x4"]
    measured_cfg = load_config(overrides=[*common, "parallel.world_size=1"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        groups = build_groups(layout_of(measured_cfg), "cpu", 60.0)
        model = MoETransformer(measured_cfg)
        shard_experts(model, groups)
        measured = [sum(p.numel() * 4 for p in b.params) for b in make_buckets(model, groups, int(0.25 * 2**20))]
    finally:
        dist.destroy_process_group()
    # Two ranks holding all 4 experts each (data parallel 2): every bucket is all-reduced.
    sim_cfg = load_config(overrides=[*common, "parallel.world_size=2"])
    ops, _ = StepModel(sim_cfg, build_topology(sim_cfg.hardware)).build()
    simulated = [op.transfer.nbytes.max() for op in ops if op.phase == "allreduce"]
    assert simulated == pytest.approx([2 * (2 - 1) / 2 * nbytes for nbytes in measured])  # ring of 2 ranks


def test_sequential_policy_exposes_the_whole_all_reduce_and_never_slows_all_to_alls():
    cfg, seq = step([*LINA, "comm.policy=sequential"])
    _, ovl = step([*LINA, "comm.policy=overlap"])
    m_seq, m_ovl = seq.metrics(), ovl.metrics()
    ar = [i for i, op in enumerate(seq.ops) if op.phase == "allreduce"]
    assert m_seq["allreduce_exposed_ms"] == pytest.approx(
        1e3 * (seq.timeline.end_s[ar[-1]] - seq.timeline.start_s[ar[0]]))
    assert m_ovl["allreduce_exposed_ms"] < m_seq["allreduce_exposed_ms"]
    assert (ovl.durations_ms(".bwd") >= seq.durations_ms(".bwd") - 1e-9).all()  # contention only slows
    assert m_seq["a2a_fwd_ms"] == pytest.approx(m_ovl["a2a_fwd_ms"])  # nothing overlaps the forward pass


def test_all_to_all_time_is_the_nic_bound_on_lina_testbed():
    cfg, sim = step([*LINA, "comm.policy=sequential", "hardware.inter_node_latency_us=0"])
    S = cfg.moe.num_experts * 1 * 640 * 512 * 2  # E * G * C * M * bf16, C = ceil(1.25 * 2 * 4096 / 16)
    per_node_inter = 4 * S * 12 / 16  # 4 GPUs per node, 12 of 16 destinations on other nodes
    a2a = [i for i, op in enumerate(sim.ops) if op.name == "L0.dispatch.fwd"][0]
    took = sim.timeline.end_s[a2a] - sim.timeline.start_s[a2a]
    assert took == pytest.approx(per_node_inter / (12.5 * GB), rel=1e-9)


def test_more_bandwidth_never_slows_the_step():
    _, base = step([*LINA, "comm.policy=overlap"])
    _, fast = step([*LINA, "comm.policy=overlap", "hardware.nic_GBps=25"])
    assert fast.timeline.makespan_s <= base.timeline.makespan_s


def test_simulate_writes_a_simulated_record_with_slowdowns(tmp_path):
    out = tmp_path / "r.json"
    assert simulate_main([*LINA, "comm.policy=overlap", f"--out={out}"]) == 0
    record = json.loads(out.read_text())
    assert record["mode"] == "simulated" and record["backend"] == "sim" and record["hardware"] == "lina-a100-4x4"
    assert record["params"]["world_size"] == 16 and record["metrics"]["step_ms"]["n"] == 1
    slowdowns = np.array(record["samples"]["a2a_bwd_slowdown"])
    assert len(slowdowns) == 2 * 4 and (slowdowns >= 1 - 1e-9).all()


def test_simulate_rejects_a_profile_without_a_network_model(tmp_path, capsys):
    assert simulate_main(["parallel.world_size=8", "moe.num_experts=8", f"results_dir={tmp_path}"]) == 2
    assert "intra_node_GBps is unknown" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
