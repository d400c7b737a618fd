"""Tables a paper derives from the records table (beside the comparison), each written as CSV.

A table is a function ``f(records) -> DataFrame`` registered with analysis.registry's ``@table`` in
analysis/papers/<paper>.py; an empty frame means the records lack its data (an error, nothing
written). The paper's rules file names the table's output.

    python -m analysis.tables --records results/tables/records.csv --table strategy_ranking \
        --out results/tables/monta_strategies.csv [--out-html results/report/tables/monta_strategies.html]

``--out-html`` writes the same rows as the report's sortable page (analysis.report.html_table): the
report shows an HTML file inline, where it offers a CSV for download. With ``--at-fit`` a paper fitted
to its baseline rows is tabled at its fitted testbed (analysis.collect.as_judged), which the page says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import analysis.papers  # noqa: F401  (registers every paper's tables)
from analysis.collect import as_judged, fitted_text
from analysis.files import read_csv
from analysis.registry import TABLE_REGISTRY
from analysis.report import html_table
from moe_core.records.results import atomic_outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV (analysis.collect)")
    parser.add_argument("--table", required=True, help=f"one of {sorted(TABLE_REGISTRY)}")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--out-html", type=Path, help="the same rows as a sortable HTML page, for the report")
    parser.add_argument(
        "--at-fit",
        type=Path,
        help="records CSV of the runs at the papers' fitted testbeds: the points it covers are tabled from it, "
        "as the verdicts read them (analysis.collect.as_judged)",
    )
    args = parser.parse_args(argv)
    if args.table not in TABLE_REGISTRY:
        sys.exit(f"analysis.tables: error: unknown table {args.table!r}; choose one of {sorted(TABLE_REGISTRY)}")
    records = as_judged(read_csv(args.records), read_csv(args.at_fit) if args.at_fit else None)
    df = TABLE_REGISTRY[args.table].build(records)
    if df.empty:
        sys.exit(f"analysis.tables: error: the records table has no data for {args.table}; run its experiments first")
    table = TABLE_REGISTRY[args.table]
    outputs = [args.out, *([args.out_html] if args.out_html else [])]
    with atomic_outputs(*outputs) as tmps:  # all new, or all old
        df.to_csv(tmps[0], index=False)
        if args.out_html:
            intro = " ".join((table.build.__doc__ or "").split("\n\n")[0].split()) + fitted_note(records, table.paper)
            page = html_table(df, list(df.columns), table.file, f"{intro} Click a column's header to sort by it.")
            tmps[1].write_text(page, encoding="utf-8")
    print(df.to_string(index=False))


def fitted_note(records, paper: str) -> str:
    """A sentence naming the fitted testbed ``paper``'s simulated rows are at, if they are (as_judged)."""
    fits = fitted_text(records[records["paper"] == paper])
    return f" Simulated at the testbed fitted to the paper's baseline rows: {fits}." if fits else ""


if __name__ == "__main__":
    main()
