"""Aurora's simulated experiments: its decisions timed by the simulator on its big switch.

    python -m experiments aurora --config configs/default.yaml [key=value ...]

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and Communication
Scheduling", arXiv 2410.17043 (reference/papers.md §5). The workloads, the points and the run are
moe_core.papers.aurora.study, the simulated inference moe_core.papers.aurora.inference_sim; this
entry point loads the config and the two networks' hardware profiles, runs the study at the chosen
values of the unstated parameters and the deployment experiment again at the other ends of their
ranges (moe_core.papers.aurora.config.AURORA_UNSTATED), and writes one record per point (mode
simulated, backend sim). All records are computed first and written at the end (each atomically), so
a failing run writes none.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from omegaconf import DictConfig

from experiments.benchmark import predictions_main, sim_record
from moe_core.config.load import load_config, to_container
from moe_core.papers.aurora.study import (
    NETWORKS,
    PAPER,
    aurora_points,
    run_sensitivity,
    sensitivity_runs,
    token_workloads,
)
from moe_core.papers.aurora.study import run as run_study


def hardware_of(args_config: list[str], overrides: list[str], profile: str) -> DictConfig:
    """The hardware section of ``profile``, loaded through the schema like any run's."""
    return load_config(args_config, [*overrides, f"hardware_profile={profile}"], whole_run=False).hardware


def make_records(cfg: DictConfig, args_config: list[str], overrides: list[str], progress) -> list[dict]:
    """Every record of the run (``cfg``: its config, from ``args_config`` and ``overrides``): the
    chosen values' points, then each sensitivity run's."""
    tokens = token_workloads(cfg, cfg.aurora.num_experts)
    progress(f"workloads: {', '.join(tokens)}")
    records = []
    for suffix, variant in {"": [], **sensitivity_runs(cfg)}.items():
        run_cfg = load_config(args_config, [*overrides, *variant], whole_run=False)
        hardware = {
            net: hardware_of(args_config, [*overrides, *variant], run_cfg.aurora[f"{net}_hardware"]) for net in NETWORKS
        }
        if suffix:
            points = run_sensitivity(run_cfg, hardware, progress, tokens, suffix)
        else:
            points = run_study(run_cfg, hardware, progress, tokens)
        config = to_container(run_cfg)
        for p in points:
            net = p.params["network"]
            record = sim_record(
                run_cfg,
                paper=PAPER,
                experiment=p.experiment,
                point=p.name,
                hardware=run_cfg.aurora[f"{net}_hardware"],
                params=p.params,
                samples=p.samples,
                extra_metrics=p.extra,
                config={**config, "hardware": to_container(hardware[net])},  # the profile it ran on
            )
            records.append(record)
    expected = aurora_points(cfg)
    found = {e: [r["point"] for r in records if r["experiment"] == e] for e in expected}
    assert found == expected, "point names drifted"
    return records


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.aurora's command line); exit code 2,
    writing nothing, on a bad config or an unwritable results directory."""
    started = time.perf_counter()
    torch.set_num_threads(1)  # one small model and small matrices: threads only contend (results do not depend on it)

    def progress(msg: str) -> None:
        print(f"aurora: {msg} ({time.perf_counter() - started:.1f} s)", file=sys.stderr)

    return predictions_main(args, lambda cfg: make_records(cfg, args.config, args.overrides, progress))
