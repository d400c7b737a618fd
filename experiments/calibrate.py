"""Calibrate the measured testbed's hardware profile for the simulator.

    python -m experiments.calibrate --config results/config/resolved.yaml \\
        --out results/calibration/local-cpu-calibrated.yaml results/raw/*/*/*.json

Fits the network on collectives measured alone, and the compute rate per op class and the in-step
all-to-all wait on the smallest layout's training steps (moe_core.sim.calibrate.calibration_split);
on a CPU testbed it also measures how this host time-slices ranks that outnumber its cores
(moe_core.host.time_slicing, a few seconds: the rule holds every core meanwhile). It writes
``<profile>-calibrated``: a hardware YAML that any config can use with ``hardware_profile=<path>``.

Host noise (moe_core.host.noise): the profile records how many of its records were taken on a noisy host
(``calibration_noise``), and a warning says so. A fit on quiet records is also kept as the last good
profile, ``<out dir>/last-good/<out name>`` (outside the workflow's output, which Snakemake deletes
before a rerun). A fit on noisy records (more than moe_core.host.noise.NOISY_SHARE of them) does not
replace it: the last good profile of the same hardware is written as ``--out`` and the noisy fit
beside it (``<out stem>.noisy-fit.yaml``), unless ``calibration.accept_noisy=true``. With no good
profile yet the noisy fit is written, flagged. A noisy host never fails the run.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", default=[], help="YAML config (the measured runs' one)")
    parser.add_argument("--out", required=True, help="calibrated hardware YAML to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")
    args = parser.parse_args(argv)
    from experiments.impl.calibrate import run  # pandas, scipy and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
