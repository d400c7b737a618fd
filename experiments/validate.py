"""Validate the simulator: predict the measured points calibration did not use, report each error.

    python -m experiments validate --calibrated results/calibration/local-cpu-calibrated.yaml \\
        --out results/tables/sim_validation.csv results/raw/*/*/*.json

Held-out points (moe_core.sim.calibrate.calibration_split): every all-to-all measured next to a
concurrent all-reduce (contention is predicted by the fluid model, never fitted) and every training
step at a world size calibration did not see. One row per point: experiment, setting, measured_ms
(the mean of its samples, moe_core.sim.calibrate.STATISTIC, as calibration uses), predicted_ms,
rel_error = predicted / measured - 1, and the host noise: ``noisy`` (this record was measured on a
noisy host, moe_core.host.noise.is_noisy), ``contention`` (the share of the host's CPU others used, empty
where unknown) and ``profile_noisy`` (the calibrated profile was fitted on noisy records, from its
``calibration_noise``). A warning names how many were noisy.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.files import write_csv
from moe_core.config.load import ConfigError, load_config
from moe_core.host.noise import is_noisy, noise_summary, noise_warning, summary_is_noisy
from moe_core.records.console import table
from moe_core.records.results import read_record
from moe_core.schema.points import replayed_config
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


def run(args: argparse.Namespace) -> int:
    """Predict every held-out record of ``args`` (experiments.validate's command line), write the CSV
    and print the errors per experiment; exit code 2, writing nothing, on bad input."""
    try:
        _, held_out = calibration_split([read_record(p) for p in args.records])
        profile_noise = load_config(overrides=[f"hardware_profile={args.calibrated}"]).hardware.calibration_noise
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
                    "noisy": is_noisy(record.get("noise")),
                    "contention": (record.get("noise") or {}).get("contention"),
                    "profile_noisy": summary_is_noisy(profile_noise),
                }
            )
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print("error: no held-out measured record to validate against", file=sys.stderr)
        return 2
    frame = pd.DataFrame(rows)
    write_csv(frame, args.out)
    for warning in noise_warnings(held_out, profile_noise, args.calibrated):
        print(warning, file=sys.stderr)
    errors = frame.assign(abs_error=frame["rel_error"].abs()).groupby("experiment")["abs_error"]
    summary = [
        {"experiment": experiment, "median |error|": e.median(), "max |error|": e.max(), "points": len(e)}
        for experiment, e in errors
    ]
    print(table(summary, floatfmt=".1%"))
    return 0


def noise_warnings(held_out: list[dict], profile_noise: dict, calibrated: str) -> list[str]:
    """Warnings for noisy held-out records and for a profile fitted on noisy records."""
    warnings = [noise_warning(noise_summary(held_out), "held-out records")]
    if summary_is_noisy(profile_noise):
        warnings.append(
            f"warning: the calibrated profile {calibrated} was fitted on records from a noisy host "
            f"({profile_noise['noisy_records']:g} of {profile_noise['records']:g}); its errors say little"
        )
    return [w for w in warnings if w]
