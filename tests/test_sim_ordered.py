"""Ordered exchanges (moe_core.sim.collectives.add_ordered_exchange): an all-to-all's transfers issued
in a transmission order through the network engine, against the big switch's known optimum."""

import numpy as np
import pytest
from omegaconf import OmegaConf

import moe_core.papers.aurora.transmission_order  # noqa: F401  (registers the orders below)
from moe_core.comm.transmission import lower_bound, make_schedule
from moe_core.comm.workloads import FIG4_TOY_TOKENS
from moe_core.config.load import HardwareConfig
from moe_core.sim.collectives import PointToPoint, add_ordered_exchange
from moe_core.sim.engine import Op, simulate
from moe_core.sim.topology import Cluster
from moe_core.units import GB

ORDERS = ("naive", "sjf", "rcs", "aurora", "exact")


def big_switch(n: int, gbps=(1.0,), latency_us: float = 0.0):
    """``n`` GPUs on a non-blocking switch, one per node, the NIC rates cycling through ``gbps`` (GB/s)."""
    rates = [gbps[i % len(gbps)] for i in range(n)]
    classes = [{"name": f"c{i}", "count": 1, "nic_GBps": r, "peak_tflops": 1.0} for i, r in enumerate(rates)]
    hw = OmegaConf.merge(
        OmegaConf.structured(HardwareConfig),
        dict(name="switch", nodes=n, devices_per_node=1, nic_GBps=max(rates), nics_per_node=1, peak_tflops=1.0),
        {"inter_node_latency_us": latency_us, "gpu_classes": classes if len(gbps) > 1 else []},
    )
    return hw, Cluster(hw)


def exchange(hw, topo, traffic, kind, seed=0):
    """(ops, timeline) of ``traffic`` bytes alone on ``topo``, its transfers in order ``kind``."""
    n = len(traffic)
    bandwidth = topo.capacity[topo.nic_out]
    ops: list[Op] = []
    schedule = make_schedule(kind, traffic, bandwidth, seed)
    add_ordered_exchange(ops, PointToPoint(hw, topo), np.arange(n), schedule, "x", "dispatch_a2a", [])
    return ops, simulate(ops, topo.capacity)


def _random_traffic(rng, n):
    skew = rng.random(n)[None, :] ** 2  # popular receivers
    return rng.integers(0, 100, (n, n)) * skew * 1e6


def test_fig4_example_takes_three_units_in_the_naive_order_and_two_in_aurora():
    hw, topo = big_switch(3)
    traffic = FIG4_TOY_TOKENS * GB  # one unit = one second at 1 GB/s
    assert exchange(hw, topo, traffic, "naive")[1].makespan_s == pytest.approx(3.0)
    for kind in ("aurora", "exact"):
        assert exchange(hw, topo, traffic, kind)[1].makespan_s == pytest.approx(2.0)


def test_the_exact_order_reaches_the_lower_bound_on_a_homogeneous_switch():
    """Theorem 4.2's optimum: max(busiest row, busiest column) / B, whatever the skew; no order beats it."""
    rng = np.random.default_rng(0)
    hw, topo = big_switch(8)
    for _ in range(8):
        traffic = _random_traffic(rng, 8)
        bound = lower_bound(traffic, GB)
        times = {kind: exchange(hw, topo, traffic, kind, seed=1)[1].makespan_s for kind in ORDERS}
        assert times["exact"] == pytest.approx(bound, rel=1e-9)
        assert min(times.values()) >= bound * (1 - 1e-9)


def test_no_order_beats_the_bound_on_a_heterogeneous_switch():
    rng = np.random.default_rng(1)
    hw, topo = big_switch(8, gbps=(12.5, 10.0, 6.25, 5.0))
    bandwidth = topo.capacity[topo.nic_out]
    for _ in range(4):
        traffic = _random_traffic(rng, 8)
        for kind in ORDERS:
            assert exchange(hw, topo, traffic, kind)[1].makespan_s >= lower_bound(traffic, bandwidth) * (1 - 1e-9)


@pytest.mark.parametrize("kind", ORDERS)
def test_an_order_never_changes_the_bytes_delivered(kind):
    """Every pair's bytes cross once, on the sender's NIC out and the receiver's NIC in, in any order."""
    rng = np.random.default_rng(2)
    hw, topo = big_switch(6)
    traffic = _random_traffic(rng, 6)
    ops, timeline = exchange(hw, topo, traffic, kind, seed=3)
    moved = np.zeros((6, 6))
    for op in ops:
        if op.transfer is None:
            continue
        src, dst = (int(x) for x in op.name.split(":")[1].rstrip("]").split(">"))
        assert sorted(op.transfer.links) == sorted([topo.nic_out[src], topo.nic_in[dst]])
        moved[src, dst] += op.transfer.nbytes[0]
    expected = traffic.copy()
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(moved, expected, rtol=1e-9)
    assert np.isfinite(timeline.end_s).all()


def test_each_transfer_pays_one_messages_latency_and_a_member_waits_for_its_whole_step():
    """Fig. 4's naive order with 1 ms per message: GPU 1's second send waits for GPU 2's first receive."""
    hw, topo = big_switch(3, latency_us=1000.0)
    ops, timeline = exchange(hw, topo, FIG4_TOY_TOKENS * GB, "naive")
    assert timeline.makespan_s == pytest.approx(3 * 1.001)
