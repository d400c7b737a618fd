"""The simulated training step: same decisions as the measured executor, sane timelines, records."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from experiments.__main__ import main as run_entry_point
from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer
from moe_core.model.transformer import MoETransformer
from moe_core.parallel.layout import layout_of
from moe_core.parallel.parallelize import build_groups, parallelize_model
from moe_core.schedule.executor import executor_class, make_policy
from moe_core.schedule.gradients import layout_plan
from moe_core.schedule.plan import gradient_micro_ops
from moe_core.schedule.policies import policy_spec
from moe_core.schema.points import parse_setting, sim_points
from moe_core.sim.collectives import SizeCurve
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology
from moe_core.units import GB

LINA = [
    "hardware_profile=lina-a100-4x4",
    "parallel.world_size=16",
    "moe.num_experts=16",
    "moe.experts_per_rank=1",
    "model.d_model=512",
    "model.d_ff=2048",
    "model.n_heads=8",
    "model.seq_len=512",
    "model.moe_every=1",
    "train.dtype=bfloat16",
]


def step(overrides):
    cfg = load_config(overrides=overrides)
    return cfg, StepModel(cfg, build_topology(cfg.hardware)).run()


def test_buckets_are_the_measured_policys_buckets():
    """One decision, two executors: the simulator all-reduces exactly the measured policy's buckets."""
    common = ["moe.num_experts=4", "moe.experts_per_rank=4", "comm.bucket_mb=0.25", "hardware_profile=lina-a100-4x4"]
    measured_cfg = load_config(overrides=[*common, "parallel.world_size=1"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        groups = build_groups(layout_of(measured_cfg), "cpu", 60.0)
        model = MoETransformer(measured_cfg, dropless=routes_dropless(measured_cfg))
        parallelize_model(model, groups)
        policy = make_policy(measured_cfg, layout_plan(measured_cfg, groups.layout, 4), groups, PhaseTimer())
        policy.attach(model)
        measured = [sum(p.numel() * 4 for p in unit.params) for unit in policy.gradient_units]
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
        1e3 * (seq.timeline.end_s[ar[-1]] - seq.timeline.start_s[ar[0]])
    )
    assert m_ovl["allreduce_exposed_ms"] < m_seq["allreduce_exposed_ms"]
    assert (ovl.durations_ms(".bwd") >= seq.durations_ms(".bwd") - 1e-9).all()  # contention only slows
    assert m_seq["a2a_fwd_ms"] == pytest.approx(m_ovl["a2a_fwd_ms"])  # nothing overlaps the forward pass


def test_all_to_all_time_is_the_nic_bound_at_the_curves_share_on_lina_testbed():
    cfg, sim = step([*LINA, "comm.policy=sequential", "hardware.inter_node_latency_us=0"])
    S = cfg.moe.num_experts * 1 * 640 * 512 * 2  # E * G * C * M * bf16, C = ceil(1.25 * 2 * 4096 / 16)
    per_node_inter = 4 * S * 12 / 16  # 4 GPUs per node, 12 of 16 destinations on other nodes
    a2a = [i for i, op in enumerate(sim.ops) if op.name == "L0.dispatch0.fwd"][0]
    took = sim.timeline.end_s[a2a] - sim.timeline.start_s[a2a]
    nic_Bps = 12.5 * GB * cfg.hardware.nic_efficiency  # the share of line rate NCCL reaches at large sizes
    share = SizeCurve.load(cfg.hardware.all_to_all_curve).relative_share(S, nodes=4)
    assert share == pytest.approx(0.67 / 0.95)  # 10 MiB: below the curve, held at 16 MiB's share
    assert took == pytest.approx(per_node_inter / (nic_Bps * share), rel=1e-9)


def test_more_bandwidth_never_slows_the_step():
    _, base = step([*LINA, "comm.policy=overlap"])
    _, fast = step([*LINA, "comm.policy=overlap", "hardware.nic_GBps=25"])
    assert fast.timeline.makespan_s <= base.timeline.makespan_s


def test_simulate_writes_a_simulated_record_with_slowdowns(tmp_path):
    out = tmp_path / "r.json"
    assert run_entry_point(["simulate", *LINA, "comm.policy=overlap", f"--out={out}"]) == 0
    record = json.loads(out.read_text())
    assert record["mode"] == "simulated" and record["backend"] == "sim" and record["hardware"] == "lina-a100-4x4"
    assert record["params"]["world_size"] == 16 and record["metrics"]["step_ms"]["n"] == 1
    slowdowns = np.array(record["samples"]["a2a_bwd_slowdown"])
    # only the backward all-to-alls an all-reduce overlaps: some of the 2 x 4, never under sequential
    assert 0 < len(slowdowns) < 2 * 4 and (slowdowns >= 1 - 1e-9).all()
    _, overlapped = step([*LINA, "comm.policy=overlap"])
    assert overlapped.overlapping(".bwd", "allreduce").sum() == len(slowdowns)
    _, sequential = step([*LINA, "comm.policy=sequential"])
    assert not sequential.overlapping(".bwd", "allreduce").any()


SMALL_SWEEPS = """
sim_sweep: {hardware: [lina-a100-4x4], world_size: [8], policy: [overlap], experts_per_rank: 1,
            overrides: [model.d_model=256, model.d_ff=1024, model.moe_every=1]}
lina: {hardware: lina-a100-4x4, experts: [2], policy: [overlap, lina], partition_mb: [10],
       overrides: [model.d_model=256, model.d_ff=1024, model.moe_every=1]}
monta: {sim_tensor_parallel: [], hierarchical_nodes: []}
"""


def test_simulate_sweep_writes_every_point_once_or_nothing(tmp_path):
    sweeps = tmp_path / "sweeps.yaml"
    sweeps.write_text(SMALL_SWEEPS)
    args = ["--config", "configs/default.yaml", "--config", str(sweeps), f"results_dir={tmp_path}"]
    assert run_entry_point(["simulate", *args, "--sweep"]) == 0
    points = sim_points(load_config(["configs/default.yaml", str(sweeps)]))
    # ws8 overlap; 2 experts x (overlap, lina), and both again at the 13 settings of Lina's unstated
    # parameters' joint design (5 ends one at a time, 8 corners); lina at 10 MB micro-ops
    assert len(points) == 1 + 2 * (1 + 13) + 1
    for name, (paper, overrides) in points.items():
        record = json.loads((tmp_path / "raw" / paper / "sim_train_step" / f"{name}.json").read_text())
        assert record["point"] == name and record["mode"] == "simulated"
        setting = next((o.split("=", 1)[1] for o in overrides if o.startswith("unstated=")), None)
        assert record["params"].get("unstated") == setting
        link = parse_setting(setting or "x=0").get("hardware.intra_node_GBps", 25.0)
        assert record["config"]["hardware"]["intra_node_GBps"] == link
        assert record["config"]["hardware"]["intra_node"] == ("switch" if link == 240 else "pcie_tree")
    # one point without a network model: an error, and no record of any point
    bad = tmp_path / "bad"
    assert run_entry_point(["simulate", *args, f"results_dir={bad}", "sim_sweep.hardware=[local-cpu]", "--sweep"]) == 2
    assert not [p for p in bad.rglob("*") if p.is_file()]  # (the up-front writability check made the directory)


def test_simulate_rejects_a_profile_without_a_network_model(tmp_path, capsys):
    assert run_entry_point(["simulate", "parallel.world_size=8", "moe.num_experts=8", f"results_dir={tmp_path}"]) == 2
    assert "intra_node_GBps is unknown" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_lina_priority_keeps_the_backward_all_to_all_uncontended():
    _, seq = step([*LINA, "comm.policy=sequential"])
    _, ovl = step([*LINA, "comm.policy=overlap"])
    _, lina = step([*LINA, "comm.policy=lina-priority"])
    assert (ovl.durations_ms(".bwd") > seq.durations_ms(".bwd") + 1e-6).any()  # DDP's all-reduce contends
    np.testing.assert_allclose(lina.durations_ms(".bwd"), seq.durations_ms(".bwd"), rtol=1e-9)
    assert lina.timeline.makespan_s < ovl.timeline.makespan_s


def test_lina_partition_all_reduces_exactly_the_measured_micro_ops():
    """One decision, two executors: gradient micro-ops come from lina.gradient_micro_ops."""
    cfg, sim = step(
        [*LINA, "comm.policy=lina-partition", "comm.partition_mb=1", "moe.experts_per_rank=2", "parallel.world_size=8"]
    )
    with torch.device("meta"):
        named = list(reversed(list(MoETransformer(cfg, dropless=routes_dropless(cfg)).named_parameters())))
    dense = [p.numel() for n, p in named if ".experts." not in n]  # experts: data parallel 1, nothing to reduce
    expected = np.array([(stop - start) * 2 for _, start, stop in gradient_micro_ops(dense, 2, 2**20)], float)
    assert expected.max() <= 2**20 and len(expected) > len(dense)
    nic = build_topology(cfg.hardware).nic_out[0]  # node 0's one NIC: every byte the ring sends off the node
    rings = [op.transfer for op in sim.ops if op.phase == "allreduce"]
    loads = np.array([t.nbytes[t.links == nic].sum() for t in rings])
    assert len(loads) == len(expected)
    np.testing.assert_allclose(loads / expected, 2 * 7 / 8, rtol=1e-9)  # a ring moves 2(p-1)/p of each


@pytest.mark.parametrize(("backend", "in_flight"), [("nccl", 1), ("gloo", 2)])
@pytest.mark.parametrize("policy", ["overlap", "sequential"])
def test_queued_gradient_all_reduces_run_as_many_at_once_as_the_backend(backend, in_flight, policy):
    """Units launched as their gradients are ready are queued without waiting: NCCL runs them in order
    on its stream, gloo's two worker threads two at a time. Units launched after the backward pass
    are each waited for, on any backend."""
    cfg = load_config(
        overrides=[
            *LINA,
            f"comm.policy={policy}",
            "comm.bucket_mb=0.25",
            "parallel.world_size=4",
            "moe.num_experts=4",
            f"hardware.backend={backend}",
        ]
    )
    ops, _ = StepModel(cfg, build_topology(cfg.hardware)).build()
    units = [i for i, op in enumerate(ops) if op.phase == "allreduce"]
    assert len(units) > 4
    waits = in_flight if policy == "overlap" else 1
    for k, i in enumerate(units[waits:], start=waits):
        earlier = [d for d in ops[i].deps if d in units]
        assert earlier == [units[k - waits]], (k, ops[i].deps)


def test_lina_pipelining_hides_expert_time_behind_the_exchange():
    _, partitioned = step([*LINA, "comm.policy=lina-partition", "comm.partition_mb=1"])
    _, pipelined = step([*LINA, "comm.policy=lina-pipeline", "comm.partition_mb=1"])

    def forward_moe_s(sim, layer):
        idx = [
            i
            for i, op in enumerate(sim.ops)
            if op.name.startswith(f"L{layer}.")
            and op.name.endswith(".fwd")
            and op.phase in ("dispatch_a2a", "expert", "combine_a2a")
        ]
        return sim.timeline.end_s[idx].max() - sim.timeline.start_s[idx].min()

    assert forward_moe_s(pipelined, 0) < forward_moe_s(partitioned, 0)
    assert pipelined.timeline.makespan_s < partitioned.timeline.makespan_s


def test_lina_packing_shrinks_the_expert_parallel_group_until_ffn_outweighs_all_to_all():
    cfg = load_config(overrides=[*LINA, "comm.policy=lina-pack"])
    packed = StepModel(cfg, build_topology(cfg.hardware))
    assert packed.layout.experts_per_rank > 1 and 16 % packed.layout.experts_per_rank == 0
    # a 1000x faster network: the all-to-all never outweighs the FFN, nothing is packed
    fast = load_config(
        overrides=[*LINA, "comm.policy=lina-pack", "hardware.nic_GBps=12500", "hardware.intra_node_GBps=300000"]
    )
    assert StepModel(fast, build_topology(fast.hardware)).layout.experts_per_rank == 1


def test_moe_layer_wall_time_per_pass_counts_pipelined_experts_once():
    _, ovl = step([*LINA, "comm.policy=overlap"])
    m = ovl.metrics()

    def copies_inside(sim) -> float:
        """The copy each pass makes between a layer's MoE ops: forward the permute before the
        dispatch, backward its mirror after the dispatch's backward."""
        return sum(sim.durations_ms("copy_before.fwd", "copy")) + sum(sim.durations_ms("copy_after.bwd", "copy"))

    # no pipelining: each layer's ops run one after another, so its wall time is the sum of its MoE
    # ops' times and of those copies
    assert copies_inside(ovl) > 0
    assert m["moe_layer_fwd_ms"] + m["moe_layer_bwd_ms"] == pytest.approx(m["moe_layer_ms"] + copies_inside(ovl))
    fwd_ops = sum(
        1e3 * (e - s)
        for op, s, e in zip(ovl.ops, ovl.timeline.start_s, ovl.timeline.end_s)
        if op.phase in ("gate", "dispatch_a2a", "expert", "combine_a2a") and op.name.endswith(".fwd")
    )
    assert m["moe_layer_fwd_ms"] == pytest.approx(fwd_ops + sum(ovl.durations_ms("copy_before.fwd", "copy")))
    wall = m["moe_layer_fwd_ms"] + m["moe_layer_bwd_ms"]
    assert m["moe_compute_share"] == pytest.approx((m["gate_ms"] + m["expert_ms"]) / wall)
    _, piped = step([*LINA, "comm.policy=lina-pipeline", "comm.partition_mb=1"])
    p = piped.metrics()
    # experts hidden behind all-to-alls: the wall time is the phases' (all-to-alls as the compute stream's
    # wait) and less than the ops' own times (all-to-alls in flight)
    # (and, of the copies that cut the exchanges into micro-ops and join them, those inside the layer:
    # forward the cut after the gate, backward the join before the gate's backward)
    wall = p["moe_layer_fwd_ms"] + p["moe_layer_bwd_ms"]
    cuts = sum(piped.durations_ms("partition.fwd", "partition")) + sum(piped.durations_ms("concat.bwd", "partition"))
    inside = copies_inside(piped) + cuts
    assert cuts > 0 and wall == pytest.approx(p["moe_layer_ms"] + inside)
    assert wall < p["gate_ms"] + p["expert_ms"] + p["a2a_in_flight_ms"] + inside - p["expert_ms"] / 2
    assert 0 < m["moe_compute_share"] < p["moe_compute_share"] <= 1


def test_all_to_all_time_is_the_compute_streams_wait_for_it():
    """Like the measured timer: without pipelining the all-to-alls' own time; with it, time hidden
    behind expert micro-ops or shared by micro-ops in flight together is counted once."""

    def own_ms(sim):
        return sum(
            1e3 * (e - s)
            for op, s, e in zip(sim.ops, sim.timeline.start_s, sim.timeline.end_s)
            if op.phase.endswith("a2a")
        )

    for policy, hidden in [("comm.policy=sequential", False), ("comm.policy=lina-pipeline", True)]:
        _, sim = step([*LINA, policy, "comm.partition_mb=1"])
        m = sim.metrics()
        assert m["dispatch_a2a_ms"] + m["combine_a2a_ms"] == pytest.approx(m["a2a_ms"])
        assert m["a2a_fwd_ms"] + m["a2a_bwd_ms"] == pytest.approx(m["a2a_ms"])
        assert 0 < m["a2a_share"] < 1
        if hidden:
            assert m["a2a_ms"] < own_ms(sim)
            assert 0 < m["a2a_pipelining_efficiency"] < 1
        else:
            assert m["a2a_ms"] == pytest.approx(own_ms(sim))
            assert m["a2a_pipelining_efficiency"] == pytest.approx(0.0, abs=1e-9)  # nothing computes meanwhile
        assert m["a2a_in_flight_ms"] >= m["a2a_ms"]
        # everything the compute stream waits for: at least the all-to-alls and the exposed all-reduce tail
        assert max(m["a2a_ms"], m["allreduce_exposed_ms"]) <= m["exposed_comm_ms"] <= m["step_ms"]
        assert m["exposed_comm_share"] == pytest.approx(m["exposed_comm_ms"] / m["step_ms"])


MONTA = [
    "hardware_profile=monta-a800-2x8",
    "parallel.world_size=16",
    "moe.num_experts=2",
    "moe.experts_per_rank=1",
    "moe.top_k=1",
    "model.d_model=2048",
    "model.d_ff=8192",
    "model.n_heads=16",
    "model.seq_len=4096",
    "model.moe_every=1",
    "train.batch_size=1",
    "train.dtype=bfloat16",
    "parallel.tensor_parallel=8",  # ep 2 across the two nodes, tp within each
]


def test_tensor_parallel_dispatches_move_duplicates_or_gather_them():
    """duplicate sends tp x the all-to-all bytes; drop-gather sends 1/tp and all-gathers; chunks split both."""
    _, duplicate = step([*MONTA, "moe.dispatcher=duplicate"])
    _, drop = step([*MONTA, "moe.dispatcher=drop-gather"])
    _, chunked = step([*MONTA, "moe.dispatcher=monta", "comm.tp_chunks=4"])
    a2a_only = [op for op in drop.ops if op.name.startswith("L0.dispatch0c") and op.name.endswith(".fwd")]
    assert len(a2a_only) == 1  # one chunk: one all-to-all, then one all-gather (L0.dispatch0ag0.fwd)
    assert [op.name for op in chunked.ops if op.name.startswith("L0.dispatch0ag") and op.name.endswith(".fwd")] == [
        f"L0.dispatch0ag{j}.fwd" for j in range(4)
    ]
    sent = {
        name: sum(
            op.transfer.nbytes.sum()
            for op in sim.ops
            if op.name.startswith("L0.dispatch0c") and op.name.endswith(".fwd")
        )
        for name, sim in (("drop", drop), ("chunked", chunked))
    }
    whole = sum(op.transfer.nbytes.sum() for op in duplicate.ops if op.name == "L0.dispatch0.fwd")
    assert whole == pytest.approx(8 * sent["drop"]) and sent["chunked"] == pytest.approx(sent["drop"])
    # the inter-node all-to-all is the bottleneck: dropping duplicates cuts it, pipelining hides the gathers
    a2a = {name: sim.metrics()["a2a_ms"] for name, sim in (("dup", duplicate), ("drop", drop), ("chunked", chunked))}
    assert a2a["dup"] > 3 * a2a["drop"] and a2a["chunked"] < a2a["drop"]
    # compute does not depend on the dispatch
    expert_ms = duplicate.metrics()["expert_ms"]
    assert drop.metrics()["expert_ms"] == pytest.approx(expert_ms) == chunked.metrics()["expert_ms"]


def test_tensor_parallel_splits_compute_and_reduces_activations_over_tp():
    cfg, tp8 = step(MONTA)
    tp1_overrides = ["parallel.tensor_parallel=1", "parallel.world_size=2"]
    _, tp1 = step([*MONTA, *tp1_overrides])
    # the expert FLOPs are split 8 ways, not the kernel launches, and the narrower GEMMs run less efficiently
    assert tp1.metrics()["expert_ms"] / 8 < tp8.metrics()["expert_ms"] < tp1.metrics()["expert_ms"]
    flops_only = ["hardware.kernel_launch_us=0", "hardware.memory_GBps=0"]  # the constant-efficiency model
    assert step([*MONTA, *flops_only])[1].metrics()["expert_ms"] == pytest.approx(
        step([*MONTA, *tp1_overrides, *flops_only])[1].metrics()["expert_ms"] / 8
    )
    reduces = [op for op in tp8.ops if op.phase == "tp_allreduce"]
    # per layer: attention's g forward and f backward, the experts' g forward and f backward
    assert len(reduces) == 4 * cfg.model.n_layers
    assert not [op for op in tp1.ops if op.phase == "tp_allreduce"]


def test_hierarchical_all_to_all_runs_in_two_phases_only_across_nodes():
    base = ["hardware_profile=monta-a800-2x8", "parallel.world_size=16", "moe.num_experts=16", "moe.experts_per_rank=1"]
    _, flat = step(base)
    _, hier = step([*base, "moe.dispatcher=hierarchical"])
    names = [op.name for op in hier.ops if op.phase == "dispatch_a2a" and op.name.startswith("L1.")]
    assert names == ["L1.dispatch0.fwd", "L1.dispatch0.fwd", "L1.dispatch0.bwd", "L1.dispatch0.bwd"]
    intra, inter = [op.transfer for op in hier.ops if op.name == "L1.dispatch0.fwd"]
    assert not intra.crosses_nodes and inter.crosses_nodes
    # the same bytes leave each node; the second phase sends them in one message per node pair
    flat_op = next(op for op in flat.ops if op.name == "L1.dispatch0.fwd")
    assert inter.steps == 1 < flat_op.transfer.steps
    _, one_node = step([*base[:1], "parallel.world_size=8", "moe.num_experts=8", "moe.dispatcher=hierarchical"])
    assert len([op for op in one_node.ops if op.name == "L1.dispatch0.fwd"]) == 1


def test_micro_ops_cost_their_copies_and_latencies():
    """Cutting the pipelined all-to-alls into micro-ops adds the copies out of and back into one buffer
    (nothing without micro-ops); cutting the gradients adds a latency per micro-op to their all-reduces
    alone, which equal the units' stand-alone times one after another."""
    lina = [*LINA, "comm.policy=lina-pipeline"]
    _, whole = step([*lina, "comm.partition_mb=1000"])
    _, cut = step([*lina, "comm.partition_mb=0.25"])
    copies = whole.metrics()["partition_ms"], cut.metrics()["partition_ms"]
    assert copies[0] == 0 and copies[1] > 0
    assert cut.metrics()["allreduce_alone_ms"] > whole.metrics()["allreduce_alone_ms"]
    cfg, sim = step([*LINA, "comm.policy=overlap"])
    model = StepModel(cfg, build_topology(cfg.hardware))
    units = [op for op in sim.ops if op.phase == "allreduce"]
    alone = sum(model._alone_seconds([replace(op, deps=[])], "allreduce") for op in units)
    assert sim.metrics()["allreduce_alone_ms"] == pytest.approx(alone * 1e3, rel=1e-9)


def test_a_scheduling_rule_is_the_class_both_executors_call(monkeypatch):
    """The simulated step takes its gradient sync from the class the measured run executes the
    policy with: a rule that overrides it (here: every unit waits for the backward pass, as
    ``sequential`` launches) changes the simulated step, with the plan unchanged."""
    rule = executor_class(policy_spec("overlap"))
    _, overlapped = step([*LINA, "comm.policy=overlap"])
    assert overlapped.overlapping(".bwd", "allreduce").any()

    def after_backward(cls, dag, grads_ready, after_backward):
        issued = []
        for k, unit in enumerate(dag.step.plan.gradient_units):
            if (cost := dag.gradient_cost(unit)) is not None:
                issued.append(dag.add(f"allreduce{k}", "allreduce", [*after_backward, *issued[-1:]], **cost))
        return issued[-1:]

    monkeypatch.setattr(rule, "simulate_gradient_sync", classmethod(after_backward))
    _, waited = step([*LINA, "comm.policy=overlap"])
    assert not waited.overlapping(".bwd", "allreduce").any()
    assert waited.metrics()["step_ms"] > overlapped.metrics()["step_ms"]
