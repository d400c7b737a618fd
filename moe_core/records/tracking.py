"""Weights & Biases mirror of the records, called by moe_core.records.results.write_records (the one
place records are written, so no entry point can forget it).

* every run is in its record's group, ``wandb.group`` (``<sweep>-<config digest>@<hardware>``, the
  workflow run's, moe_core.schema.derive.run_group), so runs of another config or on other hardware
  never share one; its job type is its experiment;
* a measured record is one run, named ``<experiment>/<point>``: its per-iteration samples are the
  run's history, charted against ``iteration`` (``define_metric``: row i holds every metric's i-th
  sample), its metrics' statistics the summary, its params, environment (git sha) and resolved config
  the run's config;
* the simulated records of one write are one run per (paper, experiment), named
  ``<paper>/<experiment>``: a table ``points`` of one row per point (its params and each metric's
  value, or median for sampled ones), since a run per simulated point would cost more than the point
  itself, and its headline scalars (moe_core.records.console.headline: the first metric's min, median
  and max over the points) in the summary, beside ``points_count``;
* the workflow's analysis (analysis/tracking.py) is one more run, job type ``analysis``: see there.

A run's settings come from its records' own config (``wandb``: mode, project, entity, group), so the mirror
needs nothing but the records. Offline by default (no account, no network): runs land in
``<results_dir>/wandb/`` and can be uploaded later with ``wandb sync``. ``WANDB_MODE`` in the
environment wins over ``wandb.mode``; ``disabled`` writes nothing and does not import wandb. Only
rank 0 has records to write, so only rank 0 logs. The JSON records under ``results/raw`` stay the
source of truth: a mirror that fails (W&B cannot start, its folder cannot be written) prints one
warning naming the cause and leaves them as written.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from statistics import median
from typing import Any

from moe_core.records.console import headline

ITERATION = "iteration"  # the x axis of a measured run's samples


def mirror_records(records: list[dict[str, Any]], results_dir: str | Path) -> None:
    """Mirror ``records`` (just written under ``results_dir``) to W&B runs under
    ``<results_dir>/wandb``; a failure is printed as a warning, never raised."""
    try:
        runs = [r for r in records if run_mode(r["config"]) != "disabled"]
        if not runs:
            return
        import wandb  # heavy import, only when tracking is on

        for record in (r for r in runs if r["mode"] == "measured"):
            _log_measured(wandb, record, results_dir)
        for group in _by_experiment(r for r in runs if r["mode"] == "simulated"):
            _log_simulated(wandb, group, results_dir)
    except Exception as err:  # W&B only mirrors: whatever stops it must not cost the records
        print(
            f"warning: W&B could not mirror {len(records)} records ({type(err).__name__}: {err}); the records "
            f"are written, only their W&B runs are missing: fix {results_dir}/wandb or set wandb.mode=disabled",
            file=sys.stderr,
            flush=True,
        )


def run_mode(cfg: dict[str, Any]) -> str:
    """The W&B mode of the resolved config ``cfg``: ``WANDB_MODE`` if set, else its ``wandb.mode``."""
    return os.environ.get("WANDB_MODE") or cfg["wandb"]["mode"]


def start_run(wandb, cfg: dict[str, Any], results_dir: str | Path, **run: Any):
    """A W&B run with the settings of the resolved config ``cfg`` (``wandb``: mode, project, entity,
    group; ``WANDB_MODE`` wins over its mode) under ``<results_dir>/wandb``; ``run``: name, job_type,
    config, tags. A config without a group (a record written before configs had one) uses its sweep's
    name."""
    settings = cfg["wandb"]
    return wandb.init(
        project=settings["project"],
        entity=settings.get("entity"),
        mode=run_mode(cfg),
        dir=results_dir,
        group=settings.get("group") or cfg["sweep"]["name"],
        settings=wandb.Settings(silent=True),
        **run,
    )


def _init(wandb, record: dict[str, Any], results_dir: str | Path, name: str, config: dict[str, Any]):
    """A run for ``record`` in its group, job type its experiment."""
    tags = [record["paper"], record["mode"]]
    return start_run(
        wandb, record["config"], results_dir, job_type=record["experiment"], name=name, config=config, tags=tags
    )


def _log_measured(wandb, record: dict[str, Any], results_dir: str | Path) -> None:
    config = {key: record[key] for key in ("params", "hardware", "backend", "environment")}
    config["resolved"] = record["config"]
    run = _init(wandb, record, results_dir, f"{record['experiment']}/{record['point']}", config)
    try:
        samples = record["samples"]
        run.define_metric(ITERATION)
        run.define_metric("*", step_metric=ITERATION)  # every sample charted against its iteration
        for i in range(max(map(len, samples.values()), default=0)):
            run.log({ITERATION: i, **{name: values[i] for name, values in samples.items() if i < len(values)}}, step=i)
        run.summary.update(
            {f"{name}/{stat}": value for name, stats in record["metrics"].items() for stat, value in stats.items()}
        )
    finally:
        run.finish()


def _log_simulated(wandb, records: list[dict[str, Any]], results_dir: str | Path) -> None:
    first = records[0]
    params = list(dict.fromkeys(key for r in records for key in r["params"]))
    metrics = list(dict.fromkeys(name for r in records for name in r["metrics"]))
    rows = [
        [r["point"], *(_cell(r["params"].get(key)) for key in params), *(_value(r["metrics"].get(m)) for m in metrics)]
        for r in records
    ]
    config = {"environment": first["environment"], "resolved": first["config"]}  # the first point's
    run = _init(wandb, first, results_dir, f"{first['paper']}/{first['experiment']}", config)
    try:
        table = wandb.Table(columns=["point", *params, *metrics], data=rows, allow_mixed_types=True)
        run.log({"points": table})
        run.summary["points_count"] = len(records)
        metric, values = headline(records)
        if values:
            run.summary.update(
                {f"{metric}/min": min(values), f"{metric}/median": median(values), f"{metric}/max": max(values)}
            )
    finally:
        run.finish()


def _by_experiment(records: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``records`` grouped by (paper, experiment), in order of first appearance."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["paper"], r["experiment"]), []).append(r)
    return list(groups.values())


def _cell(value: Any) -> Any:
    """A param as a table cell: scalars as they are, lists and mappings as JSON text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)


def _value(stats: dict[str, float] | None) -> float | None:
    """A metric's single value, or the median of its samples (None where the point lacks it)."""
    return None if stats is None else stats.get("value", stats.get("median"))
