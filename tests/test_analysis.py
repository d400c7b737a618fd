"""analysis/: tidy tables, the published-numbers registry, verdicts and figures, on synthetic records."""

from __future__ import annotations

import functools
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure

from analysis import collect as collect_mod
from analysis import compare as compare_mod
from analysis import figures as figures_mod
from analysis.collect import RecordError, collect
from analysis.compare import CONSISTENT, DIFFERS, NOT_COMPARABLE, NOT_REPRODUCED, compare
from analysis.figures import render
from analysis.published import RegistryError, load_registry
from analysis.registry import FIGURE_REGISTRY, REPRODUCERS, TABLE_REGISTRY, FigureDataError, reproducer
from experiments.impl.gshard import records as gshard_records
from moe_core.config.load import load_config
from moe_core.records.results import make_record, record_path, write_record
from moe_core.records.units import KiB, MiB

SHARE = 0.341  # Lina Table 1's 34.1 %: every synthetic point has this a2a share
SHARE_OF_MOE = 0.749  # Lina Fig 2's 74.9 %
SLOWDOWNS = [1.5, 1.8, 1.9, 2.0, 2.5]  # median 1.9 (Lina 1.83: consistent), max 2.5 (Lina 4.14: differs)
TABLE_FIGURES = sorted(name for name, fig in FIGURE_REGISTRY.items() if fig.reads == "tables")


def _spread(x: float) -> list[float]:
    """Three per-iteration samples with median ``x``."""
    return [0.98 * x, x, 1.02 * x]


def _write(root, **fields):
    record = make_record(config={}, **fields)
    return write_record(record, record_path(root, fields["paper"], fields["experiment"], fields["point"]))


def write_train_step(root, mode="measured", backend="gloo", hardware="local-cpu"):
    """2 world sizes × 2 experts per rank × 2 policies, one seed."""
    paths = []
    for world_size in (2, 4):
        for experts_per_rank in (1, 2):
            for policy in ("sequential", "overlap"):
                num_experts = world_size * experts_per_rank
                a2a = 0.5 * num_experts
                phases = {
                    "gate_ms": 0.4,
                    "dispatch_a2a_ms": a2a,
                    "expert_ms": 2.0,
                    "combine_a2a_ms": a2a,
                    "dense_ms": 3.0,
                    "allreduce_exposed_ms": 0.5 if policy == "overlap" else 1.5,
                }
                step = sum(phases.values())
                samples = {name: _spread(v) for name, v in phases.items()}
                samples |= {
                    "step_ms": _spread(step),
                    "a2a_ms": _spread(2 * a2a),
                    "loss": [3.0, 2.9, 2.8],
                    "a2a_share": _spread(SHARE),
                    "a2a_share_of_moe": _spread(SHARE_OF_MOE),
                }
                params = {
                    "world_size": world_size,
                    "num_experts": num_experts,
                    "experts_per_rank": experts_per_rank,
                    "policy": policy,
                    "seed": 0,
                    "expert_parallel": world_size,
                    "data_parallel": 1,
                    "top_k": 2,
                    "capacity_factor": 1.25,
                    "dropless": False,
                    "tokens_per_rank": 512,
                    "dtype": "float32",
                }
                paths.append(
                    _write(
                        root,
                        paper="gshard",
                        experiment="train_step",
                        point=f"ws{world_size}_e{num_experts}_{policy}_s0",
                        mode=mode,
                        backend=backend,
                        hardware=hardware,
                        params=params,
                        samples=samples,
                        extra_metrics={"a2a_bytes": 1e5 * num_experts, "tokens_per_s": 1e4},
                    )
                )
    return paths


def write_collectives(root, mode="measured", backend="gloo", hardware="local-cpu"):
    """Each collective alone at 4 sizes, and each all-to-all next to an all-reduce."""
    paths = []
    for collective, concurrent in [
        ("all_reduce", None),
        ("all_to_all", None),
        ("all_to_all_v", None),
        ("all_to_all", "all_reduce"),
        ("all_to_all_v", "all_reduce"),
    ]:
        for size in (64 * KiB, MiB, 16 * MiB, 64 * MiB):
            time_ms = 0.05 + size / 1e6
            samples = {
                "time_ms": _spread(time_ms),
                "algbw_GBps": _spread(size / time_ms / 1e6),
                "busbw_GBps": _spread(0.75 * size / time_ms / 1e6),
            }
            if concurrent:
                # small messages: a huge slowdown that the >= 1 MiB filter must drop
                slowdown = [10.0] if size < MiB else SLOWDOWNS
                samples |= {
                    "alone_ms": [time_ms] * len(slowdown),
                    "concurrent_ms": [time_ms] * len(slowdown),
                    "slowdown": slowdown,
                }
            params = {"collective": collective, "world_size": 4, "size_bytes": size, "concurrent": concurrent}
            point = f"{collective}_{concurrent or 'alone'}_ws4_{size}"
            paths.append(
                _write(
                    root,
                    paper="common",
                    experiment="collectives",
                    point=point,
                    mode=mode,
                    backend=backend,
                    hardware=hardware,
                    params=params,
                    samples=samples,
                )
            )
    return paths


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return collect(write_train_step(root) + write_collectives(root))


def write_sim_train_step(root):
    """Simulated points on two clusters, 8 and 16 GPUs, both policies; overlap has slowdown samples."""
    paths = []
    for hardware in ("lina-a100-4x4", "h100-ndr-cluster"):
        for world_size in (8, 16):
            for policy in ("sequential", "overlap"):
                samples = {"step_ms": [100.0], "a2a_share": [0.3 + world_size / 100]}
                if policy == "overlap":
                    samples["a2a_bwd_slowdown"] = [1.0, 1.2, 1.9, 2.4]
                params = {
                    "world_size": world_size,
                    "num_experts": world_size,
                    "experts_per_rank": 1,
                    "policy": policy,
                    "seed": 0,
                }
                paths.append(
                    _write(
                        root,
                        paper="lina",
                        experiment="sim_train_step",
                        point=f"{hardware}_ws{world_size}_{policy}",
                        mode="simulated",
                        backend="sim",
                        hardware=hardware,
                        params=params,
                        samples=samples,
                    )
                )
    return paths


def write_lina(root):
    """Lina's simulated policies at 4 and 8 experts (= GPUs) and the partition sweep at 8, on Lina's
    testbed; and its inference, measured and simulated, one record per placement policy."""
    paths = []
    sim = {
        "paper": "lina",
        "experiment": "sim_train_step",
        "mode": "simulated",
        "backend": "sim",
        "hardware": "lina-a100-4x4",
    }
    runs = [(e, policy, 30.0) for e in (4, 8) for policy in ("overlap", "lina-priority", "lina-pipeline", "lina")]
    for experts, policy, partition in runs + [(8, "lina", 10.0), (8, "lina", 50.0)]:
        speed = 1.0 if policy == "overlap" else 1.2 + partition / 1000
        params = {
            "world_size": experts,
            "num_experts": experts,
            "experts_per_rank": 1,
            "policy": policy,
            "seed": 0,
            "partition_mb": partition,
        }
        samples = {
            "step_ms": [100.0 / speed],
            "moe_layer_ms": [60.0 / speed],
            "a2a_bwd_ms": [20.0 / speed],
            "moe_layer_fwd_ms": [20.0 / speed],
            "moe_layer_bwd_ms": [40.0 / speed],
        }
        paths.append(
            _write(root, **sim, point=f"lina_ws{experts}_{policy}_p{partition:g}", params=params, samples=samples)
        )
    testbeds = [("", "measured", "gloo", "local-cpu"), ("sim_", "simulated", "sim", "lina-a100-4x4")]
    policies = (("ideal", 1.0), ("static", 1.4), ("lina", 1.1), ("lina-no-estimation", 1.2))
    for (prefix, mode, backend, hardware), (policy, norm) in itertools.product(testbeds, policies):
        params = {"world_size": 4, "num_experts": 4, "path_length": 3, "policy": policy, "seed": 0, "moe_layers": 2}
        paths.append(
            _write(
                root,
                paper="lina",
                experiment="inference",
                point=f"{prefix}inference_{policy}",
                mode=mode,
                backend=backend,
                hardware=hardware,
                params=params,
                samples={
                    "moe_layer_norm": [norm, norm * 1.1, norm * 1.3],
                    "moe_layer_ms": [10 * norm, 11 * norm, 13 * norm],
                    "forward_ms": [20 * norm, 21 * norm, 23 * norm],
                    "a2a_layer0_ms": [2 * norm] * 3,
                    "a2a_layer1_ms": [3 * norm] * 3,
                },
            )
        )
    return paths


def write_dispatchers(root):
    """The dispatcher study: two skews x three paths, measured and simulated."""
    paths = []
    for experiment, mode, backend, hardware in (
        ("dispatchers", "measured", "gloo", "local-cpu"),
        ("dispatchers_sim", "simulated", "sim", "monta-a800-2x8"),
    ):
        for skew, imbalance in (("uniform", 1.0), ("zipf:1.0", 2.0)):
            for path, ms in (("capacity", 5.0), ("dropless", 4.0 * imbalance), ("allgather", 9.0)):
                params = {"skew": skew, "path": path, "world_size": 4, "tensor_parallel": 1}
                metrics = {"imbalance": imbalance, "dropped_fraction": 0.1 * (imbalance - 1) * (path == "capacity")}
                samples = {"exchange_ms": _spread(ms)} if mode == "measured" else {}
                if mode == "simulated":
                    metrics["exchange_ms"] = ms
                else:
                    metrics["wrong_rows"] = 0  # the measured study's correctness gate passed
                    metrics.update(exchange_ms_ci95_low=0.9 * ms, exchange_ms_ci95_high=1.1 * ms)
                point = f"{skew}_{path}"
                paths.append(
                    _write(
                        root,
                        paper="common",
                        experiment=experiment,
                        point=point,
                        mode=mode,
                        backend=backend,
                        hardware=hardware,
                        params=params,
                        samples=samples,
                        extra_metrics=metrics,
                    )
                )
    return paths


def write_external_validation(root):
    """Three published measurements on two profiles with the simulator's predictions (one within 15%)."""
    paths = []
    for point, hardware, published, low, predicted in (
        ("nccl-a", "h100-ndr-cluster", 370.0, 360.0, 450.0),
        ("nccl-b", "h100-ndr-cluster", 48.5, 48.0, 50.0),
        ("deepep-c", "h800-cx7-cluster", 58.0, 44.0, 32.0),
    ):
        metrics = {"published": published, "published_low": low, "published_high": published}
        metrics.update(predicted=predicted, rel_error=predicted / published - 1, predicted_ms=1.0)
        paths.append(
            _write(
                root,
                paper="common",
                experiment="external_validation",
                point=point,
                mode="simulated",
                backend="sim",
                hardware=hardware,
                params={"what": f"measurement {point}", "kind": "nccl-tests", "measure": "busbw_GBps"},
                samples={},
                extra_metrics=metrics,
            )
        )
    return paths


def write_monta(root):
    """MoNTA's records: simulated steps (dispatches vs tp, chunks, layouts, flat vs hierarchical), the
    performance model's ranking and chunk curve, and the measured exchange; on one testbed at the
    chosen 4 NICs per node, the abstract's layout and the chunk curve again at 8 (``unstated``)."""
    paths = []
    hw = "monta-a800-2x8"
    sim = {"paper": "monta", "experiment": "sim_train_step", "mode": "simulated", "backend": "sim", "hardware": hw}
    model = {"paper": "monta", "mode": "simulated", "backend": "model", "hardware": hw, "samples": {}}
    base = {"world_size": 16, "num_experts": 2, "moe_layers": 10, "a2a_algorithm": "flat", "tp_chunks": 0}
    layouts = [(tp, ep, path) for tp in (1, 2, 4, 8) for ep in (1, 2) for path in ("duplicate", "drop-gather", "monta")]
    for nics, setting in ((4, None), (8, "hardware.nics_per_node=8")):
        varied = {"unstated": setting} if setting else {}
        for tp, ep, path in layouts:
            if (tp == 1 and path != "drop-gather") or (setting and (tp, ep) != (8, 2)):
                continue
            exchange = {"duplicate": 4.0 * tp, "drop-gather": 4.0, "monta": 3.0}[path] / nics
            for chunks in (0, 1, 4) if (tp, ep, path, setting) == (8, 2, "monta", None) else (0,):
                params = {**base, "tensor_parallel": tp, "expert_parallel": ep, "data_parallel": 16 // (tp * ep)}
                params.update(tp_dispatch=path, tp_chunks=chunks, **varied)
                samples = {"a2a_ms": [40 * exchange * (1 + chunks / 10)], "step_ms": [1000 + 40 * exchange]}
                samples.update(expert_ms=[500.0], gate_ms=[50.0], dense_ms=[400.0], allreduce_exposed_ms=[10.0])
                point = f"{hw}_tp{tp}_ep{ep}_{path}_n{chunks}_nics{nics}"
                paths.append(_write(root, **sim, point=point, params=params, samples=samples))
        for n in (1, 2, 4, 8):
            params = {"tensor_parallel": 8, "expert_parallel": 2, "chunks": n, **varied}
            metrics = {"model_exchange_ms": 1.0 / n + 0.1 * n * nics / 4, "chosen": float(n == 16 // nics)}
            point = f"{hw}_n{n}_nics{nics}"
            paths.append(
                _write(root, **model, experiment="monta_chunk_model", point=point, params=params, extra_metrics=metrics)
            )
    for nodes, algorithm in ((2, "flat"), (2, "hierarchical"), (4, "flat"), (4, "hierarchical")):
        params = {**base, "world_size": 8 * nodes, "num_experts": 8 * nodes, "tensor_parallel": 1}
        params.update(expert_parallel=8 * nodes, data_parallel=1, tp_dispatch="drop-gather", a2a_algorithm=algorithm)
        samples = {"a2a_ms": [100.0 * nodes * (1.1 if algorithm == "hierarchical" else 1.0)], "step_ms": [2000.0]}
        point = f"{hw}-n{nodes}_{algorithm}"
        paths.append(_write(root, **sim, point=point, params=params, samples=samples))
    for rank, (tp, ep) in enumerate([(8, 2), (1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1)], start=1):
        params = {"world_size": 16, "tensor_parallel": tp, "expert_parallel": ep, "data_parallel": 16 // (tp * ep)}
        metrics = {"model_exchange_ms": 0.1 * tp * ep, "inter_node_bytes": 1e6 * (tp == 8), "memory_GB": 75.0}
        metrics.update(fits=float(rank == 1), model_rank=rank, chunks=4.0, model_a2a_ms=0.1, model_allgather_ms=0.1)
        point = f"{hw}_tp{tp}_ep{ep}"
        paths.append(
            _write(root, **model, experiment="monta_strategy", point=point, params=params, extra_metrics=metrics)
        )
    measured = {
        "paper": "monta",
        "experiment": "monta_a2a",
        "mode": "measured",
        "backend": "gloo",
        "hardware": "local-cpu",
    }
    for tp, path in ((1, "flat"), (2, "duplicate"), (2, "drop-gather"), (2, "monta-n2"), (2, "monta-n4")):
        params = {"world_size": 4, "tensor_parallel": tp, "expert_parallel": 4 // tp, "path": path}
        point = f"ws4_tp{tp}_{path}"
        paths.append(_write(root, **measured, point=point, params=params, samples={"exchange_ms": _spread(10.0 + tp)}))
    return paths


def write_aurora(root):
    """Aurora's simulated experiments (two workloads, two networks) and its measured ordered all-to-all."""
    paths, workloads, pairs = [], ("gating-z1", "zipf-1"), ("gating-z1+zipf-1", "zipf-1+gating-z1")
    sim = {"paper": "aurora", "mode": "simulated", "backend": "sim"}
    hardware = {"homogeneous": "aurora-bigswitch-100g", "heterogeneous": "aurora-bigswitch-hetero"}
    for net, hw in hardware.items():
        for w in workloads:
            for policy in ("naive", "sjf", "aurora", "exact"):
                paths.append(
                    _write(
                        root,
                        **sim,
                        experiment="aurora_order",
                        point=f"{net}_{w}_{policy}",
                        hardware=hw,
                        params={"network": net, "workload": w, "layer": 1, "policy": policy},
                        samples={"a2a_over_lower_bound": [1.0 if policy == "exact" else 1.2]},
                    )
                )
        for deployment in ("exclusive", "colocated"):
            setting = f"{deployment}-{net}"
            for w in workloads if deployment == "exclusive" else pairs:
                for policy in ("aurora", "lina", "aurora-exclusive"):
                    samples = {"inference_ms": [1.0], "gpu_utilisation": [0.1]}
                    if policy == "lina":
                        samples["aurora_speedup"] = [1.3, 1.5]
                    params = {
                        "setting": setting,
                        "deployment": deployment,
                        "network": net,
                        "workload": w,
                        "policy": policy,
                    }
                    paths.append(
                        _write(
                            root,
                            **sim,
                            experiment="aurora_deployment",
                            point=f"{setting}_{w}_{policy}",
                            hardware=hw,
                            params=params,
                            samples=samples,
                        )
                    )
                for level in (0.0, 0.5):
                    params = {
                        "setting": setting,
                        "workload": w,
                        "imprecision": level,
                        "baseline": "rga",
                        "policy": "aurora",
                    }
                    paths.append(
                        _write(
                            root,
                            **sim,
                            experiment="aurora_imprecision",
                            point=f"{setting}_{w}_p{level}",
                            hardware=hw,
                            params=params,
                            samples={"aurora_speedup": [1.4 - level / 2]},
                        )
                    )
    gaps = {"exclusive-heterogeneous": 1.0, "colocated-homogeneous": 1.0, "colocated-heterogeneous": 1.05}
    for setting, gap in gaps.items():
        net = setting.split("-")[1]
        for w in workloads if setting.startswith("exclusive") else pairs:
            params = {"workload": w, "layer": 1, "n_gpus": 4, "network": net, "policy": "aurora", "setting": setting}
            paths.append(
                _write(
                    root,
                    **sim,
                    experiment="aurora_gap",
                    point=f"{setting}_{w}",
                    hardware=hardware[net],
                    params=params,
                    samples={"gap_to_optimum": [gap], "simulated_gap": [1.02]},
                )
            )
    for w in pairs:
        for policy in ("library", "aurora"):
            paths.append(
                _write(
                    root,
                    paper="aurora",
                    experiment="aurora_a2a",
                    point=f"{w}_{policy}",
                    mode="measured",
                    backend="gloo",
                    hardware="local-cpu",
                    params={"workload": w, "policy": policy, "world_size": 4},
                    samples={"a2a_ms": _spread(5.0)},
                )
            )
    return paths


AXONN_GRIDS = [(4, 1, 1, 1), (2, 2, 1, 1), (2, 1, 2, 1), (1, 2, 2, 1), (1, 1, 2, 2), (1, 4, 1, 1)]
AXONN_MODELS = [("5B", 64), ("10B", 128), ("20B", 256), ("40B", 512), ("80B", 1024)]


def _grid_params(grid):
    return dict(zip(("grid_data", "grid_depth", "grid_row", "grid_col"), grid))


def _grid_name(grid):
    return "data{}xdepth{}xrow{}xcol{}".format(*grid)


def write_axonn_grids(root, measured_ms, predicted_ms, hardware="local-cpu"):
    """AxoNN's measured sweep on 4 ranks: each of AXONN_GRIDS without overlap, communication
    ``measured_ms[i]`` per step (the grid's and the DP all-reduce's halves); then every overlap
    variant on 1x2x2x1, each hiding a little more. Each point's prediction, the model's
    ``predicted_ms[i]``, is a simulated record of its own with the same point name and params."""
    measured = {"paper": "axonn", "experiment": "axonn_grids", "mode": "measured", "backend": "gloo"}
    predictions = {"paper": "axonn", "experiment": "axonn_grid_predictions", "mode": "simulated", "backend": "model"}
    points = [(grid, "none", comm, pred) for grid, comm, pred in zip(AXONN_GRIDS, measured_ms, predicted_ms)]
    variants = ("all_reduce", "reduce_scatter", "all_gather", "all", "all+cache")
    points += [((1, 2, 2, 1), v, measured_ms[3] * (1 - i / 10), predicted_ms[3]) for i, v in enumerate(variants, 1)]
    paths = []
    for grid, variant, comm, pred in points:
        grid_ms = {kind: comm / 6 for kind in ("all_gather", "all_reduce", "reduce_scatter")}
        samples = {f"grid_{kind}_ms": _spread(ms) for kind, ms in grid_ms.items()}
        samples |= {"grid_comm_ms": _spread(comm / 2), "allreduce_exposed_ms": _spread(comm / 2)}
        samples |= {"comm_ms": _spread(comm), "step_ms": _spread(100.0 + comm), "dense_ms": _spread(100.0)}
        point = {"point": f"ws4_{_grid_name(grid)}_{variant}", "hardware": hardware}
        point["params"] = {"world_size": 4, **_grid_params(grid), "overlap_variant": variant}
        paths.append(_write(root, **measured, **point, samples=samples, extra_metrics={"tokens_per_s": 1e3}))
        predicted = {"predicted_comm_ms": pred, "predicted_all_gather_depth_ms": pred / 2}
        paths.append(_write(root, **predictions, **point, samples={}, extra_metrics=predicted))
    return paths


def write_axonn(root):
    """AxoNN's records: the measured sweep (the model ranks the grids as measured), and simulated on
    Perlmutter: weak scaling with the abstract's 80B numbers (AxoNN 1.26x faster, 57% of peak,
    182 PFLOP/s), the 2B ablation (no overlap 1.53x slower than all three) and the 80B ranking."""
    paths = write_axonn_grids(root, [10.0 * (i + 1) for i in range(6)], [2.0 * (i + 1) for i in range(6)])
    sim = {"paper": "axonn", "mode": "simulated", "backend": "sim", "hardware": "axonn-perlmutter", "samples": {}}
    for model, gpus in AXONN_MODELS:
        base = {"model": model, "parameters": 1e9 * float(model[:-1]), "gpus": gpus}
        share = 0.57 if model == "80B" else 0.5
        runs = [
            ("axonn", {**_grid_params((4, 32, 8, 1))}, 1.0, share),
            ("megatron", {"tp": 4, "pp": 16, "dp": 16, "microbatches": 64}, 1.26, share / 1.26),
        ]
        for system, layout, batch_s, peak in runs:
            metrics = {"batch_s": batch_s, "pflops": 182.0 * peak / 0.57, "peak_share": peak}
            if system == "axonn":  # each collective 300 ms in flight, 100 ms of it exposed
                metrics |= {f"grid_{k}_busy_ms": 300.0 for k in ("all_gather", "all_reduce", "reduce_scatter")}
                metrics |= {f"grid_{k}_ms": 100.0 for k in ("all_gather", "all_reduce", "reduce_scatter")}
                metrics["allreduce_exposed_ms"] = 50.0
            paths.append(
                _write(
                    root,
                    **sim,
                    experiment="axonn_scaling",
                    point=f"{model}_{system}",
                    params={**base, "system": system, **layout},
                    extra_metrics=metrics,
                )
            )
    for variant, step in (("none", 153.0), ("all_reduce", 130.0), ("reduce_scatter", 140.0), ("all", 100.0)):
        metrics = {"step_ms": step, "grid_comm_ms": step - 90.0, "allreduce_exposed_ms": 0.0, "dense_ms": 90.0}
        metrics |= {f"grid_{kind}_ms": (step - 90.0) / 3 for kind in ("all_gather", "all_reduce", "reduce_scatter")}
        params = {"model": "2B", "gpus": 64, "overlap_variant": variant, **_grid_params((4, 4, 4, 1))}
        paths.append(
            _write(
                root, **sim, experiment="axonn_ablation", point=f"2B_{variant}", params=params, extra_metrics=metrics
            )
        )
    for rank, grid in enumerate([(4, 32, 8, 1), (2, 64, 8, 1), (8, 32, 4, 1), (16, 64, 1, 1)], start=1):
        metrics = {"predicted_comm_s": 3.0 + rank, "all_gather_depth_s": 2.0, "all_reduce_row_s": 1.0 + rank}
        metrics |= {"all_reduce_col_s": 0.0, "memory_GB": 30.0, "model_rank": float(rank)}
        if rank <= 2:
            metrics |= {"sim_step_ms": 9000.0, "sim_comm_ms": 1000.0 * (3.2 + rank)}
        params = {"model": "80B", "gpus": 1024, **_grid_params(grid)}
        paths.append(
            _write(
                root,
                **sim,
                experiment="axonn_ranking",
                point=f"80B_{_grid_name(grid)}",
                params=params,
                extra_metrics=metrics,
            )
        )
    return paths


def write_gshard(root):
    """GShard's scaling study as experiments/gshard.py simulates it, a few points of each experiment."""
    cfg = load_config(
        ["configs/default.yaml"],
        ["gshard.models=[2,4,6]", "gshard.memory_layers=[12,36]", "gshard.collective_partitions=[16,64,256]"],
    )
    return [
        write_record(record, record_path(root, record["paper"], record["experiment"], record["point"]))
        for record in gshard_records(cfg)
    ]


def write_external_steps(root):
    """Two published dense steps and one MoE step with the simulated ones."""
    paths = []
    rows = (("dense-a", "dense", 1.0, 1.1), ("dense-b", "dense", 2.0, 1.5), ("moe-c", "moe", 3.0, 3.3))
    for point, kind, published_s, predicted_s in rows:
        metrics = {"published": published_s, "predicted": predicted_s, "published_step_s": published_s}
        metrics.update(predicted_step_s=predicted_s, step_error=predicted_s / published_s - 1)
        paths.append(
            _write(
                root,
                paper="common",
                experiment="external_steps",
                point=point,
                mode="simulated",
                backend="sim",
                hardware="h100-ndr-cluster",
                params={"what": f"step {point}", "kind": kind, "gpu": "H100", "gpus": 8, "measure": "step_s"},
                samples={},
                extra_metrics=metrics,
            )
        )
    return paths


@pytest.fixture(scope="module")
def figure_tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("figures")
    return collect(
        write_train_step(root)
        + write_collectives(root)
        + write_sim_train_step(root)
        + write_aurora(root)
        + write_lina(root)
        + write_monta(root)
        + write_axonn(root)
        + write_gshard(root)
        + write_dispatchers(root)
        + write_external_validation(root)
        + write_external_steps(root)
    )


# ---- collect ----------------------------------------------------------------------------------


def test_collect_is_tidy(tables):
    records, samples = tables
    assert len(records["point"].unique()) == 8 + 20
    # one row per point × metric; params are columns, NA where a record lacks them
    assert not records.duplicated(["experiment", "point", "metric"]).any()
    assert {"world_size", "num_experts", "policy", "collective", "size_bytes", "concurrent"} <= set(records)
    assert records.loc[records["experiment"] == "collectives", "num_experts"].isna().all()
    step = records[(records["point"] == "ws4_e8_overlap_s0") & (records["metric"] == "step_ms")].iloc[0]
    assert step["n"] == 3 and step["value"] == step["median"] == pytest.approx(13.9)
    data = records[(records["point"] == "ws4_e8_overlap_s0") & (records["metric"] == "a2a_bytes")].iloc[0]
    assert data["value"] == 8e5 and data[["median", "p95", "n"]].isna().all()
    # one sample row per iteration
    slow = samples[(samples["point"] == "all_to_all_all_reduce_ws4_1048576") & (samples["metric"] == "slowdown")]
    assert list(slow["iteration"]) == [0, 1, 2, 3, 4] and list(slow["value"]) == SLOWDOWNS
    assert (slow["concurrent"] == "all_reduce").all() and (slow["size_bytes"] == MiB).all()


def test_collect_does_not_depend_on_the_order_of_its_files(tmp_path):
    """The workflow hands collect the records in the order its rules files declare them; the tables
    (and so every verdict) must not change when rules files are added or reordered."""
    paths = write_train_step(tmp_path) + write_collectives(tmp_path)
    forward, backward = collect(paths), collect(paths[::-1])
    for ours, theirs in zip(forward, backward):
        pd.testing.assert_frame_equal(ours, theirs, check_exact=True)


def test_collect_rejects_bad_json(tmp_path):
    good = write_train_step(tmp_path)[0]
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(RecordError, match="broken.json"):
        collect([good, bad])
    not_record = tmp_path / "list.json"
    not_record.write_text(json.dumps([1, 2]))
    with pytest.raises(RecordError, match="list.json"):
        collect([not_record])
    with pytest.raises(ValueError, match="no record files"):
        collect([])


def _edited_record(tmp_path, edit):
    """A valid train_step record file, changed by ``edit(record)`` and written back as JSON."""
    path = write_train_step(tmp_path)[0]
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))  # NaN and inf are written as JSON's NaN and Infinity
    return path


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r["metrics"]["step_ms"].update(median=math.nan), "metrics.step_ms.median"),
        (lambda r: r["metrics"]["a2a_bytes"].update(value=math.inf), "metrics.a2a_bytes.value"),
        (lambda r: r["metrics"]["a2a_bytes"].update(value="4e5"), "metrics.a2a_bytes.value"),
        (lambda r: r["metrics"]["step_ms"].update(p95=None), "metrics.step_ms.p95"),
        (lambda r: r["samples"]["step_ms"].__setitem__(1, math.nan), r"samples.step_ms\[1\]"),
        (lambda r: r["samples"]["a2a_ms"].__setitem__(0, "fast"), r"samples.a2a_ms\[0\]"),
        (lambda r: r.pop("hardware"), "hardware is missing"),
        (lambda r: r.update(mode="guessed"), "mode = 'guessed'"),
    ],
)
def test_collect_names_the_file_and_field_of_a_bad_metric(tmp_path, edit, field):
    """A NaN, infinite or text metric would drop out of a mean, and its point count, unnoticed."""
    path = _edited_record(tmp_path, edit)
    with pytest.raises(RecordError, match=rf"{path.name}: {field}"):
        collect([path])


def test_collect_cli_writes_nothing_on_error(tmp_path, capsys):
    good = write_train_step(tmp_path)[0]
    bad = tmp_path / "broken.json"
    bad.write_text("{}")
    out = tmp_path / "tables"
    args = ["--out-records", str(out / "records.csv"), "--out-samples", str(out / "samples.csv")]
    with pytest.raises(SystemExit) as exit_info:
        collect_mod.main([*args, str(good), str(bad)])
    assert exit_info.value.code != 0 and "broken.json" in str(exit_info.value.code)
    assert not out.exists()
    collect_mod.main([*args, str(good)])
    assert (out / "records.csv").is_file() and (out / "samples.csv").is_file()


# ---- registry and comparison ------------------------------------------------------------------


def test_shipped_registry_is_valid():
    registry = load_registry()
    assert registry["lina-fig3-a2a-slowdown-median"]["value"] == 1.83
    assert registry["lina-table1-a2a-share-of-step-secondary"]["status"] == "DER"
    named = {e["reproducer"] for e in registry.values()} - {None}
    assert named <= set(REPRODUCERS)


def _registry_file(tmp_path, entries, testbeds=("local-cpu", "a100-ib")):
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump({"testbeds": {"lina": list(testbeds)}, "numbers": entries}))
    return path


def _entry(entry_id, value, reproducer):
    return {
        "id": entry_id,
        "paper": "lina",
        "figure": "Fig 3",
        "metric": "m",
        "setting": "s",
        "value": value,
        "unit": "x",
        "source": "url",
        "status": "FT",
        "reproducer": reproducer,
    }


def test_registry_validation(tmp_path):
    with pytest.raises(RegistryError, match="duplicate id 'a'"):
        load_registry(_registry_file(tmp_path, [_entry("a", 1.0, None), _entry("a", 2.0, None)]))
    no_status = _entry("b", 1.0, None)
    del no_status["status"]
    with pytest.raises(RegistryError, match=r"'b'.*missing key 'status'"):
        load_registry(_registry_file(tmp_path, [no_status]))
    with pytest.raises(RegistryError, match="'status'"):
        load_registry(_registry_file(tmp_path, [{**_entry("c", 1.0, None), "status": "maybe"}]))


def test_compare_verdicts(tmp_path, tables):
    registry = load_registry(
        _registry_file(
            tmp_path,
            [
                _entry("near", 1.83, "lina_fig3_slowdown_median"),  # 1.9 / 1.83 = 1.04
                _entry("far", 4.14, "lina_fig3_slowdown_worst"),  # 2.5 / 4.14 = 0.60
                _entry("share", 34.1, "lina_table1_training_a2a_share"),
                _entry("none", 1.71, None),
            ],
        )
    )
    table = compare(registry, *tables).set_index("id")
    assert table.loc["near", "verdict"] == CONSISTENT and table.loc["near", "reproduced"] == 1.9
    assert table.loc["near", "reproduced_setting"] == "local-cpu gloo, 4 ranks, 1 MiB–64 MiB, 15 samples"
    assert table.loc["far", "verdict"] == DIFFERS and table.loc["far", "ratio"] == pytest.approx(2.5 / 4.14)
    assert table.loc["share", "verdict"] == CONSISTENT
    assert table.loc["share", "reproduced"] == pytest.approx(34.1) and table.loc["share", "mode"] == "measured"
    assert table.loc["none", "verdict"] == NOT_REPRODUCED
    assert table.loc[["none"], ["reproduced", "ratio", "mode"]].isna().all(axis=None)


@functools.partial(reproducer, name="test_mean_a2a_share")
def _mean_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str]:
    """Every point's a2a_share, pooled: what compare() lets a reproducer see."""
    rows = records[records["metric"] == "a2a_share"]
    return 100 * float(rows["value"].mean()), f"{len(rows)} points"


def test_registry_rejects_bad_like_for_like_keys(tmp_path):
    with pytest.raises(RegistryError, match="'bound' is 'above'"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "bound": "above"}]))
    with pytest.raises(RegistryError, match="'not_comparable' must say why"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "not_comparable": ""}]))
    with pytest.raises(RegistryError, match=r"'a'.*no testbed.*testbeds: \{aurora"):
        load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "paper": "aurora"}]))
    own = load_registry(_registry_file(tmp_path, [{**_entry("a", 1.0, None), "testbed": ["x"]}]))
    assert own["a"]["testbed"] == ["x"]  # the entry's own testbed over its paper's


def test_compare_judges_only_like_for_like(tmp_path, tables):
    """A reproduction off the paper's testbed, or of an entry no run matches, keeps its value but gets
    no verdict; a published bound is met by anything beyond it."""
    entries = [
        _entry("elsewhere", 1.83, "lina_fig3_slowdown_median"),
        {**_entry("unlike", 1.83, "lina_fig3_slowdown_median"), "not_comparable": "another model"},
        {**_entry("unlike-none", 1.83, None), "not_comparable": "a GPU counter"},
        {**_entry("at-least", 1.0, "lina_fig3_slowdown_median"), "bound": "lower"},  # 1.9 is above 1
        {**_entry("at-most", 1.0, "lina_fig3_slowdown_median"), "bound": "upper"},
    ]
    registry = load_registry(_registry_file(tmp_path, entries, testbeds=["lina-a100-4x4"]))
    registry["at-least"]["testbed"] = registry["at-most"]["testbed"] = ["local-cpu"]
    table = compare(registry, *tables).set_index("id")
    assert table.loc["elsewhere", "verdict"] == NOT_COMPARABLE and table.loc["elsewhere", "reproduced"] == 1.9
    assert table.loc["elsewhere", "reason"].startswith("measured on local-cpu, not on the paper's testbed")
    assert table.loc["unlike", "verdict"] == NOT_COMPARABLE and table.loc["unlike", "reason"] == "another model"
    assert table.loc["unlike-none", "verdict"] == NOT_COMPARABLE and pd.isna(table.loc["unlike-none", "reproduced"])
    assert table.loc["at-least", "verdict"] == CONSISTENT and pd.isna(table.loc["at-least", "reason"])
    assert table.loc["at-most", "verdict"] == DIFFERS  # 1.9 > 1.0 x (1 + 0.25)


def test_compare_counts_the_points_it_used(tmp_path, tables):
    """Points whose value is missing or not finite are not used, and the reproduced setting's count says so."""
    records, samples = tables
    registry = load_registry(
        _registry_file(
            tmp_path,
            [_entry("share", 34.1, "test_mean_a2a_share"), _entry("slow", 1.83, "lina_fig3_slowdown_median")],
        )
    )
    nan_row, inf_row, missing_row, high_row = records.index[records["metric"] == "a2a_share"][:4]
    records = records.copy()
    records.loc[nan_row, "value"] = np.nan  # an empty cell of records.csv
    records.loc[inf_row, "value"] = np.inf
    records = records.drop(missing_row)  # a point without the metric
    records.loc[high_row, "value"] = 0.5  # used: 4 points of 0.341, one of 0.5
    slowdowns = samples[
        (samples["metric"] == "slowdown") & (samples["size_bytes"] >= MiB) & (samples["collective"] == "all_to_all")
    ].index
    samples = samples.copy()
    samples.loc[slowdowns[:2], "value"] = np.nan
    table = compare(registry, records, samples).set_index("id")
    assert table.loc["share", "reproduced"] == pytest.approx(100 * (4 * SHARE + 0.5) / 5)
    assert table.loc["share", "reproduced_setting"] == "5 points"
    assert table.loc["slow", "reproduced_setting"].endswith(", 13 samples")


def test_compare_keeps_testbeds_apart(tmp_path):
    measured = write_train_step(tmp_path / "m")
    simulated = write_train_step(tmp_path / "s", mode="simulated", backend="sim", hardware="a100-ib")
    registry = load_registry(_registry_file(tmp_path, [_entry("share", 34.1, "lina_table1_training_a2a_share")]))
    table = compare(registry, *collect(measured + simulated))
    assert sorted(table["mode"]) == ["measured", "simulated"]
    assert (table["verdict"] == CONSISTENT).all()


def test_compare_verdicts_the_chosen_values_and_ranges_the_unstated_ones(tmp_path):
    """Records of sensitivity runs (param ``unstated``) never enter the verdict; the same reproducer on
    each run gives the reproduced range beside it."""
    paths = []
    for setting, share in ((None, 0.34), ("hardware.intra_node_GBps=240", 0.10), ("lina.x=1", 0.50)):
        params = {"world_size": 4, "num_experts": 4, "experts_per_rank": 1, "policy": "overlap", "seed": 0}
        params |= {"unstated": setting} if setting else {}
        paths.append(
            _write(
                tmp_path,
                paper="gshard",
                experiment="sim_train_step",
                point=f"p_{share}",
                mode="simulated",
                backend="sim",
                hardware="a100-ib",
                params=params,
                samples={"a2a_share": [share], "step_ms": [100.0]},
            )
        )
    registry = load_registry(_registry_file(tmp_path, [_entry("share", 34.0, "lina_table1_training_a2a_share")]))
    row = compare(registry, *collect(paths)).iloc[0]
    assert row["reproduced"] == pytest.approx(34.0) and row["verdict"] == CONSISTENT
    assert (row["reproduced_low"], row["reproduced_high"]) == pytest.approx((10.0, 50.0))
    assert row["unstated"] == "hardware.intra_node_GBps=240; lina.x=1"
    chosen = compare(registry, *collect(paths[:1])).iloc[0]
    assert chosen["reproduced_low"] == chosen["reproduced_high"] == chosen["reproduced"]
    assert pd.isna(chosen["unstated"])


def test_compare_rejects_unknown_reproducer(tmp_path, tables):
    registry = load_registry(_registry_file(tmp_path, [_entry("x", 1.0, "no_such_function")]))
    with pytest.raises(ValueError, match="no_such_function"):
        compare(registry, *tables)


# ---- figures ----------------------------------------------------------------------------------


def test_figures_register_with_their_paper():
    """Each figure's paper is its folder results/figures/<paper>/ in the workflow; each has a report caption."""
    papers = {name: fig.paper for name, fig in FIGURE_REGISTRY.items()}
    assert papers == {
        "step_breakdown": "gshard",
        "busbw_vs_size": "common",
        "sim_validation": "common",
        "verdicts": "common",
        "dispatchers_under_skew": "common",
        "dispatcher_winner_map": "common",
        "external_validation_errors": "common",
        "external_steps_errors": "common",
        **dict.fromkeys(
            [
                "a2a_share_vs_experts",
                "a2a_slowdown_cdf",
                "sim_a2a_share_vs_cluster_size",
                "sim_a2a_slowdown_cdf",
                "lina_step_speedup",
                "lina_moe_speedup",
                "lina_partition_sweep",
                "lina_inference",
                "lina_inference_simulated",
            ],
            "lina",
        ),
        **dict.fromkeys(
            [
                "aurora_order_speedup",
                "aurora_gpu_utilisation",
                "aurora_gap_to_optimum",
                "aurora_imprecision",
                "aurora_ordered_vs_library",
            ],
            "aurora",
        ),
        **dict.fromkeys(
            [
                "monta_a2a_vs_tp",
                "monta_chunks",
                "monta_iteration_breakdown",
                "monta_strategy_ranking",
                "monta_hierarchical",
            ],
            "monta",
        ),
        **dict.fromkeys(
            ["axonn_model_validation", "axonn_overlap_ablation", "axonn_weak_scaling", "axonn_grid_ranking"], "axonn"
        ),
        **dict.fromkeys(["gshard_runtime_breakdown", "gshard_collective_scaling", "gshard_memory"], "gshard"),
    }
    assert {name: fig.reads for name, fig in FIGURE_REGISTRY.items() if fig.reads != "tables"} == {
        "sim_validation": "validation",
        "verdicts": "comparison",
    }
    captions = Path(figures_mod.__file__).with_name("captions")
    assert all((captions / f"{name}.rst").is_file() for name in FIGURE_REGISTRY)


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_figure_renders_png_and_pdf(tmp_path, figure_tables, name):
    outputs = render(name, *figure_tables, tmp_path / "fig" / f"{name}.png")
    assert [p.name for p in outputs] == [f"{name}.png", f"{name}.pdf"]
    assert all(p.stat().st_size > 1000 for p in outputs)
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == sorted(p.name for p in outputs)


NEEDS = {
    "step_breakdown": "train_step",
    "a2a_share_vs_experts": "train_step",
    "a2a_slowdown_cdf": "collectives",
    "busbw_vs_size": "collectives",
    "sim_a2a_share_vs_cluster_size": "sim_train_step",
    "sim_a2a_slowdown_cdf": "sim_train_step",
    "aurora_order_speedup": "aurora_deployment",
    "aurora_gpu_utilisation": "aurora_deployment",
    "aurora_gap_to_optimum": "aurora_gap",
    "aurora_imprecision": "aurora_imprecision",
    "aurora_ordered_vs_library": "aurora_a2a",
    "lina_step_speedup": "sim_train_step",
    "lina_moe_speedup": "sim_train_step",
    "lina_partition_sweep": "sim_train_step",
    "lina_inference": "inference",
    "lina_inference_simulated": "inference",
    # MoNTA's figures draw measured and simulated panels: each needs all of its sources gone
    "monta_a2a_vs_tp": ("monta_a2a", "sim_train_step"),
    "monta_chunks": ("sim_train_step", "monta_chunk_model", "monta_a2a"),
    "monta_iteration_breakdown": ("sim_train_step", "train_step"),
    "monta_strategy_ranking": "monta_strategy",
    "monta_hierarchical": ("sim_train_step", "monta_a2a"),
    "dispatchers_under_skew": ("dispatchers", "dispatchers_sim"),
    "dispatcher_winner_map": "dispatchers_sim",
    "external_validation_errors": "external_validation",
    "external_steps_errors": "external_steps",
    "axonn_model_validation": "axonn_grids",
    "axonn_overlap_ablation": ("axonn_grids", "axonn_ablation"),
    "axonn_weak_scaling": "axonn_scaling",
    "axonn_grid_ranking": "axonn_ranking",
    "gshard_runtime_breakdown": "gshard_scaling",
    "gshard_collective_scaling": "gshard_collectives",
    "gshard_memory": "gshard_memory",
}


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_figure_without_data_raises_and_writes_nothing(tmp_path, figure_tables, name):
    records, samples = figure_tables
    needs = NEEDS[name] if isinstance(NEEDS[name], tuple) else (NEEDS[name],)
    with pytest.raises(FigureDataError):
        render(
            name,
            records[~records["experiment"].isin(needs)],
            samples[~samples["experiment"].isin(needs)],
            tmp_path / f"{name}.png",
        )
    assert not any(tmp_path.iterdir())


def test_winner_map_names_the_fastest_path_and_its_margin(figure_tables, monkeypatch):
    """The winner map's cells: per cluster, size and skew the fastest simulated path and its time over
    the runner-up's (the fixture: capacity 5 ms, dropless 4 x imbalance, allgather 9 ms)."""
    records, samples = figure_tables
    texts = []
    monkeypatch.setattr("matplotlib.axes.Axes.text", lambda self, x, y, s, **kw: texts.append(s))
    fig = Figure()
    FIGURE_REGISTRY["dispatcher_winner_map"].draw(records, samples, fig)
    # uniform (imbalance 1): dropless 4 ms beats capacity 5 ms; zipf (imbalance 2): capacity 5 ms beats
    # dropless 8 ms, and drops 10% of the tokens
    assert sorted(texts) == ["capacity 1.60x\ndrops 10%", "dropless 1.25x"]


def test_validation_figure_renders_and_needs_its_table(tmp_path, figure_tables):
    validation = pd.DataFrame(
        {
            "experiment": ["collectives", "train_step"],
            "setting": ["a", "b"],
            "hardware": ["local-cpu"] * 2,
            "measured_ms": [10.0, 200.0],
            "predicted_ms": [11.0, 180.0],
            "rel_error": [0.1, -0.1],
            "noisy": [False, True],
            "contention": [0.01, 0.6],
            "profile_noisy": [False, False],
        }
    )
    outputs = render("sim_validation", *figure_tables, tmp_path / "v.png", validation)
    assert all(p.stat().st_size > 1000 for p in outputs)
    with pytest.raises(ValueError, match="validation table"):
        render("sim_validation", *figure_tables, tmp_path / "w.png")


def test_figure_refuses_to_pool_testbeds(tmp_path):
    measured = write_train_step(tmp_path / "m")
    simulated = write_train_step(tmp_path / "s", mode="simulated", backend="sim", hardware="a100-ib")
    with pytest.raises(FigureDataError, match="several testbeds"):
        render("step_breakdown", *collect(measured + simulated), tmp_path / "out" / "step_breakdown.png")
    assert not (tmp_path / "out").exists()


def test_cli_pipeline_through_csv(tmp_path):
    """collect -> compare -> figures on the CSV files, as the workflow runs them."""
    raw = write_collectives(tmp_path / "results")
    tables = ["--records", str(tmp_path / "records.csv"), "--samples", str(tmp_path / "samples.csv")]
    collect_mod.main(["--out-records", tables[1], "--out-samples", tables[3], *map(str, raw)])
    compare_mod.main([*tables, "--out", str(tmp_path / "comparison.csv")])
    comparison = pd.read_csv(tmp_path / "comparison.csv").set_index("id")
    fig3 = comparison.loc["lina-fig3-a2a-slowdown-median"]  # measured here, not on Lina's A100s
    assert (
        fig3["verdict"] == NOT_COMPARABLE and "local-cpu, not on the paper's testbed (lina-a100-4x4)" in fig3["reason"]
    )
    # several figures in one call, as a paper's figures rule draws them: one --out per --figure
    pairs = [["--figure", "busbw_vs_size", "--out", str(tmp_path / "fig" / f"busbw{i}.png")] for i in range(2)]
    figures_mod.main([*tables, *pairs[0], *pairs[1]])
    assert all((tmp_path / "fig" / f"busbw{i}.pdf").is_file() for i in range(2))
    with pytest.raises(SystemExit):
        figures_mod.main([*tables, *pairs[0], "--figure", "busbw_vs_size"])
    with pytest.raises(SystemExit) as exit_info:  # no train_step records in these tables
        figures_mod.main([*tables, "--figure", "step_breakdown", "--out", str(tmp_path / "fig" / "steps.png")])
    assert exit_info.value.code != 0 and not (tmp_path / "fig" / "steps.png").exists()
    # as the workflow runs it: `python -m` runs a second copy of the module, which must still see the papers'
    # reproducers (registered with analysis.compare)
    subprocess.run(
        [sys.executable, "-m", "analysis.compare", *tables, "--out", str(tmp_path / "m.csv")],
        check=True,
        capture_output=True,
        cwd=Path(compare_mod.__file__).parents[1],
    )
    assert pd.read_csv(tmp_path / "m.csv").equals(pd.read_csv(tmp_path / "comparison.csv"))


# ---- Lina's reproducers on known synthetic inputs ----------------------------------------------


def _lina_sim_tables(root, experts=(2, 4, 8, 16), with_pass_times=True):
    """Simulated overlap and lina at each expert count on Lina's testbed; lina is 1.25x faster per
    step, 1.5x in the MoE forward, 2x in the backward, and its compute share is 0.6 vs overlap's 0.5."""
    paths = []
    sim = {
        "paper": "lina",
        "experiment": "sim_train_step",
        "mode": "simulated",
        "backend": "sim",
        "hardware": "lina-a100-4x4",
    }
    for n in experts:
        for policy, step, fwd, bwd, share in (("overlap", 100.0, 30.0, 80.0, 0.5), ("lina", 80.0, 20.0, 40.0, 0.6)):
            samples = {"step_ms": [step]}
            if with_pass_times:
                samples |= {"moe_layer_fwd_ms": [fwd], "moe_layer_bwd_ms": [bwd], "moe_compute_share": [share]}
            params = {
                "world_size": n,
                "num_experts": n,
                "experts_per_rank": 1,
                "policy": policy,
                "seed": 0,
                "partition_mb": 30.0,
            }
            paths.append(_write(root, **sim, point=f"ws{n}_{policy}", params=params, samples=samples))
    return collect(paths)


def test_lina_training_reproducers_give_known_ratios(tmp_path):
    records, samples = _lina_sim_tables(tmp_path)
    for name, expected in [
        ("lina_fig11_moe_fwd_speedup_2e", 1.5),
        ("lina_fig11_moe_fwd_speedup_8e", 1.5),
        ("lina_fig12_moe_bwd_speedup_2e", 2.0),
        ("lina_fig12_moe_bwd_speedup_8e", 2.0),
        ("lina_fig10_step_speedup_mean", 1.25),
        ("lina_fig12_moe_utilisation_gain_16e", 20.0),
    ]:
        value, setting = REPRODUCERS[name](records, samples)
        assert value == pytest.approx(expected), name
        assert "lina-a100-4x4 sim" in setting
    # no per-pass times (older records), or not every expert count of Fig 10's mean: no row
    records, samples = _lina_sim_tables(tmp_path / "old", experts=(2, 4, 8), with_pass_times=False)
    for name in (
        "lina_fig11_moe_fwd_speedup_2e",
        "lina_fig12_moe_bwd_speedup_8e",
        "lina_fig10_step_speedup_mean",
        "lina_fig12_moe_utilisation_gain_16e",
    ):
        assert REPRODUCERS[name](records, samples) is None, name


def _inference_tables(root, experts=16):
    """Measured inference at ``experts`` experts, path length 3, with constant samples (median = p95):
    forward time static 20, lina 10, no-estimation 12, no-finetune 13, ideal 8 ms; MoE layers static
    30, lina 20 ms; all-to-all per layer static (4, 9), lina (2, 3) ms; and a path length 1 run whose
    numbers must be ignored."""
    forward = {"ideal": 8.0, "static": 20.0, "lina": 10.0, "lina-no-estimation": 12.0, "lina-no-finetune": 13.0}
    moe = {"ideal": 5.0, "static": 30.0, "lina": 20.0, "lina-no-estimation": 22.0, "lina-no-finetune": 25.0}
    layers = {"static": (4.0, 9.0), "lina": (2.0, 3.0)}
    paths = []
    for path_length in (3, 1):
        for policy, forward_ms in forward.items():
            scale = 1.0 if path_length == 3 else 5.0 if policy == "static" else 1.0
            samples = {"forward_ms": [scale * forward_ms] * 3, "moe_layer_ms": [scale * moe[policy]] * 3}
            for i, t in enumerate(layers.get(policy, (1.0, 1.0))):
                samples[f"a2a_layer{i}_ms"] = [scale * t] * 3
            extra = {"popularity_ratio": 5.0, "path_topk_share_k1": 0.4, "path_topk_share_k2": 0.55}
            if policy.startswith("lina"):
                extra |= {"replan_rate": 0.25, "schedule_decision_ms": 0.2, "phase2_check_ms": 0.05}
            params = {
                "world_size": 4,
                "num_experts": experts,
                "policy": policy,
                "path_length": path_length,
                "seed": 0,
                "moe_layers": 2,
                "data_zipf": 1.5,
            }
            paths.append(
                _write(
                    root,
                    paper="lina",
                    experiment="inference",
                    point=f"e{experts}_l{path_length}_{policy}",
                    mode="measured",
                    backend="gloo",
                    hardware="local-cpu",
                    params=params,
                    samples=samples,
                    extra_metrics=extra,
                )
            )
    return collect(paths)


INFERENCE_EXPECTED = {  # name: value at 16 experts
    "lina_fig16_median_reduction": 2.0,
    "lina_fig16_p95_reduction": 2.0,  # whole forward, not MoE layers (1.5)
    "lina_fig16_median_reduction_16e": 2.0,
    "lina_fig16_p95_reduction_16e": 2.0,
    "lina_fig16_no_estimation_median_worse_16e": 20.0,
    "lina_fig16_no_finetune_p95_worse_16e": 30.0,
    "lina_fig17_moe_p95_reduction_16e": 1.5,
    "lina_fig18_tail_a2a_reduction_mean": 2.5,
    "lina_fig18_tail_a2a_reduction_max": 3.0,  # layers: 2x, 3x
    "lina_fig6_popularity_ratio_16e": 5.0,
    "lina_fig9_next_layer_top1_share": 40.0,
    "lina_fig9_next_layer_top2_share": 55.0,
    "lina_inference_replan_rate": 25.0,
    "lina_s52_schedule_decision_ms": 0.2,
    "lina_s52_phase2_check_ms": 0.05,
}


def test_lina_inference_reproducers_give_known_ratios(tmp_path):
    records, samples = _inference_tables(tmp_path)
    for name, expected in INFERENCE_EXPECTED.items():
        value, setting = REPRODUCERS[name](records, samples)
        assert value == pytest.approx(expected), name
        assert "local-cpu gloo" in setting
    value, setting = REPRODUCERS["lina_fig16_median_reduction_16e"](records, samples)
    assert "16 experts on 4 ranks, path length 3" in setting and "2 MoE layers" in setting
    # other expert counts than the ones measured: no row
    for name in ("lina_fig16_median_reduction_4e", "lina_fig17_moe_p95_reduction_8e", "lina_fig6_popularity_ratio_4e"):
        assert REPRODUCERS[name](records, samples) is None, name
    records4, samples4 = _inference_tables(tmp_path / "e4", experts=4)
    assert REPRODUCERS["lina_fig16_median_reduction_4e"](records4, samples4)[0] == pytest.approx(2.0)
    assert REPRODUCERS["lina_fig18_tail_a2a_reduction_mean"](records4, samples4) is None  # Fig 18 is 16 experts


def test_lina_inference_reproducers_need_their_policies(tmp_path):
    records, samples = _inference_tables(tmp_path)
    no_lina = records[records["policy"] != "lina"]
    for name in INFERENCE_EXPECTED:
        if not name.startswith(("lina_fig6", "lina_fig9")):  # those read static's record
            assert REPRODUCERS[name](no_lina, samples) is None, name
    empty = records[records["experiment"] != "inference"]
    assert all(REPRODUCERS[name](empty, samples) is None for name in INFERENCE_EXPECTED)


def test_aurora_fig2_counts_the_settings_whose_decisions_met_their_optimum(figure_tables):
    """Over both of Aurora's testbeds at once: the exact order, Theorem 5.1 and Case II at their optimum
    in every instance, the heuristic above it; without the heterogeneous records no reproduction."""
    registry = {
        k: e
        for k, e in load_registry().items()
        if k in ("aurora-fig2-optimal-settings", "aurora-fig13-gap-to-optimum-mean")
    }
    table = compare(registry, *figure_tables).set_index("id")
    fig2 = table.loc["aurora-fig2-optimal-settings"]
    assert fig2["reproduced"] == 3 and fig2["verdict"] == CONSISTENT
    assert fig2["hardware"] == "aurora-bigswitch-100g+aurora-bigswitch-hetero"
    assert "colocated-heterogeneous 1.050x" in fig2["reproduced_setting"]
    assert table.loc["aurora-fig13-gap-to-optimum-mean", "reproduced"] == pytest.approx(1.05)  # the heuristic only
    records, samples = figure_tables
    homogeneous = records[records["hardware"] != "aurora-bigswitch-hetero"]
    assert REPRODUCERS["aurora_fig2_optimal_settings"](homogeneous, samples) is None


def _write_lina_step(root, policy, partition_mb, samples, experts=16):
    """A simulated training step of ``policy`` on Lina's testbed, ``experts`` experts = GPUs, micro-ops
    of ``partition_mb``."""
    params = {"world_size": experts, "num_experts": experts, "experts_per_rank": 1, "policy": policy, "seed": 0}
    return _write(
        root,
        paper="lina",
        experiment="sim_train_step",
        point=f"{policy}_e{experts}_part{partition_mb:g}",
        mode="simulated",
        backend="sim",
        hardware="lina-a100-4x4",
        params={**params, "partition_mb": partition_mb},
        samples=samples,
    )


def test_lina_fig15_overheads_read_lina_at_16_experts(tmp_path):
    """Partition copies over the step at the run's 30 MB micro-ops (the size overlap ran at, too); the
    all-reduces alone at 30 MB over the sweep's largest micro-ops (whole tensors)."""
    paths = [_write_lina_step(tmp_path, "overlap", 30, {"step_ms": [500.0]})]
    for partition_mb, (copies, alone) in {10: (9.0, 130.0), 30: (4.0, 102.0), 100: (0.0, 100.0)}.items():
        samples = {"step_ms": [400.0], "partition_ms": [copies], "allreduce_alone_ms": [alone]}
        paths.append(_write_lina_step(tmp_path, "lina", partition_mb, samples))
    records, samples = collect(paths)
    assert REPRODUCERS["lina_fig15_partition_overhead"](records, samples)[0] == pytest.approx(1.0)
    value, setting = REPRODUCERS["lina_fig15_transmission_overhead"](records, samples)
    assert value == pytest.approx(2.0) and "30 MB micro-ops over 100 MB ones" in setting
    without_whole = records[records["partition_mb"] != 100]
    assert REPRODUCERS["lina_fig15_transmission_overhead"](without_whole, samples) is None  # no reference
    only_lina = records[records["policy"] == "lina"]  # one expert count at three sizes: none is the run's
    assert REPRODUCERS["lina_fig15_partition_overhead"](only_lina, samples) is None


def test_lina_reads_the_runs_partition_size_from_its_records(tmp_path):
    """A run with ``comm.partition_mb: 20``, as its sweep writes it: overlap and lina at every expert
    count at 20 MB micro-ops, and Fig 15's sweep of lina at the largest count. Lina's step is 320 ms at
    20 MB and 400 ms (overlap's) at the sweep's sizes; its speedup and Fig 15's overheads are read at
    20 MB, not at the schema's default."""
    cfg = load_config(overrides=["comm.partition_mb=20"], whole_run=False)
    run_mb, largest = cfg.comm.partition_mb, max(cfg.lina.experts)
    assert run_mb == 20 and run_mb not in cfg.lina.partition_mb and max(cfg.lina.partition_mb) == 100
    run = {"step_ms": [320.0], "partition_ms": [8.0], "allreduce_alone_ms": [104.0]}
    paths = []
    for experts in cfg.lina.experts:
        paths.append(_write_lina_step(tmp_path, "overlap", run_mb, {"step_ms": [400.0]}, experts))
        paths.append(_write_lina_step(tmp_path, "lina", run_mb, run, experts))
    for partition_mb in cfg.lina.partition_mb:
        alone = 100.0 if partition_mb == 100 else 102.0
        samples = {"step_ms": [400.0], "partition_ms": [4.0], "allreduce_alone_ms": [alone]}
        paths.append(_write_lina_step(tmp_path, "lina", partition_mb, samples, largest))
    records, samples = collect(paths)
    value, setting = REPRODUCERS[f"lina_fig10_step_speedup_{largest}e"](records, samples)
    assert value == pytest.approx(1.25) and "micro-ops 20 MB" in setting
    value, setting = REPRODUCERS["lina_fig15_partition_overhead"](records, samples)
    assert value == pytest.approx(2.5) and "20 MB micro-ops" in setting
    value, setting = REPRODUCERS["lina_fig15_transmission_overhead"](records, samples)
    assert value == pytest.approx(4.0) and "20 MB micro-ops over 100 MB ones" in setting


def test_every_lina_number_is_registered_with_its_reproducer_or_honestly_none():
    registry = load_registry()
    lina = {k: e for k, e in registry.items() if e["paper"] == "lina"}
    assert len(lina) == 48
    reproduced = {e["reproducer"] for e in lina.values()} - {None}
    assert reproduced <= set(REPRODUCERS) and set(INFERENCE_EXPECTED) <= reproduced
    unaddressed = {k for k, e in lina.items() if e["reproducer"] is None and not e["not_comparable"]}
    assert not unaddressed
    assert "SM" in lina["lina-fig2-sm-efficiency-during-a2a"]["not_comparable"]
    assert lina["lina-expert-packing-speedup-secondary"]["reproducer"] == "lina_packing_step_speedup"
    assert lina["lina-fig17-moe-p95-reduction-16e-bert"]["value"] == 1.81
    assert lina["lina-fig18-tail-a2a-reduction-max"]["value"] == 2.5
    assert lina["lina-expert-packing-speedup-secondary"]["status"] == "UNC"


# ---- AxoNN's table and reproducers on known synthetic inputs ------------------------------------

AXONN_NEEDS = {  # reproducer: the experiment whose records it reads
    "axonn_speedup_over_megatron_80b": "axonn_scaling",
    "axonn_peak_share_80b": "axonn_scaling",
    "axonn_pflops_80b": "axonn_scaling",
    "axonn_overlap_gain_2b": "axonn_ablation",
}


@pytest.mark.parametrize(
    "predicted, rho, best_in_top3",
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 1.0, True),  # the measured order
        ([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], -1.0, False),  # reversed: the measured best is ranked last
        ([3.0, 1.0, 2.0, 6.0, 5.0, 4.0], 0.6, True),  # the measured best third
    ],
)
def test_axonn_grid_validation_ranks_grids_per_testbed(tmp_path, predicted, rho, best_in_top3):
    measured = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    ours = collect(write_axonn_grids(tmp_path / "a", measured, predicted))[0]
    other = collect(write_axonn_grids(tmp_path / "b", measured, measured, hardware="emulated-2x4"))[0]
    table = TABLE_REGISTRY["axonn_grid_validation"].build(pd.concat([ours, other]))
    assert len(table) == 2 * len(AXONN_GRIDS)  # the ablation's overlapped points are left out
    ours = table[table["hardware"] == "local-cpu"]
    assert list(ours["comm_ms"]) == measured and list(ours["measured_rank"]) == [1, 2, 3, 4, 5, 6]
    assert list(ours["grid"]) == ["4x1x1x1", "2x2x1x1", "2x1x2x1", "1x2x2x1", "1x1x2x2", "1x4x1x1"]
    assert ours["spearman"].tolist() == pytest.approx([rho] * 6)
    assert (ours["measured_best_in_model_top3"] == best_in_top3).all()
    other = table[table["hardware"] == "emulated-2x4"]  # its own ranks, not pooled with local-cpu's
    assert other["spearman"].tolist() == pytest.approx([1.0] * 6) and other["measured_best_in_model_top3"].all()
    assert TABLE_REGISTRY["axonn_grid_validation"].build(collect(write_train_step(tmp_path / "c"))[0]).empty


def test_axonn_grid_validation_joins_each_measured_grid_to_its_own_testbeds_prediction(tmp_path):
    """The model's numbers come from the prediction records alone, each joined to the measured point
    of its testbed with the same grid params: none without the other, none of another testbed."""
    measured = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    records = collect(write_axonn_grids(tmp_path / "a", measured, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]))[0]
    assert "predicted_comm_ms" not in set(records.loc[records["experiment"] == "axonn_grids", "metric"])
    build = TABLE_REGISTRY["axonn_grid_validation"].build
    table = build(records)
    assert list(table["predicted_comm_ms"]) == [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]  # in the measured order
    assert (table["mode"] == "measured").all() and (table["backend"] == "gloo").all()
    for experiment in ("axonn_grids", "axonn_grid_predictions"):
        assert build(records[records["experiment"] != experiment]).empty
    elsewhere = records.assign(hardware=np.where(records["mode"] == "simulated", "emulated-2x4", "local-cpu"))
    assert build(elsewhere).empty


def test_axonn_scaling_table_says_what_the_overlaps_hide(figure_tables):
    table = TABLE_REGISTRY["axonn_scaling"].build(figure_tables[0])
    assert len(table) == 2 * len(AXONN_MODELS) and list(table["gpus"]) == sorted(table["gpus"])
    axonn, megatron = table[table["system"] == "axonn"], table[table["system"] == "megatron"]
    assert (axonn["layout"] == "grid 4x32x8x1").all() and (megatron["layout"] == "tp 4 x pp 16 x dp 16").all()
    for kind in ("all_gather", "all_reduce", "reduce_scatter"):
        assert (axonn[f"{kind}_hidden_ms"] == 200.0).all() and megatron[f"{kind}_hidden_ms"].isna().all()


def test_axonn_reproducers_give_the_published_numbers(figure_tables):
    registry = {k: e for k, e in load_registry().items() if e["paper"] == "axonn"}
    assert {e["reproducer"] for e in registry.values()} == set(AXONN_NEEDS)
    table = compare(registry, *figure_tables).set_index("id")
    assert (table["verdict"] == CONSISTENT).all() and (table["hardware"] == "axonn-perlmutter").all()
    assert table["ratio"].tolist() == pytest.approx([1.0] * 4)
    assert "tp 4 x pp 16 x dp 16" in table.loc["axonn-80b-speedup-over-megatron", "reproduced_setting"]
    assert registry["axonn-2b-overlap-gain"]["status"] == "UNC"
    records, samples = figure_tables
    for name, experiment in AXONN_NEEDS.items():
        kept = records["experiment"] != experiment
        assert REPRODUCERS[name](records[kept], samples) is None, name


def test_external_steps_table_summarises_each_kind(figure_tables):
    table = TABLE_REGISTRY["external_steps"].build(figure_tables[0]).set_index("id")
    assert table.loc["dense median", "step_error"] == pytest.approx((0.1 + 0.25) / 2)
    assert table.loc["moe p90", "step_error"] == pytest.approx(0.1)
    assert table.loc["dense p90", "step_error"] == pytest.approx(0.1 + 0.9 * 0.15)
    assert not table.loc["dense median", "within_target"] and table.loc["dense p90", "within_target"]  # 15%, 35%
