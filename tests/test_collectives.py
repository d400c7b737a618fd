"""The collective microbenchmark: traffic matrices, naming, busbw factors, and one real torchrun run."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from experiments.collectives import (
    CASES,
    TABLE_COLUMNS,
    Collective,
    bottleneck_bytes,
    check_sizes,
    collective_point_name,
    collective_points,
    sizes_bytes,
)
from moe_core.comm.workloads import bus_bandwidth_factor, zipf_traffic_matrix
from moe_core.config.load import REPO_ROOT, ConfigError, load_config
from moe_core.records.results import read_record, record_path

# ----------------------------------------------------------------------------------------------
# zipf_traffic_matrix


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("zipf", [0.0, 0.7, 1.2, 3.0])
@pytest.mark.parametrize("bytes_per_rank", [0, 4, 1000, 1024, 64 * 2**20])
def test_rows_sum_exactly_in_whole_elements(world_size, zipf, bytes_per_rank):
    m = zipf_traffic_matrix(world_size, bytes_per_rank, zipf, seed=0)
    assert m.shape == (world_size, world_size) and m.dtype == np.int64
    assert (m.sum(axis=1) == bytes_per_rank).all()
    assert (m >= 0).all() and (m % 4 == 0).all()


def test_deterministic_for_a_seed():
    a = zipf_traffic_matrix(8, 2**20, 1.2, seed=3)
    assert np.array_equal(a, zipf_traffic_matrix(8, 2**20, 1.2, seed=3))
    # The seed picks which ranks are hot.
    hottest = {int(np.argmax(zipf_traffic_matrix(8, 2**20, 1.2, seed=s).sum(axis=0))) for s in range(10)}
    assert len(hottest) > 1


def test_skew_grows_with_zipf():
    hottest_bytes = [zipf_traffic_matrix(8, 2**20, z, seed=0).sum(axis=0).max() for z in (0, 0.5, 1, 1.5, 2)]
    assert all(a < b for a, b in zip(hottest_bytes, hottest_bytes[1:]))


def test_zipf_zero_is_uniform_up_to_one_element():
    for world_size, nbytes in [(4, 1024), (3, 1000), (8, 4 * 1001)]:
        received = zipf_traffic_matrix(world_size, nbytes, 0.0, seed=0).sum(axis=0)
        # Each entry is within one element of nbytes / world_size.
        assert received.max() - received.min() <= world_size * 4


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="element_bytes"):
        zipf_traffic_matrix(4, 1022, 1.0, seed=0)
    with pytest.raises(ValueError, match="zipf"):
        zipf_traffic_matrix(4, 1024, -1.0, seed=0)


# ----------------------------------------------------------------------------------------------
# Naming, sizes and bandwidth factors


def test_point_name():
    assert collective_point_name("all_reduce", None, 4, 4096) == "all_reduce_ws4_4KiB"
    assert collective_point_name("all_to_all_v", "all_reduce", 4, 2**20) == "all_to_all_v+all_reduce_ws4_1MiB"
    assert collective_point_name("all_to_all", None, 8, 64 * 2**20) == "all_to_all_ws8_64MiB"
    assert collective_point_name("all_to_all", None, 2, 3 * 2**30) == "all_to_all_ws2_3GiB"
    assert collective_point_name("all_reduce", None, 2, 1000) == "all_reduce_ws2_1000B"


def test_default_sizes_and_points():
    cfg = load_config()
    assert sizes_bytes(cfg) == [2**10 * 4**k for k in range(9)]  # 1 KiB .. 64 MiB
    points = collective_points(cfg)
    assert len(points) == len(set(points)) == len(CASES) * 9
    assert points[0] == "all_reduce_ws4_1KiB"
    assert points[-1] == "all_reduce+all_reduce_ws4_64MiB"


def test_sizes_stop_at_max_bytes():
    cfg = load_config(
        overrides=["collectives.min_bytes=1024", "collectives.max_bytes=5000", "collectives.step_factor=2"]
    )
    assert sizes_bytes(cfg) == [1024, 2048, 4096]


def test_sizes_must_split_evenly_over_ranks():
    check_sizes(load_config(overrides=["collectives.world_size=8"]))
    with pytest.raises(ConfigError, match="collectives.min_bytes"):
        check_sizes(load_config(overrides=["collectives.world_size=3"]))  # 1024 B is not 3 * 4-byte elements


@pytest.mark.parametrize(
    "collective, n, factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("all_to_all", 4, 0.75),
        ("all_to_all", 8, 0.875),
        ("all_to_all_v", 4, 1.0),
    ],
)
def test_bus_bandwidth_factor_matches_nccl_tests(collective, n, factor):
    assert bus_bandwidth_factor(collective, n) == pytest.approx(factor)


def test_bus_bandwidth_factor_rejects_unknown():
    with pytest.raises(ValueError):
        bus_bandwidth_factor("broadcast", 4)


def test_wrong_elements_counts_the_elements_that_differ(tmp_path):
    """--check's #wrong: on one rank an all-to-all delivers its own 8 elements of value 0 (rank id)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        coll = Collective("all_to_all", 32, torch.empty(8), torch.empty(8), [[8]], None, 0)
        coll.fill()
        coll.launch()
        assert coll.wrong_elements() == 0
        coll.recv[:3] = 7.0
        assert coll.wrong_elements() == 3
        reduced = Collective("all_reduce", 20, torch.empty(5), torch.empty(0), None, None, 0)
        reduced.fill()
        reduced.launch()
        assert reduced.wrong_elements() == 0
        reduced.send[0] = 1.0
        assert reduced.wrong_elements() == 1
        for name in ("all_gather", "reduce_scatter"):  # one rank: its chunk is the whole buffer
            ring = Collective(name, 24, torch.empty(6), torch.empty(6), None, None, 0)
            ring.fill()
            ring.launch()
            assert ring.wrong_elements() == 0
            ring.recv[1:3] = 5.0
            assert ring.wrong_elements() == 2
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# The entry point


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "disabled"}


@pytest.mark.parametrize(
    "override, key",
    [("collectives.world_size=1", "collectives.world_size"), ("collectives.bogus=3", "collectives.bogus")],
)
def test_bad_config_exits_2_before_running(tmp_path, override, key):
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "collectives", override, f"results_dir={results}"],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and key in proc.stderr
    assert not results.exists()


@pytest.mark.slow
def test_torchrun_two_ranks_writes_checked_records(tmp_path):
    overrides = [
        "collectives.world_size=2",
        "collectives.min_bytes=1024",
        "collectives.max_bytes=65536",
        "collectives.iters=3",
        "collectives.warmup_iters=1",
        "collectives.latency_bytes=4096",
        "collectives.latency_iters=2",
        f"results_dir={tmp_path}",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "experiments",
            "collectives",
            *overrides,
            "--check",
        ],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    cfg = load_config(overrides=overrides)
    points = collective_points(cfg)
    # rank 0's nccl-tests-style table: its header once, a row per point, each with #wrong 0 (--check)
    lines = proc.stdout.splitlines()
    assert lines[0].split() == list(TABLE_COLUMNS) and set(lines[1]) == {"-", " "}
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == len(points) and all(len(row) == len(TABLE_COLUMNS) for row in rows)
    assert all(row[list(TABLE_COLUMNS).index("#wrong")] == "0" for row in rows)
    out_dir = record_path(tmp_path, "common", "collectives", "x").parent
    assert sorted(p.stem for p in out_dir.glob("*.json")) == sorted(points)
    for point in points:
        record = read_record(record_path(tmp_path, "common", "collectives", point))
        params, samples = record["params"], record["samples"]
        assert record["mode"] == "measured" and record["backend"] == "gloo"
        assert record["metrics"]["wrong_elements"]["value"] == 0  # the trace of a passed --check
        assert params["world_size"] == 2 and params["size_bytes"] in sizes_bytes(cfg)
        assert len(samples["time_ms"]) == (2 if params["size_bytes"] <= 4096 else 3)  # latency-bound: latency_iters
        assert all(bw > 0 for bw in samples["busbw_GBps"])
        if params["concurrent"]:
            assert params["concurrent"] == "all_reduce"
            assert (
                len(samples["slowdown"])
                == len(samples["alone_ms"])
                == len(samples["concurrent_ms"])
                == len(samples["time_ms"])
            )
            assert all(s > 0 for s in samples["slowdown"])
        else:
            assert "slowdown" not in samples
        if params["collective"] == "all_to_all_v":
            assert params["traffic_zipf"] == cfg.collectives.traffic_zipf
            assert 0 < record["metrics"]["algo_bytes"]["value"] <= params["world_size"] * params["size_bytes"]


def test_uneven_all_to_all_bandwidth_reduces_to_the_equal_one_on_uniform_traffic():
    """On a uniform matrix the bottleneck's off-rank bytes are S(n-1)/n: busbw equals all_to_all's."""
    n, size = 4, 4096
    splits = [[size // 4 // n] * n for _ in range(n)]
    coll = Collective("all_to_all_v", size, torch.empty(0), torch.empty(0), splits, None, 0)
    algo = bottleneck_bytes(coll)
    assert algo * bus_bandwidth_factor("all_to_all_v", n) == size * bus_bandwidth_factor("all_to_all", n)
    skewed = [[0, 10, 10, 10], [30, 0, 0, 0], [0, 0, 0, 30], [0, 0, 30, 0]]  # rank 2 receives 40 elements
    coll = Collective("all_to_all_v", 120, torch.empty(0), torch.empty(0), skewed, None, 0)
    assert bottleneck_bytes(coll) == 40 * 4
