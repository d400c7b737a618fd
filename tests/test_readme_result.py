"""analysis.readme: the README's result block is written from a run's tables and figure, replaces only
the marked part, and the README carries the markers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from analysis_records import comparison_table

from analysis import explain
from analysis.readme import BEGIN, END, main, replace_block, result_block

README = Path(__file__).parents[1] / "README.md"
RECORDS = pd.DataFrame(
    {
        "paper": ["lina", "lina", "lina", "common", "aurora"],
        "experiment": ["train_step", "train_step", "sim_train_step", "collectives", "aurora_simulated"],
        "point": ["a", "a", "b", "c", "d"],  # the first two: one point's two metrics
        "mode": ["measured", "measured", "simulated", "measured", "simulated"],
    }
)
CONFIG = {"sweep": {"name": "default"}, "hardware_profile": "local-cpu"}


def test_the_block_counts_points_and_verdicts_per_paper():
    block = result_block(
        RECORDS, explain.verdict_summary(comparison_table()), CONFIG, "results/reference/readme/verdicts.png", False
    )
    lines = block.splitlines()
    assert lines[0] == BEGIN and lines[-1] == END
    assert "sweep `default` on `local-cpu`" in block and "of 6 published numbers, 1 consistent, 2 differ" in block
    # paper, measured, simulated, consistent, differs, baseline-not-reproduced, not-comparable, not-reproduced, weak
    assert "| lina | 1 | 1 | 0 | 1 | 1 | 1 | 1 | 1 |" in lines
    assert "| aurora | 0 | 1 | 1 | 1 | 0 | 0 | 0 | 0 |" in lines
    assert "| common | 1 | 0 | – | – | – | – | – | – |" in lines  # paper-neutral: no verdicts
    assert "(results/reference/readme/verdicts.png)" in block and "noisy" not in block
    noisy = result_block(
        RECORDS, explain.verdict_summary(comparison_table()), CONFIG, "results/reference/readme/verdicts.png", True
    )
    assert "Its host was noisy" in noisy


def test_the_command_rewrites_only_the_block_and_copies_the_figure(tmp_path):
    results = tmp_path / "results"
    for folder in ("tables", "config", "figures/common"):
        (results / folder).mkdir(parents=True)
    RECORDS.to_csv(results / "tables" / "records.csv", index=False)
    explain.verdict_summary(comparison_table()).to_csv(results / "tables" / "verdict_summary.csv", index=False)
    (results / "config" / "resolved-abc.yaml").write_text(yaml.safe_dump(CONFIG))
    (results / "figures" / "common" / "verdicts.png").write_bytes(b"png")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    argv = ["--results", str(results), "--readme", str(readme), "--image", str(tmp_path / "docs" / "v.png")]
    main(argv)
    text = readme.read_text()
    assert text.startswith("# Title\n\nbefore\n\n" + BEGIN) and text.endswith(END + "\n\nafter\n")
    assert "old" not in text and "(docs/v.png)" in text and (tmp_path / "docs" / "v.png").read_bytes() == b"png"
    main(argv)
    assert readme.read_text() == text  # the same run: the same README


def test_an_unmarked_readme_is_refused():
    with pytest.raises(ValueError, match="no result block"):
        replace_block("# a README without the markers\n", "block")


def test_the_readme_has_the_block():
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)
