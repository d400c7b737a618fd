"""Tables a paper derives from the records table (beside the comparison), each written as CSV.

A table is a function ``f(records) -> DataFrame`` registered with analysis.registry's ``@table`` in
analysis/papers/<paper>.py; an empty frame means the records lack its data (an error, nothing
written). The paper's rules file names the table's output.

    python -m analysis.tables --records results/tables/records.csv --table strategy_ranking \
        --out results/tables/monta_strategies.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import analysis.papers  # noqa: F401  (registers every paper's tables)
from analysis.collect import at_setting
from analysis.files import read_csv, write_csv
from analysis.registry import TABLE_REGISTRY


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="records CSV (analysis.collect)")
    parser.add_argument("--table", required=True, help=f"one of {sorted(TABLE_REGISTRY)}")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    args = parser.parse_args(argv)
    if args.table not in TABLE_REGISTRY:
        sys.exit(f"analysis.tables: error: unknown table {args.table!r}; choose one of {sorted(TABLE_REGISTRY)}")
    df = TABLE_REGISTRY[args.table].build(at_setting(read_csv(args.records)))  # the chosen values' runs
    if df.empty:
        sys.exit(f"analysis.tables: error: the records table has no data for {args.table}; run its experiments first")
    write_csv(df, args.out)
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
