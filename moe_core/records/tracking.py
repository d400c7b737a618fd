"""Weights & Biases mirror of the records: one run per sweep point, grouped by sweep.

Offline by default (no account, no network): runs land in ``<results_dir>/wandb/`` and can be
uploaded later with ``wandb sync``. ``WANDB_MODE`` in the environment wins over ``wandb.mode`` in
the config. Only rank 0 logs. The JSON records under ``results/raw`` stay the source of truth.
"""

from __future__ import annotations

import os
from typing import Any


def log_point(
    record: dict[str, Any], cfg, step_columns: dict[str, list[float]] | None = None, group: str | None = None
) -> str | None:
    """Log one finished sweep point as a W&B run (``cfg.wandb``; files under ``<results_dir>/wandb``),
    in W&B group ``group`` (default: the sweep's name); return the run directory (None when disabled)."""
    mode, project, entity, results_dir = cfg.wandb.mode, cfg.wandb.project, cfg.wandb.entity, cfg.results_dir
    sweep = group or cfg.sweep.name
    mode = os.environ.get("WANDB_MODE", mode)
    if mode == "disabled":
        return None
    import wandb  # heavy import, only when tracking is on

    wandb_dir = os.path.join(results_dir, "wandb")
    os.makedirs(wandb_dir, exist_ok=True)
    run = wandb.init(
        project=project,
        entity=entity,
        mode=mode,
        dir=results_dir,
        group=sweep,
        job_type=record["experiment"],
        name=f"{record['experiment']}/{record['point']}",
        config={
            "params": record["params"],
            "hardware": record["hardware"],
            "backend": record["backend"],
            "resolved": record["config"],
        },
        tags=[record["paper"], record["mode"]],
        settings=wandb.Settings(silent=True),
    )
    try:
        summary = {}
        for name, stats in record["metrics"].items():
            for stat, value in stats.items():
                summary[f"{name}/{stat}"] = value
        run.summary.update(summary)
        if step_columns:
            columns = list(step_columns)
            rows = [list(r) for r in zip(*step_columns.values())]
            run.log(
                {"per_step": wandb.Table(columns=["iteration", *columns], data=[[i, *r] for i, r in enumerate(rows)])}
            )
        return run.dir
    finally:
        run.finish()
