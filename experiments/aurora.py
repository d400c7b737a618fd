"""Aurora's simulated experiments: its decisions on its big-switch system model.

    python -m experiments.aurora --config configs/default.yaml [key=value ...]

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and Communication
Scheduling", arXiv 2410.17043 (reference/papers.md §5). The workloads, the points and the run are
moe_core.papers.aurora.study, the system model moe_core.papers.aurora.system_model; this entry point
loads the config and the two networks' hardware profiles, runs the study and writes one record per
point (mode simulated, backend sim). All records are computed first and written at the end (each
atomically), so a failing run writes none.
"""

from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig

from moe_core.config import ConfigError, config_arg_parser, load_config, to_container
from moe_core.papers.aurora.study import aurora_points, run
from moe_core.papers.aurora.system_model import NETWORKS, PAPER
from moe_core.results import ResultsDirError, check_writable, make_record, record_path, write_record


def hardware_of(cfg: DictConfig, args_config: list[str], overrides: list[str], profile: str) -> DictConfig:
    """The hardware section of ``profile``, loaded through the schema like any run's."""
    return load_config(args_config, [*overrides, f"hardware_profile={profile}"]).hardware


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    args = parser.parse_intermixed_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)  # one small model and small matrices: threads only contend (results do not depend on it)
    try:
        cfg = load_config(args.config, args.overrides)
        check_writable(cfg.results_dir)  # before the work, not when the first record is written
        hardware = {
            net: hardware_of(cfg, args.config, args.overrides, cfg.aurora[f"{net}_hardware"]) for net in NETWORKS
        }
        points = run(
            cfg, hardware, lambda msg: print(f"aurora: {msg} ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
        )
    except (ConfigError, ValueError, ResultsDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    expected = aurora_points(cfg)
    assert {e: [p.name for p in points if p.experiment == e] for e in expected} == expected, "point names drifted"
    config = to_container(cfg)
    for p in points:
        hw = cfg.aurora[f"{p.params['network']}_hardware"]
        record = make_record(
            paper=PAPER,
            experiment=p.experiment,
            point=p.name,
            mode="simulated",
            backend="sim",
            hardware=hw,
            params=p.params,
            samples=p.samples,
            config=config,
            extra_metrics=p.extra,
        )
        write_record(record, record_path(cfg.results_dir, PAPER, p.experiment, p.name))
    print(
        f"aurora: wrote {len(points)} records under {cfg.results_dir}/raw/{PAPER}/ in "
        f"{time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
