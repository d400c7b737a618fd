"""The workflow run's analysis as one W&B run, so W&B browses the results and not only the raw points.

One run per workflow run (rule wandb_analysis), named ``analysis``, job type ``analysis``, in the run's
group (``wandb.group``: ``<sweep>-<config digest>@<hardware>``, beside the runs of its records,
moe_core.records.tracking): the verdicts per paper (``verdicts``) and the published-vs-reproduced
comparison (``comparison``) as tables, every figure as an image (``figures/<paper>/<name>``), each
paper's verdict counts as summary scalars (``verdict_counts/<paper>/<column>``) and the resolved config as
the run's config. Offline by default, like every run of the suite (``wandb sync`` uploads it).

It writes ``--out``, a JSON file naming the run (its id, group, mode, folder) and what it logged; with
W&B disabled (``wandb.mode`` or ``WANDB_MODE``) it logs nothing and the file says so. The CSVs and
figures under results/ stay the source of truth: bad or missing inputs are an error here, before W&B
starts, naming the file.

    python -m analysis.tracking --config results/config/resolved-<digest>.yaml \
        --summary results/tables/verdict_summary.csv --comparison results/tables/comparison.csv \
        --out results/wandb/analysis.json results/figures/*/*.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis.files import read_csv, with_none
from moe_core.records.results import atomic_output
from moe_core.records.tracking import run_mode, start_run


def figure_keys(figures: list[Path]) -> dict[str, Path]:
    """``figures/<paper>/<name>`` -> the PNG, for figures written as results/figures/<paper>/<name>.png."""
    keys = {f"figures/{path.parent.name}/{path.stem}": path for path in figures}
    if len(keys) != len(figures):
        raise ValueError("two figures share a paper folder and a name: " + ", ".join(map(str, figures)))
    return keys


def verdict_scalars(summary: pd.DataFrame) -> dict[str, float]:
    """``verdict_counts/<row>/<column>`` for each numeric cell of the verdicts table, whatever its columns
    (the first column names the row: a paper, or ``all``)."""
    key, numeric = summary.columns[0], summary.select_dtypes("number").columns
    return {
        f"verdict_counts/{row[key]}/{column}": float(row[column])
        for row in summary.to_dict("records")
        for column in numeric
        if pd.notna(row[column])
    }


def log_analysis(wandb, cfg: dict[str, Any], tables: dict[str, pd.DataFrame], figures: dict[str, Path]) -> dict:
    """Log ``tables`` (name -> frame) and ``figures`` (key -> PNG) as one analysis run in ``cfg``'s group
    under ``cfg``'s results_dir; returns what was logged and where."""
    run = start_run(wandb, cfg, cfg["results_dir"], job_type="analysis", name="analysis", config=cfg, tags=["analysis"])
    try:
        logged = {
            name: wandb.Table(dataframe=with_none(frame), allow_mixed_types=True) for name, frame in tables.items()
        }
        logged |= {key: wandb.Image(str(path)) for key, path in figures.items()}
        run.log(logged)
        run.summary.update(verdict_scalars(tables["verdicts"]))
        return {
            "id": run.id,
            "group": run.group,
            "mode": run_mode(cfg),
            "dir": str(Path(run.dir).parent),
            "logged": sorted(logged),
        }
    finally:
        run.finish()


def read_inputs(args: argparse.Namespace) -> tuple[dict, dict[str, pd.DataFrame], dict[str, Path]]:
    """The resolved config, the two tables and the figures of ``args``; ValueError or OSError naming a
    file that is missing or unreadable."""
    cfg = yaml.safe_load(args.config.read_text())
    if not isinstance(cfg, dict) or not isinstance(cfg.get("wandb"), dict):
        raise ValueError(f"{args.config}: not a resolved config (no wandb section)")
    tables = {}
    for name, path in (("verdicts", args.summary), ("comparison", args.comparison)):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such table; the workflow's rule compare writes it")
        tables[name] = read_csv(path)
    missing = [str(path) for path in args.figures if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"no such figure: {', '.join(missing)}")
    return cfg, tables, figure_keys(args.figures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tracking", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's resolved config (YAML)")
    parser.add_argument("--summary", type=Path, required=True, help="verdicts per paper (analysis.compare --summary)")
    parser.add_argument("--comparison", type=Path, required=True, help="comparison CSV (analysis.compare --out)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file naming the run and what it logged")
    parser.add_argument("figures", type=Path, nargs="*", help="figure PNGs, results/figures/<paper>/<name>.png")
    args = parser.parse_args(argv)
    try:
        cfg, tables, figures = read_inputs(args)
    except (ValueError, OSError, yaml.YAMLError, pd.errors.ParserError) as err:
        print(f"analysis.tracking: error: {err}", file=sys.stderr)
        return 2
    if run_mode(cfg) == "disabled":
        result = {"mode": "disabled", "logged": []}
    else:
        import wandb  # heavy import, only when tracking is on

        result = log_analysis(wandb, cfg, tables, figures)
    with atomic_output(args.out) as tmp:
        Path(tmp).write_text(json.dumps(result, indent=2) + "\n")
    print(f"W&B analysis run ({result['mode']}): {len(result['logged'])} items logged; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
