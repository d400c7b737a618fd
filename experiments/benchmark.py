"""The shared skeleton of the experiments' entry points: the measured microbenchmarks
(experiments/aurora_a2a.py, monta_a2a.py, dispatchers.py, axonn_grids.py: their timing loop, their
records, their run under torchrun: :func:`measured_main`) and the papers' model and simulation
studies (experiments/monta.py, axonn.py: records of single predicted values, :func:`predictions_main`).
Both take the command line already parsed (moe_core.config.cli), so an entry point answers
``--help`` before it imports its work and this module (torch, scipy).

Methodology as experiments/collectives.py: warm-up iterations, then timed ones, each after a barrier;
a rank's sample is its own time, and the worst rank per iteration is kept (gather_worst_rank), so
every rank ends with the same samples and rank 0 writes them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
import yaml
from omegaconf import DictConfig

from moe_core.config.load import ConfigError, load_config, to_container
from moe_core.host.timing import PhaseTimer, gather_worst_rank
from moe_core.records.console import records_summary
from moe_core.records.predictions import Prediction
from moe_core.records.results import (
    NonFiniteMetricError,
    ResultsDirError,
    check_writable,
    exit_if_unwritable,
    make_record,
    write_records,
)
from moe_core.runtime.distributed import Env, init_distributed, leave_together, naming_failed_ranks, shutdown
from moe_core.schema.points import unstated_param


def timed_iterations(run: Callable[[], Any], warmup: int, iters: int, timer: PhaseTimer, metric: str) -> dict:
    """``warmup`` untimed calls of ``run``, then ``iters`` timed ones, a barrier before each; the worst
    rank's time per iteration under ``metric`` (ms)."""
    local: dict[str, list[float]] = {metric: []}
    for it in range(warmup + iters):
        dist.barrier()
        timer.reset()
        start = timer.stamp()
        run()
        timer.add(metric, start, timer.stamp())
        if it >= warmup:
            local[metric].append(timer.elapsed_ms()[metric])
    return gather_worst_rank(local)


def repeated_iterations(
    run: Callable[[], Any], warmup: int, iters: int, repeats: int, timer: PhaseTimer, metric: str
) -> tuple[list[float], dict[str, float]]:
    """``repeats`` runs of :func:`timed_iterations` (each with its own warm-up): every repeat's
    samples in order, and the repeats' medians summarised as the field reports them (AWS's
    cross-backend EP harness: three repeats, a 95% confidence interval): their mean and its interval
    (Student's t over the repeats' medians; a time is positive, so the interval stops at 0),
    ``<metric>_ci95_low`` / ``_high``."""
    samples, medians = [], []
    for _ in range(repeats):
        times = timed_iterations(run, warmup, iters, timer, metric)[metric]
        samples += times
        medians.append(float(np.median(times)))
    low, high = confidence_interval(medians)
    return samples, {f"{metric}_ci95_low": max(0.0, low), f"{metric}_ci95_high": high, "repeats": float(repeats)}


def confidence_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Two-sided ``level`` interval of the mean of independent ``values`` (Student's t; two or more)."""
    if len(values) < 2:
        raise ValueError("a confidence interval needs at least two repeats")
    from scipy import stats  # here: half a second to import, for every process of every entry point

    mean, sem = float(np.mean(values)), float(np.std(values, ddof=1)) / np.sqrt(len(values))
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * sem
    return mean - half, mean + half


def measured_record(
    cfg: DictConfig,
    *,
    paper: str,
    experiment: str,
    point: str,
    params: dict[str, Any],
    samples: dict[str, list[float]],
    extra_metrics: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A measured record on ``cfg``'s hardware."""
    return make_record(
        paper=paper,
        experiment=experiment,
        point=point,
        mode="measured",
        backend=cfg.hardware.backend,
        hardware=cfg.hardware.name,
        params=params,
        samples=samples,
        config=to_container(cfg),
        extra_metrics=extra_metrics,
        device=cfg.hardware.device,
    )


class CellsFailed(Exception):
    """A benchmark's cells that failed their check, raised by its ``run`` after the others were
    measured: ``records`` (rank 0's, of the cells that passed) are written, then the run exits 1."""

    def __init__(self, message: str, records: list[dict]):
        super().__init__(message)
        self.records = records


def measured_main(
    args: argparse.Namespace,
    world_size_key: str,
    run: Callable[[DictConfig, Env], list[dict]],
    check: Callable[[DictConfig], None] | None = None,
) -> None:
    """Load and check the config of ``args`` (``--config``/overrides; exit 2 on a bad one, before any
    process group), run ``run(cfg, env)`` on every rank, and write its records (rank 0's; the others
    have none) once every rank finished (write_records also mirrors them to W&B). A failing or
    hung rank makes every rank exit non-zero, naming it (moe_core.runtime.distributed); cells that
    failed their check (CellsFailed) exit 1 once the others are written."""
    try:
        cfg = load_config(args.config, args.overrides)
        if check is not None:
            check(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    env = init_distributed(cfg, world_size_key=world_size_key)
    failure = None
    try:
        with naming_failed_ranks(env):
            try:
                records = run(cfg, env)
            except CellsFailed as err:
                records, failure = err.records, err
        with exit_if_unwritable():
            paths = write_records(records, cfg.results_dir)
        if paths:
            print(f"wrote {len(paths)} records under {paths[0].parent}/", file=sys.stderr)
        leave_together(env)
    finally:
        shutdown()
    if failure is not None:
        if env.rank == 0:
            print(f"error: {failure}", file=sys.stderr)
        sys.exit(1)


def published_entries(
    path: str | Path, required_keys: tuple[str, ...], checked: Callable[[dict, str], dict]
) -> list[dict[str, Any]]:
    """The ``entries:`` list of a YAML file of published measurements (an external validation's), in
    file order: each a mapping with ``required_keys``, then passed through ``checked(entry, where)``;
    ValueError names a bad file, entry or duplicate id."""
    with open(path) as f:
        data = yaml.safe_load(f)
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a top-level 'entries:' list")
    entries = [_with_keys(entry, f"{path}: entry #{i}", required_keys, checked) for i, entry in enumerate(entries, 1)]
    ids = [entry["id"] for entry in entries]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate ids {duplicates}; ids must be unique")
    return entries


def _with_keys(entry: Any, where: str, required_keys: tuple[str, ...], checked: Callable[[dict, str], dict]) -> dict:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a mapping of key: value")
    where = f"{where} ({entry.get('id')!r})"
    missing = [key for key in required_keys if key not in entry]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    return checked(entry, where)


def sim_record(
    cfg: DictConfig,
    *,
    paper: str,
    experiment: str,
    point: str,
    hardware: str,
    params: dict[str, Any],
    samples: dict[str, list[float]],
    extra_metrics: dict[str, float] | None = None,
    config: dict[str, Any] | None = None,
    backend: str = "sim",
) -> dict[str, Any]:
    """A simulated record on the modelled ``hardware``: the simulator's samples (``backend="sim"``)
    or a paper's model's (``"model"``), its config ``cfg``'s (or ``config`` where the run's config
    differs, e.g. by the profile it ran on)."""
    return make_record(
        paper=paper,
        experiment=experiment,
        point=point,
        mode="simulated",
        backend=backend,
        hardware=hardware,
        params=params,
        samples=samples,
        config=config or to_container(cfg),
        extra_metrics=extra_metrics,
    )


def predicted_record(
    cfg: DictConfig,
    *,
    paper: str,
    experiment: str,
    point: str,
    hardware: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    backend: str,
) -> dict[str, Any]:
    """A record of single predicted values (a paper's model: ``backend="model"``, or the step
    simulator: ``"sim"``) on the modelled ``hardware``."""
    return sim_record(
        cfg,
        paper=paper,
        experiment=experiment,
        point=point,
        hardware=hardware,
        params=params,
        samples={},
        extra_metrics={name: float(value) for name, value in metrics.items()},
        backend=backend,
    )


def prediction_record(cfg: DictConfig, paper: str, prediction: Prediction) -> dict[str, Any]:
    """The record of a paper study's ``prediction``, with the run's config ``cfg``: a run at a setting
    of the paper's unstated parameters (its fitted testbed) marks every record with it, those of points
    that do not read the setting's parameters too (the setting is the run's)."""
    return predicted_record(
        cfg,
        paper=paper,
        experiment=prediction.experiment,
        point=prediction.name,
        hardware=prediction.hardware,
        params={**unstated_param(cfg), **prediction.params},
        metrics=prediction.metrics,
        backend=prediction.backend,
    )


def predictions_main(args: argparse.Namespace, make_records: Callable[[DictConfig], list[dict]]) -> int:
    """Load the config of ``args`` (``--config``/overrides), compute ``make_records(cfg)``, write them
    and print what was written; exit 2, writing nothing, on a bad config, an unwritable results
    directory or a model's ValueError."""
    try:
        cfg = load_config(args.config, args.overrides)
        check_writable(cfg.results_dir)
        records = make_records(cfg)
    except (ConfigError, ResultsDirError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        paths = write_records(records, cfg.results_dir)
    except (ResultsDirError, NonFiniteMetricError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(records_summary(records, paths))
    return 0
