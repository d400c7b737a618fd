"""An asynchronous device under one host thread (moe_core.sim.engine.issued_by_host): launches cost
nothing while the host runs ahead and all of their time where it falls behind; GPU steps use it,
CPU steps keep every launch in series."""

import numpy as np
import pytest

from moe_core.config.load import load_config
from moe_core.sim.engine import Op, issued_by_host, simulate
from moe_core.sim.step import StepModel
from moe_core.sim.topology import Transfer, build_topology

LINK = np.array([1.0])  # one link of 1 B/s: a transfer of b bytes takes b seconds


def makespan(ops: list[Op], issue_s: list[float]) -> float:
    issued, _ = issued_by_host(ops, issue_s)
    return simulate(issued, LINK).makespan_s


def test_a_host_bound_chain_takes_its_launches_and_a_device_bound_one_its_work():
    chain = [Op("a", "dense", duration_s=1.0), Op("b", "dense", [0], duration_s=1.0)]
    assert makespan(chain, [5.0, 5.0]) == pytest.approx(10.0)  # the host's launches; serial: 12
    heavy = [Op("a", "dense", duration_s=10.0), Op("b", "dense", [0], duration_s=10.0)]
    assert makespan(heavy, [1.0, 1.0]) == pytest.approx(20.0)  # the device's work; serial: 22


def test_an_op_lasts_until_its_last_launch_as_its_cuda_events_would_say():
    ops = [Op("big", "dense", duration_s=10.0), Op("gate", "gate", [0], duration_s=0.5)]
    issued, where = issued_by_host(ops, [1.0, 20.0])  # the gate: many tiny kernels, 20 s to launch
    timeline = simulate(issued, LINK)
    gate = where[1]
    # the gate may start once its first kernel is issued (t = 1), but ends with its last launch (t = 21)
    assert timeline.start_s[gate] == pytest.approx(10.0)
    assert timeline.end_s[gate] == pytest.approx(21.0)


def test_the_host_waits_for_the_device_only_where_it_reads_device_data():
    transfer = Transfer(np.array([0]), np.array([2.0]), 1, False)
    ops = [
        Op("gate", "gate", duration_s=10.0),
        Op("dispatch", "dispatch_a2a", [0], transfer=transfer),
        Op("expert", "expert", [1], duration_s=1.0),
        Op("next", "dense", [2], duration_s=1.0),
    ]
    free = makespan(ops, [1.0, 0.0, 4.0, 4.0])
    ops[1].host_sync = True
    synced = makespan(ops, [1.0, 0.0, 4.0, 4.0])
    # without a sync the expert's and the next op's launches hide behind the gate and the exchange:
    # 10 + 2 + 1 + 1; with it the host launches them only once the gate is done, at t = 10, and the
    # last op ends with its last launch: 10 + 4 + 4
    assert free == pytest.approx(14.0)
    assert synced == pytest.approx(18.0)


GPU = [
    "hardware_profile=lina-a100-4x4",
    "parallel.world_size=4",
    "moe.num_experts=4",
    "model.d_model=1024",
    "model.d_ff=4096",
    "model.n_heads=16",
    "model.seq_len=1024",
    "train.dtype=bfloat16",
]


def _model(*overrides: str) -> StepModel:
    cfg = load_config(overrides=list(overrides), whole_run=False)
    return StepModel(cfg, build_topology(cfg.hardware))


@pytest.mark.parametrize("extra", [(), ("moe.dispatcher=dropless",), ("comm.policy=lina",)])
def test_a_gpu_step_lies_between_its_device_work_and_its_serial_time(extra):
    model = _model(*GPU, *extra)
    serial_ops, _ = model.build()
    serial = simulate(serial_ops, model.topo.capacity).makespan_s
    work = sum(op.duration_s for op in model._without_launches() if op.transfer is None)
    launches = sum(op.duration_s for op in serial_ops if op.transfer is None) - work
    sim = model.run()
    host = [op for op in sim.ops if op.on_host]
    assert host and sum(op.duration_s for op in host) == pytest.approx(launches)
    assert max(work, launches) <= sim.timeline.makespan_s * (1 + 1e-9) <= serial * (1 + 1e-9)
    m = sim.metrics()
    parts = m["dense_ms"] + m["moe_layer_ms"] + m["allreduce_exposed_ms"] + m["param_gather_exposed_ms"]
    assert parts == pytest.approx(m["step_ms"]) and m["gate_ms"] > 0 and m["expert_ms"] > 0


def test_a_dropless_step_syncs_the_host_once_per_moe_layer_forward():
    model = _model(*GPU, "moe.dispatcher=dropless", "model.n_layers=4", "model.moe_every=2")
    syncs = [op.name for op in model.run().ops if op.name.startswith("sync/")]
    assert syncs == ["sync/L1.dispatch0.fwd", "sync/L3.dispatch0.fwd"]
    assert not [op for op in _model(*GPU).run().ops if op.name.startswith("sync/")]


def test_a_cpu_step_keeps_its_launches_in_series():
    model = _model(*GPU, "hardware.device=cpu", "hardware.backend=gloo")  # the testbed as a CPU cluster
    serial_ops, _ = model.build()
    sim = model.run()
    assert not model.asynchronous and not any(op.on_host for op in sim.ops)
    assert sim.timeline.makespan_s == simulate(serial_ops, model.topo.capacity).makespan_s


def test_a_gate_that_reads_its_counts_syncs_the_host_and_never_speeds_the_step():
    """DeepSpeed-MoE's gate copied its expert counts to the CPU (moe.gate_host_sync): the host waits
    before every MoE layer's gate forward, so the gate's launches are no longer hidden."""
    base = [*GPU, "model.n_layers=4", "model.moe_every=2"]
    synced = _model(*base, "moe.gate_host_sync=true").run()
    assert [op.name for op in synced.ops if op.name.startswith("sync/")] == ["sync/L1.gate.fwd", "sync/L3.gate.fwd"]
    free = _model(*base).run()
    assert synced.timeline.makespan_s >= free.timeline.makespan_s
    assert synced.metrics()["gate_ms"] > free.metrics()["gate_ms"]
