"""Validate the simulator: predict the measured points calibration did not use, report each error.

    python -m experiments.validate --calibrated results/calibration/local-cpu-calibrated.yaml \\
        --out results/tables/sim_validation.csv results/raw/*/*/*.json

Held-out points (moe_core.sim.calibrate.calibration_split): every all-to-all measured next to a
concurrent all-reduce (contention is predicted by the fluid model, never fitted) and every training
step at a world size calibration did not see. One row per point: experiment, setting, measured_ms
(the mean of its samples, moe_core.sim.calibrate.STATISTIC, as calibration uses), predicted_ms,
rel_error = predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.files import write_csv
from moe_core.config import ConfigError, load_config
from moe_core.points import replayed_config
from moe_core.results import read_record
from moe_core.sim.calibrate import calibration_split, measured
from moe_core.sim.collectives import simulate_collective
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology


def predict(record: dict, calibrated: str) -> tuple[str, float, float]:
    """(setting, measured ms, predicted ms) of one held-out measured record."""
    cfg = load_config(data=replayed_config(record), overrides=[f"hardware_profile={calibrated}"], whole_run=False)
    topo = build_topology(cfg.hardware)
    p = record["params"]
    if record["experiment"] == "collectives":
        predicted = simulate_collective(cfg.hardware, topo, {**p, "seed": cfg.collectives.seed})
        return record["point"], measured(record)["time_ms"], predicted
    predicted = StepModel(cfg, topo).run().metrics()["step_ms"]
    return record["point"], measured(record)["step_ms"], predicted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrated", required=True, help="calibrated hardware YAML (experiments/calibrate.py)")
    parser.add_argument("--out", required=True, help="validation CSV to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")
    args = parser.parse_args(argv)
    try:
        _, held_out = calibration_split([read_record(p) for p in args.records])
        rows = []
        for record in held_out:
            setting, measured_ms, predicted_ms = predict(record, args.calibrated)
            rows.append(
                {
                    "experiment": record["experiment"],
                    "setting": setting,
                    "hardware": record["hardware"],
                    "measured_ms": measured_ms,
                    "predicted_ms": predicted_ms,
                    "rel_error": predicted_ms / measured_ms - 1,
                }
            )
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print("error: no held-out measured record to validate against", file=sys.stderr)
        return 2
    table = pd.DataFrame(rows)
    write_csv(table, args.out)
    summary = (
        table.assign(abs_error=table["rel_error"].abs())
        .groupby("experiment")["abs_error"]
        .agg(["median", "max", "count"])
    )
    print(summary.to_string(float_format=lambda x: f"{x:.1%}" if x < 10 else f"{x:g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
