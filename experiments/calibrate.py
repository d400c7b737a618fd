"""Calibrate the measured testbed's hardware profile for the simulator.

    python -m experiments calibrate --config results/config/resolved.yaml \\
        --out results/calibration/local-cpu-calibrated.yaml results/raw/*/*/*.json

Fits the network on collectives measured alone, and the compute rate per op class and the in-step
all-to-all wait on the smallest world size's training steps (moe_core.sim.calibrate.calibration_split);
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
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from moe_core.config.load import ConfigError, load_config
from moe_core.host import time_slicing
from moe_core.host.noise import noise_summary, noise_warning, summary_is_noisy
from moe_core.records.results import atomic_output, read_record
from moe_core.schema.points import replayed_config
from moe_core.sim.calibrate import (
    alone_times,
    calibration_split,
    fit_compute,
    fit_in_step_wait,
    fit_network,
    fit_time_slicing,
    measured,
)


def run(args: argparse.Namespace) -> int:
    """Fit and write the calibrated profile of ``args`` (experiments.calibrate's command line); exit
    code 2 on bad input, writing nothing."""
    try:
        cfg = load_config(args.config)
        records = [read_record(p) for p in args.records]
        calibrate, _ = calibration_split(records)
        hw = cfg.hardware
        slicing_fit: dict = {}
        if hw.device == "cpu":  # CPU ranks share this host's cores, time-sliced when they outnumber them
            if not hw.host_cores:
                hw = OmegaConf.merge(hw, {"host_cores": len(os.sched_getaffinity(0))})
            hw, slicing_fit = fit_time_slicing(hw, pd.DataFrame(time_slicing.measure(hw.host_cores)))
        network_hw, network_fit = fit_network(hw, alone_times(records, hw.name), seed=cfg.collectives.seed)
        train = [
            (replayed_config(r), measured(r))
            for r in calibrate
            if r["experiment"] == "train_step" and r["hardware"] == hw.name
        ]
        compute_hw, compute_fit = fit_compute(network_hw, train)
        fitted, wait_fit = fit_in_step_wait(compute_hw, train)
    except (ConfigError, ValueError, OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    used = [r for r in calibrate if r["hardware"] == hw.name]
    quality = noise_summary(used)
    noisy = summary_is_noisy(quality)
    warning = noise_warning(quality, "calibration records")
    if warning:
        print(warning, file=sys.stderr)
    fitted = OmegaConf.merge(
        fitted,
        {
            "name": f"{hw.name}-calibrated",
            "description": f"{hw.name} calibrated on {len(used)} measured records"
            + (f", {quality['noisy_records']:g} of them from a noisy host" if quality["noisy_records"] else ""),
            "calibration_noise": quality,
        },
    )
    header = (
        f"# Calibrated by experiments/calibrate.py on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.\n"
        f"# network fit: {json.dumps(network_fit)}\n# compute fit: {json.dumps(compute_fit)}\n"
        f"# in-step wait fit: {json.dumps(wait_fit)}\n"
        + (f"# time-slicing fit (measured on this host): {json.dumps(slicing_fit)}\n" if slicing_fit else "")
    )
    print(
        f"fit: intra {fitted.intra_node_GBps:.3g} GB/s, nic {fitted.nic_GBps:.3g} GB/s, "
        f"{fitted.peak_tflops:.3g} TFLOP/s; network fit median error {network_fit['median_abs_rel_error']:.1%}",
        file=sys.stderr,
    )
    print(
        save_profile(header + OmegaConf.to_yaml(fitted), Path(args.out), noisy, cfg.calibration.accept_noisy),
        file=sys.stderr,
    )
    return 0


def last_good_path(out: Path) -> Path:
    """Where the last profile fitted on quiet records is kept: beside ``out``, outside any rule's output."""
    return out.parent / "last-good" / out.name


def noisy_fit_path(out: Path) -> Path:
    """Where a noisy fit that did not replace the last good profile is saved for inspection."""
    return out.with_name(f"{out.stem}.noisy-fit{out.suffix}")


def save_profile(text: str, out: Path, noisy: bool, accept_noisy: bool) -> str:
    """Write the fitted profile ``text`` to ``out``, or the last good one when the fit is noisy (see
    the module docstring); returns the line saying which it wrote."""
    last_good = last_good_path(out)
    if not noisy:
        _write(out, text)
        _write(last_good, text)
        return f"wrote {out} (fitted on quiet records; kept as the last good profile {last_good})"
    if accept_noisy:
        _write(out, text)
        return f"warning: wrote the fit on noisy records to {out}, as calibration.accept_noisy=true asks"
    if _same_profile(last_good, OmegaConf.create(text).name):
        _write(noisy_fit_path(out), text)
        kept = f"# Kept: a newer fit was on noisy records; it is in {noisy_fit_path(out).name}.\n"
        _write(out, kept + last_good.read_text())
        return (
            f"warning: the fit is on noisy records, so {out} is the last good profile ({last_good}); the noisy "
            f"fit is in {noisy_fit_path(out)}; set calibration.accept_noisy=true to use it instead"
        )
    _write(out, text)
    return (
        f"warning: wrote the fit on noisy records to {out}, flagged in its calibration_noise: no good profile "
        f"of this hardware to keep yet; rerun the measured points on a quiet host"
    )


def _same_profile(path: Path, name: str) -> bool:
    """``path`` holds a profile named ``name`` (the same hardware's calibration)."""
    return path.is_file() and OmegaConf.load(path).get("name") == name


def _write(path: Path, text: str) -> None:
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text)
