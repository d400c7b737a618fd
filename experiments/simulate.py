"""Simulated MoE training steps on a modelled cluster (no processes, no GPUs): one point, or every
point of the config's simulated sweeps.

    python -m experiments simulate --config configs/default.yaml hardware_profile=lina-a100-4x4 \\
        parallel.world_size=16 moe.num_experts=16 moe.experts_per_rank=1 comm.policy=overlap
    python -m experiments simulate --config configs/default.yaml --sweep

``--trace PATH`` also writes the point's simulated timeline as a Chrome trace that
https://ui.perfetto.dev opens (moe_core.sim.trace); one point only, so not with ``--sweep``.

``--sweep`` simulates every point of :func:`moe_core.schema.points.sim_points` (the paper-scale sweep and
Lina's; ``--paper``: one paper's) in this one process, which is what the workflow runs: a point takes a
fraction of a second, far less than starting a Python process with torch. Records are written once all points succeeded.

Each point gives a record in the measured runs' schema with ``mode: simulated`` and ``backend: sim`` (one
sample per metric: the model is deterministic). A cluster profile smaller than ``world_size`` is
grown with more nodes of its kind. For the ``overlap`` policy the same step is also simulated with
``sequential``, and the slowdown (overlap / sequential) of every backward all-to-all that a gradient
all-reduce overlaps is kept as samples (``a2a_bwd_slowdown``, Lina Fig 3 at paper scale: its CDF is
of the all-to-alls "overlapping DDP allreduce").
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.benchmark import sim_record
from moe_core.config.load import ConfigError, derive_config, load_config
from moe_core.records.console import records_summary
from moe_core.records.results import (
    NonFiniteMetricError,
    ResultsDirError,
    check_writable,
    write_records,
)
from moe_core.schema.points import point_params, sim_point_name, sim_points
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology
from moe_core.sim.trace import step_trace, write_trace

EXPERIMENT = "sim_train_step"


def sized_hardware(cfg: DictConfig) -> DictConfig:
    """The hardware profile with enough nodes for parallel.world_size (cluster topologies)."""
    hw = cfg.hardware
    devices = hw.nodes * hw.devices_per_node
    if cfg.parallel.world_size <= devices or hw.topology != "cluster":
        return hw
    if hw.gpu_classes:
        raise ConfigError(
            f"config key 'parallel.world_size': {cfg.parallel.world_size} exceeds the {devices} "
            f"devices of heterogeneous profile '{hw.name}'"
        )
    grown = OmegaConf.to_container(hw)
    grown["nodes"] = math.ceil(cfg.parallel.world_size / hw.devices_per_node)
    return OmegaConf.create(grown)


def simulate_point(cfg: DictConfig) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Samples (one value per metric, plus per-op slowdowns for overlap) and run statistics."""
    started = time.perf_counter()
    topo = build_topology(sized_hardware(cfg))
    result = StepModel(cfg, topo).run()
    samples = {name: [value] for name, value in result.metrics().items()}
    if cfg.comm.policy == "overlap":
        alone_cfg = OmegaConf.merge(cfg, {"comm": {"policy": "sequential"}})
        alone = StepModel(alone_cfg, topo).run()
        contended, by_itself = result.durations_ms(".bwd"), alone.durations_ms(".bwd")
        # the all-to-alls that move data (within one rank they take no time) while an all-reduce runs
        kept = (by_itself > 0) & result.overlapping(".bwd", "allreduce")
        if kept.any():
            samples["a2a_bwd_slowdown"] = list(contended[kept] / by_itself[kept])
    extra = {"operations": len(result.ops), "links": topo.num_links, "simulation_s": time.perf_counter() - started}
    return samples, extra


def simulated_record(cfg: DictConfig, point: str) -> dict:
    """The record of one simulated point."""
    samples, extra = simulate_point(cfg)
    return sim_record(
        cfg,
        paper=cfg.paper,
        experiment=EXPERIMENT,
        point=point,
        hardware=cfg.hardware.name,
        params=point_params(cfg),
        samples=samples,
        extra_metrics=extra,
    )


def point_trace(cfg: DictConfig, point: str) -> dict:
    """The Chrome trace of one point's simulated step (moe_core.sim.trace). The step is simulated again
    here: the model is deterministic, so this is the timeline the record's metrics were read from."""
    sim = StepModel(cfg, build_topology(sized_hardware(cfg))).run()
    return step_trace(sim, cfg.parallel.world_size, {"point": point, "hardware": cfg.hardware.name})


def point_configs(args) -> dict[str, DictConfig]:
    """Point name -> its config: this command line's point, or with --sweep every sim_points entry."""
    if not args.sweep:
        cfg = load_config(args.config, args.overrides)
        return {sim_point_name(cfg.hardware.name, point_params(cfg)): cfg}
    base = load_config(args.config, args.overrides)
    points = sim_points(base)
    papers = {paper for paper, _ in points.values()}
    if args.paper and args.paper not in papers:
        raise ConfigError(f"--paper {args.paper}: the sweep has no point of it (its papers: {sorted(papers)})")
    return {
        name: derive_config(base, overrides)
        for name, (paper, overrides) in points.items()
        if args.paper in (None, paper)
    }


def run(args: argparse.Namespace) -> int:
    """Simulate and write the points of ``args`` (experiments.simulate's command line); exit code 2,
    writing nothing, on a bad config or an unwritable results directory."""
    try:
        configs = point_configs(args)
        for results_dir in {cfg.results_dir for cfg in configs.values()}:
            check_writable(results_dir)  # before the work, not when the first record is written
        records = {
            name: simulated_record(cfg, name)
            for name, cfg in tqdm(configs.items(), desc="simulate", file=sys.stderr, disable=len(configs) == 1)
        }
        traces = [point_trace(cfg, name) for name, cfg in configs.items() if args.trace]  # one point: no --sweep
    except (ConfigError, ValueError, ResultsDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        for trace in traces:  # first: a trace that cannot be written leaves no record
            print(f"wrote {write_trace(trace, args.trace)}: open it in https://ui.perfetto.dev", file=sys.stderr)
        out = [args.out] if args.out else None  # one point
        paths = write_records(records.values(), next(iter(configs.values())).results_dir, out)
    except (ResultsDirError, NonFiniteMetricError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(records_summary(list(records.values()), paths))
    return 0
