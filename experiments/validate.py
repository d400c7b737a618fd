"""Validate the simulator: predict the measured points calibration did not use, report each error.

    python -m experiments.validate --calibrated results/calibration/local-cpu-calibrated.yaml \\
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrated", required=True, help="calibrated hardware YAML (experiments/calibrate.py)")
    parser.add_argument("--out", required=True, help="validation CSV to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")
    args = parser.parse_args(argv)
    from experiments.impl.validate import run  # pandas and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
