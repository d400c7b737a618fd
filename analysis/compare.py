"""Our numbers next to the published ones: one row per registry entry and testbed, with a verdict.

A reproducer is ``f(records, samples) -> (value, setting_description)``, or None when the tables lack
the data it needs. compare() calls it once per testbed (mode × backend × hardware), so measured and
simulated numbers, or numbers from different machines, are never pooled into one value.

    python -m analysis.compare --records results/tables/records.csv \
        --samples results/tables/samples.csv --out results/tables/comparison.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from analysis.collect import select
from analysis.files import read_tables, write_csv
from analysis.published import REGISTRY_PATH, load_registry
from analysis.units import MiB, format_bytes

Reproducer = Callable[[pd.DataFrame, pd.DataFrame], tuple[float, str] | None]
REPRODUCERS: dict[str, Reproducer] = {}
TESTBED = ["mode", "backend", "hardware"]
COLUMNS = ["id", "paper", "figure", "metric", "setting", "published", "unit", "status", "tolerance",
           *TESTBED, "reproduced", "reproduced_setting", "ratio", "verdict"]
CONSISTENT, DIFFERS, NOT_REPRODUCED = "consistent", "differs", "not-reproduced"
LINA_GPUS = 16  # Lina's testbed: 4 nodes x 4 A100


def reproducer(fn: Reproducer) -> Reproducer:
    """Register ``fn`` under its name, so published.yaml entries can refer to it."""
    REPRODUCERS[fn.__name__] = fn
    return fn


# ---- the data reproducers read ----------------------------------------------------------------

def contended_slowdowns(samples: pd.DataFrame, collectives=("all_to_all", "all_to_all_v")) -> pd.DataFrame:
    """Per-iteration slowdown samples of collectives run next to an all-reduce, messages >= 1 MiB.

    Lina's Fig 3 measures backward all-to-alls of real models, which move megabytes; smaller messages
    are latency-bound and say little about bandwidth sharing.
    """
    s = select(samples, paper="common", experiment="collectives", metric="slowdown", concurrent="all_reduce")
    return s if s.empty else s[s["collective"].isin(collectives) & (s["size_bytes"] >= MiB)]


def _span(values: pd.Series, fmt: Callable[[Any], str] = "{:g}".format) -> str:
    lo, hi = values.min(), values.max()
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def _where(df: pd.DataFrame) -> str:
    return ", ".join(sorted(set(df["hardware"] + " " + df["backend"])))


def _slowdown_setting(s: pd.DataFrame) -> str:
    return (f"{_where(s)}, {_span(s['world_size'])} ranks, {_span(s['size_bytes'], format_bytes)}, "
            f"{len(s)} samples")


def _train_step_mean_pct(records: pd.DataFrame, metric: str) -> tuple[float, str] | None:
    """Mean over training-step points of a fraction's median, in percent: measured points, else
    simulated points at Lina's scale (up to 16 GPUs)."""
    rows = select(records, paper="gshard", experiment="train_step", metric=metric)
    if rows.empty:
        rows = select(records, experiment="sim_train_step", metric=metric)
        rows = rows[rows["world_size"] <= LINA_GPUS] if not rows.empty else rows
    if rows.empty:
        return None
    setting = (f"{_where(rows)}, {len(rows)} points, {_span(rows['num_experts'])} experts, "
               f"{_span(rows['world_size'])} ranks, policy {'/'.join(sorted(rows['policy'].unique()))}")
    return 100 * float(rows["value"].mean()), setting


# ---- reproducers ------------------------------------------------------------------------------

def _fig3_slowdowns(samples: pd.DataFrame) -> tuple[pd.Series, str] | None:
    """Measured all_to_all slowdowns (collectives), else simulated backward all-to-all slowdowns at
    Lina's scale (16 GPUs); with the setting they come from."""
    s = contended_slowdowns(samples, ("all_to_all",))
    if not s.empty:
        return s["value"], _slowdown_setting(s)
    s = select(samples, experiment="sim_train_step", metric="a2a_bwd_slowdown", world_size=LINA_GPUS)
    if s.empty:
        return None
    return s["value"], f"{_where(s)}, {LINA_GPUS} GPUs = experts, overlap vs sequential, {len(s)} backward all-to-alls"


@reproducer
def lina_fig3_slowdown_median(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].median()), found[1])


@reproducer
def lina_fig3_slowdown_worst(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    found = _fig3_slowdowns(samples)
    return None if found is None else (float(found[0].max()), found[1])


@reproducer
def lina_table1_a2a_share(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _train_step_mean_pct(records, "a2a_share")


@reproducer
def lina_fig2_a2a_share_of_moe(records: pd.DataFrame, samples: pd.DataFrame) -> tuple[float, str] | None:
    return _train_step_mean_pct(records, "a2a_share_of_moe")


# ---- the comparison table ---------------------------------------------------------------------

def verdict(ratio: float, tolerance: float) -> str:
    return CONSISTENT if abs(ratio - 1) <= tolerance else DIFFERS


def compare(registry: dict[str, dict[str, Any]], records: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per entry and testbed that reproduces it; one not-reproduced row for an entry none does."""
    rows = []
    for entry in registry.values():
        published = {"published": entry["value"], **{k: entry[k] for k in COLUMNS if k in entry}}
        fn = _reproducer_of(entry)
        found = [] if fn is None else list(_reproductions(fn, records, samples))
        if not found:
            rows.append({**published, "verdict": NOT_REPRODUCED})
        for tb, value, setting in found:
            ratio = value / entry["value"]
            rows.append({**published, **tb, "reproduced": value, "reproduced_setting": setting,
                         "ratio": ratio, "verdict": verdict(ratio, entry["tolerance"])})
    return pd.DataFrame(rows, columns=COLUMNS)


def _reproducer_of(entry: dict[str, Any]) -> Reproducer | None:
    name = entry["reproducer"]
    if name is not None and name not in REPRODUCERS:
        raise ValueError(f"registry entry {entry['id']!r} names reproducer {name!r}, which "
                         f"analysis/compare.py does not define; add it with @reproducer or set it to null")
    return None if name is None else REPRODUCERS[name]


def _reproductions(fn: Reproducer, records: pd.DataFrame, samples: pd.DataFrame):
    """(testbed, value, setting) for every testbed whose records hold the data ``fn`` needs."""
    for testbed in records[TESTBED].drop_duplicates().to_dict("records"):
        result = fn(select(records, **testbed), select(samples, **testbed))
        if result is not None:
            yield testbed, *result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV from analysis.collect")
    parser.add_argument("--samples", type=Path, required=True, help="samples CSV from analysis.collect")
    parser.add_argument("--out", type=Path, required=True, help="comparison CSV to write")
    parser.add_argument("--registry", type=Path, default=REGISTRY_PATH, help="published numbers (YAML)")
    args = parser.parse_args(argv)
    try:
        table = compare(load_registry(args.registry), *read_tables(args.records, args.samples))
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.compare: error: {err}")
    write_csv(table, args.out)
    print(table[["id", "mode", "published", "reproduced", "unit", "verdict"]].to_string(index=False))


if __name__ == "__main__":
    main()
