"""The report's own pages, written from files the run made: sortable HTML views of the comparison table and
of the verdicts per paper (Snakemake's report opens an HTML file inline, where it offers a CSV for download),
and the run's facts as RST (the commits and testbeds of the records, the verdict counts), which the report's
landing page (analysis/captions/landing.rst) includes. The CSVs stay the data files.

    python -m analysis.report --comparison results/tables/comparison.csv \
        --summary results/tables/verdict_summary.csv --out-comparison results/report/comparison.html \
        --out-summary results/report/verdict_summary.html --out-facts results/report/run.rst \
        --fits results/tables/testbed_fit.csv --out-fits results/report/testbed_fit.html \
        results/raw/*/*/*.json
"""

from __future__ import annotations

import argparse
import html
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.explain import VERDICTS
from analysis.files import read_csv
from analysis.style import VERDICT_COLOURS
from moe_core.records.results import atomic_outputs, read_record

# The comparison page's key columns, first, within a report frame's width: the number, its verdict, the
# two values and the range the verdict used, and the reason's first sentence (explain.first_sentence);
# behind them, in each row's "details", the rest of the reason and the columns that qualify the verdict.
# comparison.csv also holds the status, the unstated settings run, the reproduced setting and the points
# each number came from.
COMPARISON_KEY = ["id", "paper", "verdict", "published", "reproduced", "range", "unit", "reason"]
COMPARISON_DETAILS = ["weak", "ratio", "tolerance", "bound", "mode", "hardware", "needs", "figure", "setting"]
COMPARISON_VIEW = [*COMPARISON_KEY, "details"]
SUMMARY_VIEW = ["paper", *VERDICTS, "total", "weak"]
# Columns whose text wraps, each at least this wide (em); the others keep a cell on one line.
WRAPPED_EM = {"id": 12, "verdict": 8, "unit": 4, "reason": 24, "details": 5}

# The pages' look; each verdict cell tinted with its verdict's colour.
STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1em; color: #222; }
p { max-width: 60em; }
table { border-collapse: collapse; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
td { white-space: nowrap; font-variant-numeric: tabular-nums; }
details dl { display: grid; grid-template-columns: max-content 1fr; gap: 0 1em; margin: 0.3em 0; }
details dt { color: #666; }
details dd { margin: 0; }
th { position: sticky; top: 0; background: #f2f2f2; cursor: pointer; white-space: nowrap; }
th[data-order="asc"]::after { content: " \\25B2"; }
th[data-order="desc"]::after { content: " \\25BC"; }
""" + "".join(f'[data-verdict="{kind}"] {{ background: {colour}40; }}\n' for kind, colour in VERDICT_COLOURS.items())

# Sorting by a click on a column's header: numerically when every cell is a number (empty cells last).
SCRIPT = """
const table = document.querySelector("table");
const number = (text) => (text === "" ? Infinity : Number(text));
table.querySelectorAll("thead th").forEach((header, column) => {
  header.addEventListener("click", () => {
    const rows = Array.from(table.tBodies[0].rows);
    const text = (row) => row.cells[column].textContent.trim();
    const numeric = rows.every((row) => !isNaN(number(text(row))));
    const ascending = header.dataset.order !== "asc";
    table.querySelectorAll("thead th").forEach((other) => delete other.dataset.order);
    header.dataset.order = ascending ? "asc" : "desc";
    rows.sort((a, b) => {
      const order = numeric ? number(text(a)) - number(text(b)) || 0 : text(a).localeCompare(text(b));
      return ascending ? order : -order;
    });
    table.tBodies[0].append(...rows);
  });
});
"""


def html_table(df: pd.DataFrame, columns: list[str], title: str, intro: str) -> str:
    """A self-contained HTML page (no network fetches) of ``df``'s ``columns``, every row, sortable by a
    click on a column's header, with ``title`` and the ``intro`` paragraph above it. A ``verdict`` cell is
    tinted with its verdict's colour; a ``details`` cell is HTML already (comparison_view writes it), every
    other cell is escaped text.

    A missing column raises ValueError naming it: the table is not one analysis.compare wrote.
    """
    missing = [column for column in columns if column not in df]
    if missing:
        raise ValueError(
            f"the {title} table lacks columns {missing}; write it with python -m analysis.compare "
            f"(it has {list(df.columns)})"
        )
    kinds = df["verdict"] if "verdict" in columns else pd.Series("", index=df.index)
    headers = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    rows = "\n".join(
        "<tr>"
        + "".join(
            (f'<td data-verdict="{kind}">' if column == "verdict" else "<td>")
            + (value if column == "details" else _text(value))
            + "</td>"
            for column, value in zip(columns, row)
        )
        + "</tr>"
        for kind, row in zip(kinds, df[columns].itertuples(index=False))
    )
    wide = [(columns.index(column) + 1, em) for column, em in WRAPPED_EM.items() if column in columns]
    style = STYLE + "".join(f"td:nth-child({n}) {{ min-width: {em}em; white-space: normal; }}\n" for n, em in wide)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{style}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(intro)}</p>
<table>
<thead><tr>{headers}</tr></thead>
<tbody>
{rows}
</tbody>
</table>
<script>{SCRIPT}</script>
</body>
</html>
"""


def comparison_view(comparison: pd.DataFrame) -> pd.DataFrame:
    """The comparison as its page shows it (COMPARISON_VIEW): the key columns, ``range`` written from
    ``reproduced_low`` and ``reproduced_high``, ``reason`` cut to its first sentence, and ``details``
    (HTML, folded) holding the rest of the reason and the COMPARISON_DETAILS columns.

    A missing column raises ValueError naming it: the table is not one analysis.compare wrote.
    """
    needed = [c for c in COMPARISON_KEY if c != "range"] + ["reproduced_low", "reproduced_high", *COMPARISON_DETAILS]
    missing = [column for column in needed if column not in comparison]
    if missing:
        raise ValueError(
            f"the comparison table lacks columns {missing}; write it with python -m analysis.compare "
            f"(it has {list(comparison.columns)})"
        )
    view = comparison.copy()
    view["range"] = [
        ""
        if pd.isna(low) or pd.isna(high)
        else _text(float(low))
        if low == high
        else f"{_text(float(low))}–{_text(float(high))}"
        for low, high in zip(view["reproduced_low"], view["reproduced_high"])
    ]
    lead_rest = view["reason"].fillna("").astype(str).str.split(r"(?<=\.)\s", n=1, regex=True)
    view["reason"] = lead_rest.str[0]
    view["details"] = [
        _details(rest[1] if len(rest) > 1 else "", row) for rest, row in zip(lead_rest, view.to_dict("records"))
    ]
    return view[COMPARISON_VIEW]


def _details(rest_of_reason: str, row: dict[str, Any]) -> str:
    """A row's details, folded under "more": the reason after its first sentence and every non-empty
    COMPARISON_DETAILS column, as escaped HTML."""
    items = "".join(
        f"<dt>{column}</dt><dd>{_text(row[column])}</dd>"
        for column in COMPARISON_DETAILS
        if not pd.isna(row[column]) and str(row[column]) != ""
    )
    reason = f"<p>{html.escape(rest_of_reason)}</p>" if rest_of_reason else ""
    return f"<details><summary>more</summary>{reason}<dl>{items}</dl></details>"


def _text(value: Any) -> str:
    """A table cell's text: empty for a missing value, 4 significant digits for a float, else escaped."""
    if pd.isna(value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def run_facts(records: list[dict[str, Any]], summary: pd.DataFrame, written: datetime) -> str:
    """The run's facts as RST, for the report's landing page: when they were written (``written``, UTC),
    the records per mode and hardware profile, the commits that made them (each record's
    ``environment.git_sha``, "unknown" where a record has none, as moe_core.records.results writes it
    without git) and the verdicts, overall and per paper (``summary``: verdict_summary.csv, its last row
    ``all``)."""
    missing = [column for column in SUMMARY_VIEW if column not in summary]
    if missing or summary.empty or summary["paper"].iloc[-1] != "all":
        raise ValueError(
            f"the verdict summary lacks columns {missing} or its last row 'all'; "
            "write it with python -m analysis.compare"
        )
    if not records:
        raise ValueError("no records given; pass the run's raw records (results/raw/*/*/*.json)")
    profiles: dict[str, Counter] = {}  # mode -> records per hardware profile
    for record in records:
        profiles.setdefault(record["mode"], Counter())[record["hardware"]] += 1
    testbeds = "; ".join(
        f"{counts.total()} {mode} on " + ", ".join(f"``{hardware}``" for hardware in sorted(counts))
        for mode, counts in sorted(profiles.items())
    )
    commits = Counter(record.get("environment", {}).get("git_sha", "unknown") for record in records)
    total = summary.iloc[-1]
    judged = sum(int(total[kind]) for kind in ("consistent", "differs", "baseline-not-reproduced"))
    lines = [
        "The run's facts",
        "---------------",
        "",
        f"Written {written:%Y-%m-%d %H:%M} UTC by ``analysis.report`` from the files this run wrote.",
        "",
        f"- **Verdicts:** of {int(total['total'])} published numbers, {judged} have a verdict: "
        f"**{int(total['consistent'])} consistent, {int(total['differs'])} differ, "
        f"{int(total['baseline-not-reproduced'])} baseline not reproduced** ({int(total['weak'])} of them weak: "
        f"a range wider than x1.5); not comparable: {int(total['not-comparable'])}, "
        f"not reproduced: {int(total['not-reproduced'])}.",
        f"- **Records:** {len(records)}: {testbeds}.",
        f"- **Code:** the records were made at {'commit' if len(commits) == 1 else 'commits'} "
        + ", ".join(f"``{sha}`` ({n} records)" for sha, n in commits.most_common())
        + ".",
        "",
        ".. list-table:: Verdicts per paper",
        "   :header-rows: 1",
        "",
    ]
    for row in [SUMMARY_VIEW, *summary[SUMMARY_VIEW].astype(str).to_numpy().tolist()]:
        lines += [f"   * - {row[0]}", *(f"     - {cell}" for cell in row[1:])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n")[0])
    parser.add_argument("--comparison", type=Path, required=True, help="comparison CSV from analysis.compare")
    parser.add_argument("--summary", type=Path, required=True, help="verdict summary CSV from analysis.compare")
    parser.add_argument("--out-comparison", type=Path, required=True, help="HTML view of the comparison to write")
    parser.add_argument("--out-summary", type=Path, required=True, help="HTML view of the verdict summary to write")
    parser.add_argument("--out-facts", type=Path, required=True, help="the run's facts (RST) to write")
    parser.add_argument("--fits", type=Path, required=True, help="testbed fits CSV from analysis.compare")
    parser.add_argument("--out-fits", type=Path, required=True, help="HTML view of the testbed fits to write")
    parser.add_argument("records", nargs="+", type=Path, help="the run's raw records")
    args = parser.parse_args(argv)
    try:
        comparison, summary = read_csv(args.comparison), read_csv(args.summary)
        pages = {
            args.out_comparison: html_table(
                comparison_view(comparison),
                COMPARISON_VIEW,
                "Published vs reproduced",
                "Every published number next to ours, with its verdict, the range of ours over the settings "
                "that reproduce the paper's baseline, and the reason's first sentence; a row's details (the "
                "rest of the reason, the tolerance, the testbed, what the number would need) open under "
                "'more'. Click a column's header to sort by it. results/tables/comparison.csv holds every "
                "column, also the points each number came from.",
            ),
            args.out_summary: html_table(
                summary,
                SUMMARY_VIEW,
                "Verdicts per paper",
                "How many published numbers of each paper are consistent or differ at the paper's testbed fitted "
                "to its own baseline rows, are claims whose baseline no plausible setting reproduces, are not "
                "comparable or not reproduced, and how many verdicts are weak (a range over the "
                "baseline-consistent settings wider than x1.5); the last row sums the papers.",
            ),
            args.out_fits: html_table(
                fits := read_csv(args.fits),
                list(fits.columns),
                "Testbed fits",
                "Per paper, the unstated parameters fitted to the paper's own baseline rows (fitted value, "
                "plausible range, the baseline-consistent set's span) and each baseline row's published value, "
                "its value at the fit, the residual and the leave-one-out prediction (analysis.fit). Click a "
                "column's header to sort by it.",
            ),
            args.out_facts: run_facts([read_record(p) for p in args.records], summary, datetime.now(timezone.utc)),
        }
    except (OSError, ValueError) as err:
        sys.exit(f"analysis.report: error: {err}")
    with atomic_outputs(*pages) as tmps:  # all new, or all old
        for tmp, text in zip(tmps, pages.values()):
            tmp.write_text(text, encoding="utf-8")
    print(" ".join(map(str, pages)))


if __name__ == "__main__":
    main()
