"""The report's answer up front: the HTML views of the comparison, the run's facts on the landing page and the
verdicts figure's data, on small synthetic comparison tables."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from analysis_records import comparison_table
from docutils.core import publish_parts
from jinja2 import Environment

from analysis import explain
from analysis.figures import render
from analysis.papers.common import verdict_points
from analysis.registry import FigureDataError
from analysis.report import COMPARISON_VIEW, SUMMARY_VIEW, comparison_view, html_table, main, run_facts

LANDING = Path("analysis/captions/landing.rst")


class TableCells(HTMLParser):
    """The text of every header and data cell of an HTML page's table, row by row, with each cell's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, dict]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("th", "td"):
            self.cell, self.attrs = [], dict(attrs)

    def handle_endtag(self, tag):
        if tag in ("th", "td"):
            self.rows[-1].append(("".join(self.cell), self.attrs))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def cells(page: str) -> list[list[tuple[str, dict]]]:
    parser = TableCells()
    parser.feed(page)
    return parser.rows


# ---- the HTML views ------------------------------------------------------------------------------------


def test_html_table_holds_every_row_escaped_and_sortable():
    df = comparison_table()
    page = html_table(comparison_view(df), COMPARISON_VIEW, "Published vs reproduced", "intro <with> markup")
    header, *rows = cells(page)
    assert [text for text, _ in header] == COMPARISON_VIEW
    assert len(rows) == len(df)
    column = {name: i for i, name in enumerate(COMPARISON_VIEW)}
    assert [row[column["id"]][0] for row in rows] == df["id"].tolist()
    assert rows[0][column["reason"]][0] == "ours <1.2> is 0.66x & below"  # text, not markup
    assert rows[0][column["published"]][0] == "1.83" and rows[5][column["reproduced"]][0] == ""
    # the verdict cell carries its row's verdict
    kinds = [row[column["verdict"]][1]["data-verdict"] for row in rows]
    assert kinds == ["baseline-not-reproduced", "differs", "consistent", "differs", "not-comparable", "not-reproduced"]
    assert "&lt;with&gt;" in page and 'addEventListener("click"' in page and "<thead>" in page
    assert "src=" not in page and "http" not in page  # self-contained: nothing fetched


def test_the_comparison_page_puts_the_key_columns_first_and_folds_the_details():
    """id, paper, verdict, the values and their range, the reason's first sentence; the rest of the reason
    and the qualifying columns under "more"."""
    df = comparison_table()
    df.loc[1, "reason"] = "does not hold: ours 0 against 1.7 (0.00x). The copies <cost> 0 ms at 30 MB."
    view = comparison_view(df)
    assert COMPARISON_VIEW[:8] == ["id", "paper", "verdict", "published", "reproduced", "range", "unit", "reason"]
    assert view.loc[0, "range"] == "1.1–2" and view.loc[4, "range"] == "11.6" and view.loc[5, "range"] == ""
    assert view.loc[1, "reason"] == "does not hold: ours 0 against 1.7 (0.00x)."
    details = view.loc[1, "details"]
    assert details.startswith("<details><summary>more</summary>")
    assert "<p>The copies &lt;cost&gt; 0 ms at 30 MB.</p>" in details  # the rest of the reason, escaped
    assert "<dt>weak</dt><dd>True</dd>" in details and "<dt>hardware</dt><dd>lina-a100-4x4</dd>" in details
    assert "<dt>needs</dt>" not in details  # empty columns are left out


def test_html_table_names_the_missing_columns():
    with pytest.raises(ValueError, match=r"lacks columns \['reason', 'needs'\].*analysis.compare"):
        comparison_view(comparison_table().drop(columns=["reason", "needs"]))
    with pytest.raises(ValueError, match=r"lacks columns \['weak'\].*analysis.compare"):
        html_table(comparison_table().drop(columns=["weak"]), SUMMARY_VIEW[:1] + ["weak"], "x", "y")


def test_the_pages_refuse_a_table_without_its_columns_and_write_nothing(tmp_path):
    comparison, summary = tmp_path / "comparison.csv", tmp_path / "verdict_summary.csv"
    comparison_table().drop(columns=["verdict"]).to_csv(comparison, index=False)
    explain.verdict_summary(comparison_table()).to_csv(summary, index=False)
    fits = tmp_path / "testbed_fit.csv"
    pd.DataFrame({"paper": ["lina"], "name": ["train.batch_size"], "fitted": [36.6]}).to_csv(fits, index=False)
    names = ("comparison.html", "verdict_summary.html", "run.rst", "testbed_fit.html")
    outputs = [tmp_path / "out" / name for name in names]
    with pytest.raises(SystemExit, match="lacks columns \\['verdict'\\]"):
        main(
            ["--comparison", str(comparison), "--summary", str(summary), "--out-comparison", str(outputs[0])]
            + ["--out-summary", str(outputs[1]), "--out-facts", str(outputs[2])]
            + ["--fits", str(fits), "--out-fits", str(outputs[3]), str(tmp_path / "record.json")]
        )
    assert not any(path.exists() for path in outputs)


def test_a_registered_table_is_written_as_csv_and_as_its_report_page(tmp_path, figure_tables):
    """analysis.tables writes the table's CSV and, for the report, a sortable page of the same rows (the
    report shows HTML inline, where it offers a CSV for download)."""
    import analysis.tables as tables_mod

    records = tmp_path / "records.csv"
    figure_tables[0].to_csv(records, index=False)
    csv, page = tmp_path / "t" / "gshard_scaling.csv", tmp_path / "p" / "gshard_scaling.html"
    tables_mod.main(
        ["--records", str(records), "--table", "gshard_scaling", "--out", str(csv), "--out-html", str(page)]
    )
    df, text = pd.read_csv(csv), page.read_text()
    assert len(df) > 0 and text.count("<tr>") == len(df) + 1  # a header row and every row
    assert all(f"<th>{column}</th>" in text for column in df.columns)


# ---- the run's facts on the landing page ------------------------------------------------------------------


def records(*specs: tuple[str, str, str, int]) -> list[dict]:
    """Raw records as analysis.report reads them: (mode, hardware, git sha, how many)."""
    return [
        {"mode": mode, "hardware": hardware, "environment": {"git_sha": sha}}
        for mode, hardware, sha, n in specs
        for _ in range(n)
    ]


def test_run_facts_count_the_records_commits_and_verdicts():
    summary = explain.verdict_summary(comparison_table())
    run = records(("measured", "local-cpu", "abc1234", 2), ("simulated", "lina-a100-4x4", "def5678-dirty", 3))
    text = run_facts(run, summary, datetime(2026, 12, 4, 10, 30, tzinfo=timezone.utc))
    assert "Written 2026-12-04 10:30 UTC" in text
    assert "of 6 published numbers, 4 have a verdict: **1 consistent, 2 differ, 1 baseline not reproduced**" in text
    assert "(1 of them weak: a range wider than x1.5)" in text
    assert "not comparable: 1, not reproduced: 1." in text
    assert "5: 2 measured on ``local-cpu``; 3 simulated on ``lina-a100-4x4``" in text
    assert "commits ``def5678-dirty`` (3 records), ``abc1234`` (2 records)" in text
    body = publish_parts(text, writer="html", settings_overrides={"halt_level": 2})["body"]  # valid RST
    table = cells(body)
    assert [text for text, _ in table[0]] == SUMMARY_VIEW
    assert [row[0][0] for row in table[1:]] == ["aurora", "lina", "all"]


def test_run_facts_need_the_summary_and_records():
    summary = explain.verdict_summary(comparison_table())
    with pytest.raises(ValueError, match="last row 'all'"):
        run_facts(records(("measured", "local-cpu", "abc", 1)), summary.iloc[:-1], datetime.now(timezone.utc))
    with pytest.raises(ValueError, match="no records"):
        run_facts([], summary, datetime.now(timezone.utc))


def render_landing(tmp_path: Path, facts: str | None) -> str:
    """The landing page's HTML as Snakemake's report renders it (snakemake/report/__init__.py: Jinja with the
    config and the report's files, a link target per file, then docutils), with the run's facts as a file."""
    files = [SimpleNamespace(target=name, path=tmp_path / name) for name in ("comparison.html", "verdicts.png")]
    if facts is not None:
        (tmp_path / "run.rst").write_text(facts)
        files.append(SimpleNamespace(target="run.rst", path=tmp_path / "run.rst"))
    links = "".join(f"\n.. _{file.target}: #\n" for file in [*files, SimpleNamespace(target="verdict_summary.html")])
    env = Environment(trim_blocks=True, lstrip_blocks=True)
    snakemake = SimpleNamespace(config={"hardware_profile": "local-cpu"})
    text = env.from_string(LANDING.read_text() + links).render(snakemake=snakemake, files=files, categories={})
    return publish_parts(text, writer="html", settings_overrides={"halt_level": 2})["html_body"]


def test_the_landing_page_includes_the_run_facts_when_the_run_wrote_them(tmp_path):
    summary = explain.verdict_summary(comparison_table())
    facts = run_facts(records(("measured", "local-cpu", "abc1234", 2)), summary, datetime.now(timezone.utc))
    page = render_landing(tmp_path, facts)
    assert "local-cpu" in page and "How to read a verdict" in page and "What the categories hold" in page
    assert "<strong>1 consistent, 2 differ, 1 baseline not reproduced</strong>" in page and "abc1234" in page
    assert "are missing" not in page
    # its links open the comparison table and the verdicts figure themselves, not their captions
    assert f"app.setView({{content:'html',contentPath:results['{tmp_path / 'comparison.html'}'].data_uri" in page
    assert f"app.setView({{content:'img',contentPath:results['{tmp_path / 'verdicts.png'}'].data_uri" in page
    without = render_landing(tmp_path, None)
    assert "are missing" in without and "Written" not in without and "consistent," not in without  # none invented


# ---- the verdicts figure -----------------------------------------------------------------------------------


def test_verdict_points_are_the_judged_rows_as_log_ratios_with_their_band():
    df = verdict_points(comparison_table())
    assert df["id"].tolist() == ["lina-fig3-median", "lina-fig15-overhead", "aurora-fig12-gain", "aurora-fig12-gain"]
    assert df["kind"].tolist() == ["baseline-not-reproduced", "differs", "consistent", "differs"]
    assert df.loc[0, "log_ratio"] == pytest.approx(math.log2(1.2 / 1.83))
    assert df.loc[0, ["log_low", "log_high"]].tolist() == pytest.approx([math.log2(1.1 / 1.83), math.log2(2.0 / 1.83)])
    assert df.loc[1, "log_ratio"] == -math.inf and df.loc[1, "log_low"] == -math.inf  # zero: at the axis' edge
    # consistent between 1 - tolerance and 1 + tolerance, open beyond a published bound
    assert df.loc[0, ["band_low", "band_high"]].tolist() == [pytest.approx(math.log2(0.75)), math.inf]
    assert df.loc[1, ["band_low", "band_high"]].tolist() == pytest.approx([math.log2(0.75), math.log2(1.25)])
    assert df.loc[2, ["band_low", "band_high"]].tolist() == [-math.inf, pytest.approx(math.log2(1.5))]
    assert df["label"].tolist() == [
        "fig3-median",
        "fig15-overhead",
        "fig12-gain (aurora-bigswitch-100g)",  # one id on two testbeds: told apart
        "fig12-gain (aurora-bigswitch-hetero)",
    ]


def test_verdict_points_name_the_missing_columns():
    with pytest.raises(FigureDataError, match=r"lacks columns \['bound'\].*analysis.compare"):
        verdict_points(comparison_table().drop(columns=["bound"]))


def test_the_verdicts_figure_renders_from_the_comparison_alone(tmp_path):
    empty = pd.DataFrame()
    outputs = render("verdicts", empty, empty, tmp_path / "verdicts.png", comparison_table())
    assert [p.name for p in outputs] == ["verdicts.png", "verdicts.pdf"]
    assert all(p.stat().st_size > 1000 for p in outputs)
    with pytest.raises(ValueError, match="needs the comparison table"):
        render("verdicts", empty, empty, tmp_path / "a.png")
    unjudged = comparison_table().assign(verdict="not-comparable")
    with pytest.raises(FigureDataError, match="no row with a verdict"):
        render("verdicts", empty, empty, tmp_path / "b.png", unjudged)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts.pdf", "verdicts.png"]
