"""Tables a paper derives from the records table (beside the comparison), each written as CSV.

A table is a function ``f(records) -> DataFrame`` registered with analysis.registry's ``@table`` in
analysis/papers/<paper>.py; an empty frame means the records lack its data (an error, nothing
written). The paper's rules file names the table's output.

    python -m analysis.tables --records results/tables/records.csv --table strategy_ranking \
        --out results/tables/monta_strategies.csv [--out-html results/report/tables/monta_strategies.html]

``--out-html`` writes the same rows as the report's sortable page (analysis.report.html_table): the
report shows an HTML file inline, where it offers a CSV for download.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import analysis.papers  # noqa: F401  (registers every paper's tables)
from analysis.collect import at_setting
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
    args = parser.parse_args(argv)
    if args.table not in TABLE_REGISTRY:
        sys.exit(f"analysis.tables: error: unknown table {args.table!r}; choose one of {sorted(TABLE_REGISTRY)}")
    df = TABLE_REGISTRY[args.table].build(at_setting(read_csv(args.records)))  # the chosen values' runs
    if df.empty:
        sys.exit(f"analysis.tables: error: the records table has no data for {args.table}; run its experiments first")
    table = TABLE_REGISTRY[args.table]
    outputs = [args.out, *([args.out_html] if args.out_html else [])]
    with atomic_outputs(*outputs) as tmps:  # all new, or all old
        df.to_csv(tmps[0], index=False)
        if args.out_html:
            intro = " ".join((table.build.__doc__ or "").split("\n\n")[0].split())
            page = html_table(df, list(df.columns), table.file, f"{intro} Click a column's header to sort by it.")
            tmps[1].write_text(page, encoding="utf-8")
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
