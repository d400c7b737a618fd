"""Weights & Biases mirror of the records, called by moe_core.records.results.write_records (the one
place records are written, so no entry point can forget it).

* a measured record is one run, named ``<experiment>/<point>``, in the group of its sweep
  (``sweep.name``), job type its experiment: its per-iteration samples are the run's history (step i
  holds every metric's i-th sample, so W&B draws them as curves), its metrics' statistics the
  summary, its params, environment (git sha) and resolved config the run's config;
* the simulated records of one write are one run per (paper, experiment), named
  ``<paper>/<experiment>`` in the same group: a table ``points`` of one row per point (its params and
  each metric's value, or median for sampled ones), since a run per simulated point would cost more
  than the point itself.

A run's settings come from its records' own config (``wandb``: mode, project, entity), so the mirror
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
from typing import Any


def mirror_records(records: list[dict[str, Any]], results_dir: str | Path) -> None:
    """Mirror ``records`` (just written under ``results_dir``) to W&B runs under
    ``<results_dir>/wandb``; a failure is printed as a warning, never raised."""
    try:
        runs = [r for r in records if _mode(r) != "disabled"]
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


def _mode(record: dict[str, Any]) -> str:
    return os.environ.get("WANDB_MODE") or record["config"]["wandb"]["mode"]


def _init(wandb, record: dict[str, Any], results_dir: str | Path, name: str, config: dict[str, Any]):
    """A run in ``record``'s sweep group, with ``record``'s W&B settings."""
    settings = record["config"]["wandb"]
    return wandb.init(
        project=settings["project"],
        entity=settings.get("entity"),
        mode=_mode(record),
        dir=results_dir,
        group=record["config"]["sweep"]["name"],
        job_type=record["experiment"],
        name=name,
        config=config,
        tags=[record["paper"], record["mode"]],
        settings=wandb.Settings(silent=True),
    )


def _log_measured(wandb, record: dict[str, Any], results_dir: str | Path) -> None:
    config = {key: record[key] for key in ("params", "hardware", "backend", "environment")}
    config["resolved"] = record["config"]
    run = _init(wandb, record, results_dir, f"{record['experiment']}/{record['point']}", config)
    try:
        samples = record["samples"]
        for i in range(max(map(len, samples.values()), default=0)):
            run.log({name: values[i] for name, values in samples.items() if i < len(values)}, step=i)
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
