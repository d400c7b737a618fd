"""Ranks that outnumber a CPU host's cores: the scheduler's wait at each blocking collective, its
measurement on the host, its fit, and where the simulated step pays it."""

import math

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from moe_core.config.load import load_config
from moe_core.host import time_slicing
from moe_core.sim.calibrate import fit_time_slicing
from moe_core.sim.engine import Op
from moe_core.sim.step import StepModel
from moe_core.sim.time_slicing import straggler_wait_s, with_straggler_waits
from moe_core.sim.topology import Transfer, build_topology

HOST = OmegaConf.create({"host_wake_ms": 0.2, "host_slice_ms": 4.0})
# 4 CPU ranks on a host of 2 cores, a step with expert parallelism 4 (4 all-to-alls a pass)
OVERSUBSCRIBED = [
    "hardware_profile=local-cpu",
    "hardware.host_cores=2",
    "hardware.intra_node_GBps=1.0",  # what a calibration would fit (the shipped profile leaves it unknown)
    "parallel.world_size=4",
    "moe.num_experts=4",
    "moe.experts_per_rank=1",
    "comm.policy=sequential",
]


def test_the_wait_grows_with_compute_and_levels_off_near_a_slice():
    waits = [straggler_wait_s(ms * 1e-3, HOST) * 1e3 for ms in (0.01, 1, 4, 16, 1000)]
    assert waits[0] == pytest.approx(0.2 + 0.01, rel=1e-2)  # short compute: the wake-up and the compute
    assert waits == sorted(waits)
    assert waits[-1] == pytest.approx(4.2)  # long compute: one slice and the wake-up
    assert straggler_wait_s(0.0, HOST) == 0.0  # back-to-back collectives: nobody is left behind
    assert straggler_wait_s(1.0, OmegaConf.create({"host_wake_ms": 0.2, "host_slice_ms": 0.0})) == 0.0


def _link() -> Transfer:
    return Transfer.from_dense(np.ones(1), 1, False)


def test_only_collectives_that_compute_waits_for_pay_and_each_for_the_compute_before_it():
    ops = [
        Op("f1", "dense", duration_s=0.004),
        Op("a2a", "dispatch_a2a", [0], transfer=_link(), latency_s=1e-3),
        Op("f2", "expert", [1], duration_s=0.002),
        Op("grad", "allreduce", [2], transfer=_link(), latency_s=1e-3),  # no compute waits for it
        Op("f3", "dense", [2], duration_s=0.006),
        Op("a2a2", "combine_a2a", [4], transfer=_link(), latency_s=1e-3),
        Op("end", "dense", [5], duration_s=0.001),
    ]
    assert with_straggler_waits(ops, HOST, share=1.0) is ops  # a core for every rank
    waited = with_straggler_waits(ops, HOST, share=0.5)
    extra = [(w.latency_s - o.latency_s) * 1e3 for o, w in zip(ops, waited)]
    # each rank's own compute: half the ops' time at a half share of the cores
    assert extra[1] == pytest.approx(0.2 + 4.0 * -math.expm1(-2.0 / 4.0))
    assert extra[5] == pytest.approx(0.2 + 4.0 * -math.expm1(-(1.0 + 3.0) / 4.0))  # f2 and f3
    assert extra[3] == 0.0 and extra[0] == extra[2] == extra[4] == extra[6] == 0.0


def test_the_fit_recovers_the_host_terms_it_was_made_from():
    compute_ms = np.array([0.25, 1.0, 4.0, 16.0])
    wait_ms = 0.15 + 4.5 * -np.expm1(-compute_ms / 4.5)
    hw, stats = fit_time_slicing(HOST, pd.DataFrame({"compute_ms": compute_ms, "wait_ms": wait_ms}))
    assert hw.host_wake_ms == pytest.approx(0.15, abs=1e-6)
    assert hw.host_slice_ms == pytest.approx(4.5, rel=1e-6)
    assert stats["points"] == 4 and stats["max_abs_error_ms"] < 1e-6


def test_the_host_measurement_times_each_compute_length_it_asks_for():
    rows = time_slicing.measure(cores=1, compute_ms=(0.25, 2.0))
    assert [set(r) for r in rows] == [{"compute_ms", "wait_ms"}] * 2
    assert 0 < rows[0]["compute_ms"] < rows[1]["compute_ms"]  # a loop of 8x the steps takes longer
    assert all(math.isfinite(r["wait_ms"]) for r in rows)
    with pytest.raises(ValueError, match="cores must be >= 1"):
        time_slicing.measure(cores=0)


def _step(*overrides):
    cfg = load_config(overrides=[*OVERSUBSCRIBED, *overrides])
    return StepModel(cfg, build_topology(cfg.hardware)).run()


def test_an_oversubscribed_step_pays_every_blocking_wait_once_and_a_host_with_cores_none():
    plain = _step()
    sliced = _step("hardware.host_wake_ms=0.2", "hardware.host_slice_ms=4.0")
    added = sum(s.latency_s - p.latency_s for p, s in zip(plain.ops, sliced.ops))
    assert added > 0
    # the sequential policy overlaps nothing: every wait lies on the critical path
    assert sliced.timeline.makespan_s - plain.timeline.makespan_s == pytest.approx(added, rel=1e-6)
    waited = sum(s.latency_s > p.latency_s for p, s in zip(plain.ops, sliced.ops))
    assert waited == sum(op.phase.endswith("a2a") and op.transfer is not None for op in plain.ops) + 1  # + the sync
    roomy = _step("hardware.host_cores=4", "hardware.host_wake_ms=0.2", "hardware.host_slice_ms=4.0")
    assert roomy.timeline.makespan_s == pytest.approx(_step("hardware.host_cores=4").timeline.makespan_s)
