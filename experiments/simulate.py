"""Simulated MoE training steps: one sweep point on a modelled cluster (no processes, no GPUs).

    python -m experiments.simulate --config configs/default.yaml hardware_profile=lina-a100-4x4 \\
        parallel.world_size=16 moe.num_experts=16 moe.experts_per_rank=1 comm.policy=overlap

Writes a record in the measured runs' schema with ``mode: simulated`` and ``backend: sim`` (one
sample per metric: the model is deterministic). A cluster profile smaller than ``world_size`` is
grown with more nodes of its kind. For the ``overlap`` policy the same step is also simulated with
``sequential``, and every backward all-to-all's slowdown (overlap / sequential) is kept as samples
(``a2a_bwd_slowdown``, Lina Fig 3 at paper scale).
"""

from __future__ import annotations

import math
import sys
import time

from omegaconf import DictConfig, OmegaConf

from moe_core.config import ConfigError, config_arg_parser, load_config, point_name, point_params, to_container
from moe_core.results import make_record, record_path, write_record
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

EXPERIMENT = "sim_train_step"


def sized_hardware(cfg: DictConfig) -> DictConfig:
    """The hardware profile with enough nodes for parallel.world_size (cluster topologies)."""
    hw = cfg.hardware
    devices = hw.nodes * hw.devices_per_node
    if cfg.parallel.world_size <= devices or hw.topology != "cluster":
        return hw
    if hw.gpu_classes:
        raise ConfigError(f"config key 'parallel.world_size': {cfg.parallel.world_size} exceeds the {devices} "
                          f"devices of heterogeneous profile '{hw.name}'")
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
        samples["a2a_bwd_slowdown"] = list(result.durations_ms(".bwd") / alone.durations_ms(".bwd"))
    extra = {"operations": len(result.ops), "links": topo.num_links,
             "simulation_s": time.perf_counter() - started}
    return samples, extra


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.add_argument("--out", help="record path (default: results/raw/<paper>/sim_train_step/<point>.json)")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        samples, extra = simulate_point(cfg)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    params = point_params(cfg)
    point = f"{cfg.hardware.name}_{point_name(params)}"
    record = make_record(paper=cfg.paper, experiment=EXPERIMENT, point=point, mode="simulated", backend="sim",
                         hardware=cfg.hardware.name, params=params, samples=samples,
                         config=to_container(cfg), extra_metrics=extra)
    path = write_record(record, args.out or record_path(cfg.results_dir, cfg.paper, EXPERIMENT, point))
    print(f"wrote {path}: step {samples['step_ms'][0]:.2f} ms, a2a share {samples['a2a_share'][0]:.1%}, "
          f"{extra['operations']} ops in {extra['simulation_s']:.3f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
