"""Network model and fluid engine against closed forms and invariants."""

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.optimize import linprog

from moe_core.config.load import ConfigError, HardwareConfig, load_config
from moe_core.sim.collectives import SizeCurve, collective_op, simulate_on
from moe_core.sim.engine import Op, _footprint, fair_rates, simulate
from moe_core.sim.topology import Cluster, Torus2D, Transfer, achieved_GBps
from moe_core.units import GB

pytestmark = []


def hw(**kw):
    base = dict(name="t", nodes=2, devices_per_node=4, intra_node_GBps=100.0, nic_GBps=10.0, nics_per_node=1)
    return OmegaConf.merge(OmegaConf.structured(HardwareConfig), base, kw)


def alone_s(topo, transfer, latency_s=0.0):
    ops = [Op("x", "comm", transfer=transfer, latency_s=latency_s)]
    return simulate(ops, topo.capacity).makespan_s


def test_ring_all_reduce_matches_closed_form_within_a_node():
    topo = Cluster(hw(nodes=1, devices_per_node=8, intra_node_latency_us=5.0))
    S = 64e6
    t = topo.ring(np.arange(8), S, "all_reduce")
    expected = 2 * 7 / 8 * S / (100 * GB) + 2 * 7 * 5e-6
    assert alone_s(topo, t, topo.latency_s(t)) == pytest.approx(expected, rel=1e-9)


def test_ring_all_reduce_across_nodes_is_bound_by_the_nic():
    topo = Cluster(hw(nodes=4, devices_per_node=4, nic_GBps=12.5))
    S, p = 100e6, 16
    t = topo.ring(np.arange(p), S, "all_reduce")
    # each node's NIC carries 2(p-1)/p * S once: B = the NIC
    assert alone_s(topo, t) == pytest.approx(2 * (p - 1) / p * S / (12.5 * GB), rel=1e-9)


def test_uniform_all_to_all_closed_form_equals_the_dense_matrix():
    topo = Cluster(hw(nodes=2, devices_per_node=4, nics_per_node=4))
    group, S = np.arange(8), 8e6
    dense = topo.all_to_all(group, np.full((8, 8), S / 8))
    closed = topo.uniform_all_to_all(group, S)
    assert alone_s(topo, dense) == pytest.approx(alone_s(topo, closed))
    # inter-node bytes per device: S (N-1)/N over its own NIC
    assert alone_s(topo, closed) == pytest.approx(S * 0.5 / (10 * GB))


def test_uneven_all_to_all_is_bound_by_the_busiest_receiver():
    topo = Cluster(hw(nodes=4, devices_per_node=1, nic_GBps=1.0))  # a big switch
    traffic = np.array([[0, 1, 1, 1], [3, 0, 0, 0], [3, 0, 0, 0], [3, 0, 0, 0]], float) * 1e9
    assert alone_s(topo, topo.all_to_all(np.arange(4), traffic)) == pytest.approx(9.0)


def test_two_equal_transfers_on_one_link_each_take_twice_as_long():
    cap = np.array([1e9])
    t = Transfer(np.array([0]), np.array([1e9]), 1, True)
    alone = simulate([Op("a", "c", transfer=t)], cap).makespan_s
    both = simulate([Op("a", "c", transfer=t), Op("b", "c", transfer=t)], cap)
    assert alone == pytest.approx(1.0) and both.end_s == pytest.approx([2.0, 2.0])


def test_strict_priority_transfer_gets_the_whole_link():
    cap = np.array([1e9])
    t = Transfer(np.array([0]), np.array([1e9]), 1, True)
    res = simulate([Op("lo", "c", transfer=t, priority=1), Op("hi", "c", transfer=t, priority=0)], cap)
    assert res.end_s[1] == pytest.approx(1.0) and res.end_s[0] == pytest.approx(2.0)


def test_shared_latency_phases_of_concurrent_transfers_take_turns_on_the_host():
    cap = np.array([1e9])
    t = Transfer(np.array([0]), np.array([1e6]), 1, True)  # 1 ms of bytes
    ops = [Op("a", "c", transfer=t, latency_s=0.01), Op("b", "c", transfer=t, latency_s=0.01)]
    independent = simulate(ops, cap)
    shared = simulate(ops, cap, shared_latency=True)
    # both latencies in parallel, then the link shared: 10 ms + 2 ms
    assert independent.end_s == pytest.approx([0.012, 0.012])
    # the host serves both latency phases at half speed: 20 ms, then the link shared: 2 ms
    assert shared.end_s == pytest.approx([0.022, 0.022])
    # alone, sharing changes nothing
    assert simulate(ops[:1], cap, shared_latency=True).makespan_s == pytest.approx(0.011)


def test_the_host_link_is_not_the_unit_in_which_a_shared_nic_is_shared():
    """Link 0 a NIC (1 B/s), link 1 the host's copy throughput (100 B/s), which carries the sum of a
    collective's streams. A and B put 1 B each on the NIC, 3 and 4 B on the host: they share the NIC
    equally and end together at 2 s. Counted in host bytes, A would get 4/7 of the NIC."""
    cap = np.array([1.0, 100.0])
    a = Transfer(np.array([0, 1]), np.array([1.0, 3.0]), 1, True)
    b = Transfer(np.array([0, 1]), np.array([1.0, 4.0]), 1, True)
    ops = [Op("a", "c", transfer=a), Op("b", "c", transfer=b)]
    assert simulate(ops, cap, host_link=1).end_s == pytest.approx([2.0, 2.0])
    assert simulate(ops, cap).end_s[0] == pytest.approx(1.75)  # 1 B at 4/7 B/s
    # a transfer that crosses nothing but the host link is counted in its bytes there
    alone = Transfer(np.array([1]), np.array([50.0]), 1, True)
    assert simulate([Op("h", "c", transfer=alone)], cap, host_link=1).makespan_s == pytest.approx(0.5)


def test_on_a_cpu_host_every_byte_sent_crosses_the_host_link():
    topo = Cluster(hw(nodes=1, devices_per_node=4, intra_node_GBps=10.0, host_GBps=20.0))
    group = np.arange(4)
    a2a = topo.uniform_all_to_all(group, 8e9)  # each rank sends 6 GB to peers: 24 GB cross the host
    assert alone_s(topo, a2a) == pytest.approx(24 / 20)  # the host, not a rank's 0.6 s link, bounds it
    two_rings = simulate(
        [
            Op("a", "c", transfer=topo.ring(group[:2], 4e9, "all_reduce")),
            Op("b", "c", transfer=topo.ring(group[2:], 4e9, "all_reduce")),
        ],
        topo.capacity,
    )
    # disjoint ranks, no shared device link: alone each takes max(4/10, 8/20) = 0.4 s; together 0.8 s
    assert two_rings.end_s == pytest.approx([0.8, 0.8])


def test_max_min_fairness_gives_leftover_bandwidth_to_the_unbottlenecked_transfer():
    cap = np.array([1e9, 1e9])
    a = Transfer(np.array([0, 1]), np.array([1e9, 1e9]), 1, True)  # uses both links
    b = Transfer(np.array([0]), np.array([1e9]), 1, True)
    c = Transfer(np.array([0]), np.array([1e9]), 1, True)
    res = simulate([Op("a", "x", transfer=a), Op("b", "x", transfer=b), Op("c", "x", transfer=c)], cap)
    assert res.end_s == pytest.approx([3.0, 3.0, 3.0])  # link 0 shared three ways, link 1 idles


def test_links_of_unequal_capacity_are_shared_max_min_fairly_in_bytes():
    """The textbook case: links of capacity 10 and 1 B/s; A (1 B) crosses both, B (9 B) only the
    first. Progressive filling in bytes: A is held to 1 B/s by the slow link, B takes the other
    9 B/s of the fast one, and both finish at 1 s (equal fractions of their own speeds would give
    A 1.1 s and B 0.99 s)."""
    cap = np.array([10.0, 1.0])
    a = Transfer(np.array([0, 1]), np.array([1.0, 1.0]), 1, True)
    b = Transfer(np.array([0]), np.array([9.0]), 1, True)
    res = simulate([Op("a", "x", transfer=a), Op("b", "x", transfer=b)], cap)
    assert res.end_s == pytest.approx([1.0, 1.0])


def _bounds(fixed: dict[int, float], unfrozen: list[int], cap: np.ndarray, floor: float) -> list[tuple]:
    """Rate bounds of the reference's LPs: frozen rates fixed, the current class's unfrozen ones in
    [floor, cap], the rest (later classes) 0."""
    return [
        (fixed[j], fixed[j]) if j in fixed else (floor, cap[j]) if j in unfrozen else (0.0, 0.0)
        for j in range(len(cap))
    ]


def _alone_rate(t: Transfer, capacity: np.ndarray) -> float:
    """Bytes/s of a transfer's largest per-link stream when it runs alone: its efficiency times what
    its slowest link allows."""
    return t.efficiency * t.nbytes.max() / (t.nbytes / capacity[t.links]).max()


def _byte_fair_reference(transfers: list[Transfer], priority: list[int], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates in bytes/s by linear programs, from the transfers themselves, not the
    engine's footprints. A transfer's rate r counts bytes/s of its largest per-link stream S; on a
    link with b of its bytes it moves r b / S bytes/s; it runs at most at its efficiency times the
    rate its slowest link allows alone. Per priority class: raise the floor t of every unfrozen
    transfer as far as the links allow (LP 1), then freeze at t each transfer that cannot exceed it
    with the others at least at t (LP 2)."""
    n, num_links = len(transfers), len(capacity)
    usage = np.zeros((num_links, n))  # bytes/s on each link per byte/s of each transfer's rate
    for j, t in enumerate(transfers):
        usage[t.links, j] = t.nbytes / t.nbytes.max()
    cap = np.array([_alone_rate(t, capacity) for t in transfers])
    fixed: dict[int, float] = {}
    for cls in sorted(set(priority)):
        unfrozen = [j for j in range(n) if priority[j] == cls]
        while unfrozen:
            # LP 1: the highest common floor t (variables: rates, then t)
            floor_rows = np.zeros((len(unfrozen), n + 1))
            for r, j in enumerate(unfrozen):
                floor_rows[r, j], floor_rows[r, n] = -1.0, 1.0  # t - r_j <= 0
            res = linprog(
                np.r_[np.zeros(n), -1.0],
                A_ub=np.vstack([np.hstack([usage, np.zeros((num_links, 1))]), floor_rows]),
                b_ub=np.r_[capacity, np.zeros(len(unfrozen))],
                bounds=[*_bounds(fixed, unfrozen, cap, 0.0), (0, None)],
            )
            floor = res.x[n]
            # LP 2: which unfrozen transfer cannot exceed the floor
            stuck = []
            for j in unfrozen:
                objective = np.zeros(n)
                objective[j] = -1.0
                bounds = _bounds(fixed, unfrozen, cap, floor * (1 - 1e-9))
                if -linprog(objective, A_ub=usage, b_ub=capacity, bounds=bounds).fun <= floor * (1 + 1e-7):
                    stuck.append(j)
            fixed.update({j: floor for j in stuck})
            unfrozen = [j for j in unfrozen if j not in stuck]
    return np.array([fixed[j] for j in range(n)])


@pytest.mark.parametrize("seed", range(20))
def test_fair_rates_equal_a_linear_programming_max_min_reference(seed):
    """Random transfers over links of unequal capacities, with uneven bytes per link, rate caps and
    two priority classes: the engine's rates are the max-min fair allocation in bytes/s, and every
    transfer is capped or crosses a link its class saturates on which no transfer of its class is
    faster (the bottleneck characterisation of max-min fairness)."""
    rng = np.random.default_rng(seed)
    num_links, count = 6, 5
    capacity = rng.uniform(1.0, 10.0, num_links)
    transfers, priority = [], []
    for _ in range(count):
        links = rng.choice(num_links, size=rng.integers(1, 4), replace=False)
        efficiency = 1.0 if rng.random() < 0.5 else rng.uniform(0.3, 1.0)
        transfers.append(Transfer(links, rng.uniform(1.0, 5.0, links.size), 1, True, efficiency=efficiency))
        priority.append(int(rng.random() < 0.3))
    progress = fair_rates(
        {i: _footprint(t, capacity) for i, t in enumerate(transfers)}, dict(enumerate(priority)), num_links
    )
    rates = np.array([progress[i] * t.nbytes.max() for i, t in enumerate(transfers)])  # bytes/s
    reference = _byte_fair_reference(transfers, priority, capacity)
    assert rates == pytest.approx(reference, rel=1e-6)
    for cls in sorted(set(priority)):
        used = np.zeros(num_links)
        for t, r, p in zip(transfers, rates, priority):
            if p <= cls:
                np.add.at(used, t.links, r * t.nbytes / t.nbytes.max())
        assert (used <= capacity * (1 + 1e-9)).all()
        peers = [j for j in range(count) if priority[j] == cls]
        for i in peers:
            if rates[i] >= _alone_rate(transfers[i], capacity) * (1 - 1e-9):
                continue
            assert any(
                used[link] >= capacity[link] * (1 - 1e-9)
                and all(rates[i] >= rates[j] * (1 - 1e-9) for j in peers if link in transfers[j].links)
                for link in transfers[i].links
            ), f"transfer {i} is neither capped nor bottlenecked"


def test_links_run_at_the_share_of_line_rate_collectives_reach():
    """intra_node_efficiency and nic_efficiency scale every link of their class, in both topologies and
    for devices of their own NIC classes; the papers' analytical models read the same rates."""
    line, shared = Cluster(hw()), Cluster(hw(intra_node_efficiency=0.8, nic_efficiency=0.5))
    assert shared.capacity[shared.intra_out] == pytest.approx(0.8 * line.capacity[line.intra_out])
    assert shared.capacity[shared.nic_out] == pytest.approx(0.5 * line.capacity[line.nic_out])
    assert achieved_GBps(hw(intra_node_efficiency=0.8, nic_efficiency=0.5)) == pytest.approx((80.0, 5.0))
    torus = hw(topology="torus2d", torus_dims=[2, 2], nodes=4, devices_per_node=1, intra_node_efficiency=0.5)
    assert Torus2D(torus).capacity == pytest.approx(50.0 * GB)
    classes = [dict(name="fast", count=2, nic_GBps=12.5), dict(name="slow", count=2, nic_GBps=5.0)]
    hetero = Cluster(hw(nodes=4, devices_per_node=1, gpu_classes=classes, nic_efficiency=0.5))
    assert hetero.capacity[hetero.nic_out] == pytest.approx([6.25 * GB, 6.25 * GB, 2.5 * GB, 2.5 * GB])


@pytest.mark.parametrize("key", ["intra_node_efficiency", "nic_efficiency"])
@pytest.mark.parametrize("value", [0, 1.2])
def test_a_share_of_line_rate_outside_0_1_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"hardware\\.{key}"):
        load_config(overrides=["hardware_profile=h100-ndr-cluster", f"hardware.{key}={value}"])


CURVE = "nccl-all-to-all"  # configs/collective_curves/: SimAI's measured all-to-all shares
MiB = 2**20


def test_a_size_curve_is_read_relative_to_its_largest_size_as_simai_reads_it():
    """Linear in size between rows, held at both ends; a node count between columns takes the next
    smaller one, beyond the last the last (SimAI's ata_ratio.csv: one node 0.44 at 16 MiB, 0.51 at
    32 MiB, 0.78 at the largest sizes; 2 nodes 0.52 ... 0.80; 16 nodes 0.62 ... 0.90)."""
    curve = SizeCurve.load(CURVE)
    assert curve.relative_share(16 * MiB, nodes=1) == pytest.approx(0.44 / 0.78)
    assert curve.relative_share(24 * MiB, nodes=1) == pytest.approx((0.44 + 0.51) / 2 / 0.78)
    assert curve.relative_share(1 * MiB, nodes=1) == curve.relative_share(16 * MiB, nodes=1)
    assert curve.relative_share(2**40, nodes=1) == pytest.approx(1.0)
    assert curve.relative_share(16 * MiB, nodes=3) == pytest.approx(0.52 / 0.80)
    assert curve.relative_share(16 * MiB, nodes=64) == pytest.approx(0.62 / 0.90)


def one_h800_node(**overrides):
    keys = {"hardware_profile": "h800-cx7-cluster", "hardware.nodes": 1, **overrides}
    hw = load_config(overrides=[f"{k}={v}" for k, v in keys.items()]).hardware
    return hw, Cluster(hw)


@pytest.mark.parametrize("size", [16 * MiB, 48 * MiB, 256 * MiB])
def test_an_all_to_all_alone_takes_what_the_curve_measured_at_its_size(size):
    """On one 8-GPU node the bandwidth time at the profile's rates, over the curve's relative share,
    is the whole time alone: the model's latency is taken out of the curve's time, not added to it."""
    hw, topo = one_h800_node()
    transfer = topo.uniform_all_to_all(np.arange(8), size)
    bandwidth_s = size * 7 / 8 / topo.capacity[topo.intra_out[0]]
    took = simulate_on(hw, topo, [Op("a2a", "comm", **collective_op(hw, topo, "all_to_all", transfer))]).makespan_s
    assert took == pytest.approx(bandwidth_s / SizeCurve.load(CURVE).relative_share(size, nodes=1))
    assert took > bandwidth_s + topo.latency_s(transfer)  # slower than the alpha-beta model at mid sizes


def test_the_curve_prices_all_to_alls_only_and_a_calibrated_fit_overrides_it():
    """Ring collectives keep the alpha-beta model; a profile's calibrated terms for a kind win; at the
    curve's largest size an all-to-all runs at the profile's share; a tiny one pays its latency only."""
    hw, topo = one_h800_node()
    plain, _ = one_h800_node(**{"hardware.all_to_all_curve": "''"})
    group = np.arange(8)
    ring = topo.ring(group, 64 * MiB, "all_gather")
    assert collective_op(hw, topo, "all_gather", ring)["transfer"].efficiency == 1.0
    largest = topo.uniform_all_to_all(group, 2**34)
    assert collective_op(hw, topo, "all_to_all", largest)["transfer"].efficiency == pytest.approx(1.0)
    tiny = topo.uniform_all_to_all(group, 1024)
    assert collective_op(hw, topo, "all_to_all", tiny)["transfer"].efficiency == 1.0
    mid = topo.uniform_all_to_all(group, 16 * MiB)
    assert collective_op(hw, topo, "all_to_all", mid)["transfer"].efficiency < 0.6
    assert collective_op(plain, topo, "all_to_all", mid)["transfer"].efficiency == 1.0
    fitted = OmegaConf.merge(hw, {"collectives": {"all_to_all": {"efficiency": 0.9}}})
    assert collective_op(fitted, topo, "all_to_all", mid)["transfer"].efficiency == 0.9


def test_an_unknown_size_curve_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="hardware\\.all_to_all_curve.*nccl-all-to-all"):
        load_config(overrides=["hardware_profile=h800-cx7-cluster", "hardware.all_to_all_curve=nccl-typo"])


def test_heterogeneous_nics_bound_the_slowest_device():
    classes = [dict(name="fast", count=2, nic_GBps=12.5), dict(name="slow", count=2, nic_GBps=5.0)]
    topo = Cluster(hw(nodes=4, devices_per_node=1, gpu_classes=classes))
    t = topo.uniform_all_to_all(np.arange(4), 4e9)
    assert alone_s(topo, t) == pytest.approx(3e9 / (5 * GB))


def test_hierarchical_all_to_all_moves_the_same_inter_node_bytes_in_fewer_steps():
    topo = Cluster(hw(nodes=4, devices_per_node=4, nics_per_node=4, intra_node_latency_us=1, inter_node_latency_us=10))
    group, S = np.arange(16), 16e6
    traffic = np.full((16, 16), S / 16)
    direct = topo.all_to_all(group, traffic)
    intra, inter = topo.hierarchical_all_to_all(group, traffic)

    def nic(transfer):
        return transfer.nbytes[np.isin(transfer.links, topo.nic_out)].sum()

    assert nic(inter) == pytest.approx(nic(direct))
    assert inter.steps + intra.steps < direct.steps
    assert topo.latency_s(intra) + topo.latency_s(inter) < topo.latency_s(direct)


def test_torus_uniform_all_to_all_matches_routed_flows_and_grows_like_sqrt_d():
    topo = Torus2D(hw(topology="torus2d", torus_dims=[4, 4], intra_node_GBps=10.0))
    S = 16e6
    routed = topo.all_to_all(np.arange(16), np.full((16, 16), S / 16))
    closed = topo.uniform_all_to_all(np.arange(16), S)
    assert closed.nbytes.sum() == pytest.approx(routed.nbytes.sum())
    per_link = [
        Torus2D(hw(topology="torus2d", torus_dims=[k, k], intra_node_GBps=10.0))
        .uniform_all_to_all(np.arange(k * k), S)
        .nbytes.max()
        for k in (8, 16, 32)
    ]
    assert per_link[1] / per_link[0] == pytest.approx(2.0, rel=0.05)  # D x4 -> sqrt(D) x2
    assert per_link[2] / per_link[1] == pytest.approx(2.0, rel=0.05)


def test_more_bandwidth_never_slows_and_more_operations_never_speed_up():
    rng = np.random.default_rng(0)
    topo = Cluster(hw(nodes=2, devices_per_node=2))
    traffic = rng.uniform(0, 1e8, (4, 4))
    a2a, ar = topo.all_to_all(np.arange(4), traffic), topo.ring(np.arange(4), 5e7, "all_reduce")
    base = simulate([Op("a2a", "x", transfer=a2a)], topo.capacity).makespan_s
    with_ar = simulate([Op("a2a", "x", transfer=a2a), Op("ar", "x", transfer=ar)], topo.capacity).end_s[0]
    faster = simulate([Op("a2a", "x", transfer=a2a)], topo.capacity * 2).makespan_s
    assert with_ar >= base - 1e-12 and faster <= base


def test_dependencies_serialize_and_compute_takes_its_duration():
    ops = [
        Op("c1", "dense", duration_s=1.0),
        Op("c2", "dense", deps=[0], duration_s=2.0),
        Op("x", "comm", deps=[0], transfer=Transfer(np.array([0]), np.array([1e9]), 1, False)),
    ]
    res = simulate(ops, np.array([1e9]))
    assert res.end_s == pytest.approx([1.0, 3.0, 2.0])


def test_micro_ops_take_the_transfer_time_plus_one_latency_each():
    from moe_core.sim.engine import add_micro_ops

    cap = np.array([1e9])
    t = Transfer(np.array([0]), np.array([1e9]), 1, True)
    ops: list[Op] = []
    last = add_micro_ops(ops, "ar", "allreduce", t, latency_s=0.01, count=5, deps=[])
    res = simulate(ops, cap)
    assert len(ops) == 5 and res.end_s[last] == pytest.approx(1.0 + 5 * 0.01)


def test_step_cost_grows_with_operations_not_with_gpus():
    """A scale test: 64x more GPUs add no layer operations; only the gates' weights (d_model x E,
    dense parameters) add gradient buckets."""
    from moe_core.config.load import load_config
    from moe_core.sim.step import StepModel
    from moe_core.sim.topology import build_topology

    counts = {}
    for gpus in (64, 4096):
        cfg = load_config(
            overrides=[
                "hardware_profile=h200-ndr-cluster",
                f"parallel.world_size={gpus}",
                f"moe.num_experts={gpus}",
                "moe.experts_per_rank=1",
                "model.n_layers=32",
                "model.moe_every=1",
                "comm.policy=overlap",
            ]
        )
        sim = StepModel(cfg, build_topology(cfg.hardware)).run()
        counts[gpus] = sum(op.phase != "allreduce" for op in sim.ops), len(sim.ops)
        assert np.isfinite(sim.timeline.end_s).all()
    assert counts[64][0] == counts[4096][0] and counts[4096][1] <= 1.1 * counts[64][1]


def test_a_tiny_transfer_late_in_a_long_timeline_finishes():
    """At large times, now + left / rate rounds back to now; the engine must still finish the transfer."""
    tiny = Transfer(np.array([0]), np.array([1e-3]), 1, True)
    ops = [Op("long", "dense", duration_s=1e7), Op("tiny", "comm", deps=[0], transfer=tiny)]
    res = simulate(ops, np.array([1e12]))
    assert res.end_s[1] == pytest.approx(1e7)


# Token buckets (tc tbf on an emulated testbed): link 0 shaped to RATE with a BURST-byte bucket,
# link 1 the host's faster path every byte also crosses.
RATE, HOST, BURST = 1e9, 1e10, 1e6
BUCKET_CAP, BUCKET_BURST = np.array([RATE, HOST]), np.array([BURST, 0.0])


def shaped(nbytes: float) -> Transfer:
    return Transfer(np.array([0, 1]), np.array([nbytes, nbytes]), 1, True)


def test_a_message_within_the_bucket_crosses_at_host_speed():
    res = simulate([Op("x", "comm", transfer=shaped(0.5 * BURST))], BUCKET_CAP, burst_bytes=BUCKET_BURST)
    assert res.makespan_s == pytest.approx(0.5 * BURST / HOST)


def test_a_long_message_pays_the_rate_for_all_but_the_bucket():
    """Closed form: at host speed until the bucket is dry, then at the rate: (S - B) / r in all."""
    S = 11 * BURST
    res = simulate([Op("x", "comm", transfer=shaped(S))], BUCKET_CAP, burst_bytes=BUCKET_BURST)
    assert res.makespan_s == pytest.approx((S - BURST) / RATE, rel=1e-9)
    assert simulate([Op("x", "comm", transfer=shaped(S))], BUCKET_CAP).makespan_s == pytest.approx(S / RATE)


def test_concurrent_messages_share_one_bucket():
    S = 3 * BURST
    ops = [Op("a", "comm", transfer=shaped(S)), Op("b", "comm", transfer=shaped(S))]
    res = simulate(ops, BUCKET_CAP, burst_bytes=BUCKET_BURST)
    assert res.end_s == pytest.approx([(2 * S - BURST) / RATE] * 2, rel=1e-9)


def test_an_idle_link_refills_its_bucket_at_its_rate():
    """After a long message empties the bucket, a gap of g seconds refills r * g bytes (at most the
    bucket): a message of that size then crosses at host speed, a larger one pays for the rest."""
    gap = 0.4 * BURST / RATE
    for second, expected in ((0.4 * BURST, 0.4 * BURST / HOST), (2.4 * BURST, 2.0 * BURST / RATE)):
        ops = [
            Op("long", "comm", transfer=shaped(5 * BURST)),
            Op("gap", "dense", deps=[0], duration_s=gap),
            Op("next", "comm", deps=[1], transfer=shaped(second)),
        ]
        res = simulate(ops, BUCKET_CAP, burst_bytes=BUCKET_BURST)
        assert res.end_s[2] - res.start_s[2] == pytest.approx(expected, rel=1e-6)


def test_emulated_profiles_put_their_tbf_bucket_on_the_nic_links_only():
    topo = Cluster(hw(emulation={"enabled": True, "burst_kb": 256}))
    assert (topo.burst_bytes[np.r_[topo.nic_out, topo.nic_in]] == 256 * 1024).all()
    assert topo.burst_bytes.sum() == 256 * 1024 * 2 * topo.nodes * topo.nics_per_node
    assert not Cluster(hw()).burst_bytes.any()


def test_an_inefficient_transfer_is_rate_capped_and_leaves_the_rest_of_the_link():
    """Efficiency e caps a transfer at e of its bottleneck (alone: S / (e C)); it does not load the
    link with extra bytes. Next to a transfer without cap, the link is shared equally except that the
    capped one cannot take its half: it keeps its stand-alone speed and the other gets the rest."""
    S, C = 1e9, np.array([1e9])
    slow, full = (Transfer(np.array([0]), np.array([S]), 1, False, efficiency=e) for e in (0.25, 1.0))
    assert simulate([Op("slow", "c", transfer=slow)], C).makespan_s == pytest.approx(4.0)
    res = simulate([Op("slow", "c", transfer=slow), Op("full", "c", transfer=full)], C)
    # full: S at 0.75 C ends at 4/3 s; slow runs at its cap 0.25 C throughout.
    assert res.end_s == pytest.approx([4.0, 4 / 3])
    half, other = (Transfer(np.array([0]), np.array([S]), 1, False, efficiency=e) for e in (0.8, 1.0))
    res = simulate([Op("half", "c", transfer=half), Op("other", "c", transfer=other)], C)
    assert res.end_s == pytest.approx([2.0, 2.0])  # both below their caps: C / 2 each


# -- PCIe tree (hardware.intra_node = pcie_tree) ---------------------------------------------------


def pcie_hw(**kw):
    """4 GPUs a node, 2 per PCIe switch, one switch per socket, the NIC under switch 0; GB/s round
    numbers so that the bytes on each link can be checked by hand."""
    tree = dict(gpus_per_switch=2, switch_uplink_GBps=20.0, sockets=2, socket_link_GBps=10.0, nic_switches=[0])
    base = dict(intra_node_GBps=25.0, nic_GBps=12.5, intra_node="pcie_tree", pcie=tree)
    return OmegaConf.merge(hw(**base), kw)


def link_bytes(topo, transfer):
    """Bytes per named link block: {(block, index within the block): bytes}."""
    blocks = {
        "gpu_out": topo.intra_out,
        "gpu_in": topo.intra_in,
        "nic_out": topo.nic_out,
        "nic_in": topo.nic_in,
        "up": topo.switch_up,
        "down": topo.switch_down,
        "socket": topo.socket_link,
    }
    named = {}
    for link, nbytes in zip(transfer.links, transfer.nbytes):
        name = next((b, int(np.flatnonzero(ids == link)[0])) for b, ids in blocks.items() if link in ids)
        named[name] = float(nbytes)
    return named


def test_pcie_tree_all_to_all_inside_a_node_crosses_the_uplinks_and_the_socket_link():
    topo = Cluster(pcie_hw(nodes=1))
    t = topo.uniform_all_to_all(np.arange(4), 4e9)  # 1 GB to each peer
    b = link_bytes(topo, t)
    assert all(b["gpu_out", d] == b["gpu_in", d] == 3e9 for d in range(4))
    # GPUs 0, 1 (switch 0, socket 0) send 2 GB each to GPUs 2, 3 (switch 1, socket 1), and back
    assert b["up", 0] == b["up", 1] == b["down", 0] == b["down", 1] == 4e9
    assert b["socket", 1] == b["socket", 2] == 4e9  # socket 0 -> 1 and 1 -> 0 (ordered pairs)
    assert ("socket", 0) not in b and ("socket", 3) not in b
    # the socket link (4 GB at 10 GB/s) is the bottleneck, not the GPUs' links (3 GB at 25 GB/s)
    assert alone_s(topo, t) == pytest.approx(4e9 / (10 * GB))
    dense = topo.all_to_all(np.arange(4), np.full((4, 4), 1e9))
    assert link_bytes(topo, dense) == b


def test_pcie_tree_ring_crosses_the_socket_link_once_per_direction():
    topo = Cluster(pcie_hw(nodes=1))
    S = 4e9
    b = link_bytes(topo, topo.ring(np.arange(4), S, "all_reduce"))
    v = 2 * 3 / 4 * S  # what every rank forwards to its successor
    assert b["socket", 1] == b["socket", 2] == b["up", 0] == b["up", 1] == v
    assert all(b["gpu_out", d] == v for d in range(4))


def test_pcie_tree_routes_inter_node_bytes_through_the_gpu_link_and_to_the_nics_switch():
    topo = Cluster(pcie_hw(nodes=2))
    traffic = np.zeros((8, 8))
    traffic[0, 4] = 1e9  # GPU 0 sits under the NIC's switch: GPUDirect RDMA through the switch
    traffic[2, 4] = 2e9  # GPU 2 sits on the other socket: up its switch, across, down to the NIC
    b = link_bytes(topo, topo.all_to_all(np.arange(8), traffic))
    assert b["gpu_out", 0] == 1e9 and b["gpu_out", 2] == 2e9 and b["nic_out", 0] == 3e9
    assert b["up", 1] == 2e9 and b["socket", 2] == 2e9 and b["down", 0] == 2e9 and ("up", 0) not in b
    # node 1 receives all 3 GB at its NIC under switch 0 (switch 2 of the cluster) and GPU 4 under it
    assert b["nic_in", 1] == 3e9 and b["gpu_in", 4] == 3e9 and ("down", 2) not in b


def test_pcie_tree_gpus_under_one_switch_share_only_their_own_links():
    topo = Cluster(pcie_hw(nodes=1))
    b = link_bytes(topo, topo.all_to_all(np.arange(2), np.array([[0.0, 1e9], [1e9, 0.0]])))
    assert b == {("gpu_out", 0): 1e9, ("gpu_out", 1): 1e9, ("gpu_in", 0): 1e9, ("gpu_in", 1): 1e9}


def test_pcie_tree_hierarchical_and_forwarded_exchanges_use_the_same_routes():
    topo = Cluster(pcie_hw(nodes=2))
    group, S = np.arange(8), 8e9
    phase1, _ = topo.hierarchical_all_to_all(group, np.full((8, 8), S / 8))
    b1 = link_bytes(topo, phase1)
    # phase 1: GPU (n, l) hands each local peer l' the 2 GB bound for l' on both nodes
    assert b1["socket", 1] == 2 * 2 * 2e9 and b1["gpu_out", 0] == 3 * 2e9
    fwd = link_bytes(topo, topo.forwarded_all_to_all(group, 4e9, 3e9))
    assert fwd["socket", 1] == 2 * 2 * 1e9 + 2 * 4e9  # forwarded 1 GB per peer, plus GPUs 2, 3 to the NIC


def test_profiles_without_the_tree_keep_their_links():
    plain = Cluster(hw(intra_node_GBps=25.0, nic_GBps=12.5))
    tree = Cluster(pcie_hw(pcie={"socket_link_GBps": 5.0}))
    assert not plain.tree and plain.num_links == 2 * 8 + 2 * 2 + 2 * 2
    assert tree.num_links == plain.num_links + 2 * 4 + 2 * 4
    t_plain = plain.uniform_all_to_all(np.arange(8), 8e9)
    t_tree = tree.uniform_all_to_all(np.arange(8), 8e9)
    assert alone_s(plain, t_plain) == pytest.approx(16e9 / (12.5 * GB))  # the NIC: 4 GPUs x 4 GB
    assert alone_s(tree, t_tree) == pytest.approx(12e9 / (5 * GB))  # the socket link: 4 GB + 8 GB to the NIC


def test_a_valid_pcie_tree_config_loads():
    tree = [
        "hardware_profile=lina-a100-4x4",
        "hardware.intra_node=pcie_tree",
        "hardware.pcie.gpus_per_switch=1",
        "hardware.pcie.switch_uplink_GBps=25",
        "hardware.pcie.sockets=2",
        "hardware.pcie.socket_link_GBps=40",
        "hardware.pcie.nic_switches=[0]",
    ]
    cfg = load_config(["configs/default.yaml"], tree)
    assert Cluster(cfg.hardware).switches_per_node == 4


def test_lina_profile_routes_cross_socket_bytes_over_the_socket_link():
    topo = Cluster(load_config(["configs/default.yaml"], ["hardware_profile=lina-a100-4x4"]).hardware)
    assert topo.tree and topo.switches_per_node == 2 and topo.sockets == 2
    b = link_bytes(topo, topo.all_to_all(np.arange(4), np.full((4, 4), 1e9)))
    assert b["socket", 1] == b["socket", 2] == 4e9  # GPUs 0, 1 (socket 0) <-> GPUs 2, 3 (socket 1)
