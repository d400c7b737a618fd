"""Calibrate the measured testbed's hardware profile for the simulator.

    python -m experiments.calibrate --config results/config/resolved.yaml \\
        --out results/calibration/local-cpu-calibrated.yaml results/raw/*/*/*.json

Fits the network on collectives measured alone, and the compute rate per op class and the in-step
all-to-all wait on the smallest layout's training steps (moe_core.sim.calibrate.calibration_split),
and writes ``<profile>-calibrated``: a hardware YAML that any config can use with
``hardware_profile=<path>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import OmegaConf

from moe_core.config import ConfigError, load_config
from moe_core.points import replayed_config
from moe_core.results import atomic_output, read_record
from moe_core.sim.calibrate import alone_times, calibration_split, fit_compute, fit_in_step_wait, fit_network, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", default=[], help="YAML config (the measured runs' one)")
    parser.add_argument("--out", required=True, help="calibrated hardware YAML to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        records = [read_record(p) for p in args.records]
        calibrate, _ = calibration_split(records)
        hw = cfg.hardware
        if hw.device == "cpu" and not hw.host_cores:  # CPU ranks share this host's cores
            hw = OmegaConf.merge(hw, {"host_cores": len(os.sched_getaffinity(0))})
        network_hw, network_fit = fit_network(hw, alone_times(records, hw.name), seed=cfg.collectives.seed)
        train = [
            (replayed_config(r), measured(r))
            for r in calibrate
            if r["experiment"] == "train_step" and r["hardware"] == hw.name
        ]
        compute_hw, compute_fit = fit_compute(network_hw, train)
        fitted, wait_fit = fit_in_step_wait(compute_hw, train)
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    fitted = OmegaConf.merge(
        fitted,
        {"name": f"{hw.name}-calibrated", "description": f"{hw.name} calibrated on {len(calibrate)} measured records"},
    )
    header = (
        f"# Calibrated by experiments/calibrate.py on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.\n"
        f"# network fit: {json.dumps(network_fit)}\n# compute fit: {json.dumps(compute_fit)}\n"
        f"# in-step wait fit: {json.dumps(wait_fit)}\n"
    )
    with atomic_output(args.out) as tmp:
        Path(tmp).write_text(header + OmegaConf.to_yaml(fitted))
    print(
        f"wrote {args.out}: intra {fitted.intra_node_GBps:.3g} GB/s, nic {fitted.nic_GBps:.3g} GB/s, "
        f"{fitted.peak_tflops:.3g} TFLOP/s; network fit median error {network_fit['median_abs_rel_error']:.1%}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
