"""The README's result, written from a finished run rather than pasted by hand: per paper how many points
were measured and simulated and the verdicts, the verdicts figure beside it, and the run they came from.

    python -m analysis.readme --results results --readme README.md --image results/reference/readme/verdicts.png

It rewrites only the part of the README between the BEGIN and END lines and copies the run's
``figures/common/verdicts.png`` to ``--image``; run it after the default run to show that run's result.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import yaml

from analysis.explain import VERDICTS
from analysis.files import read_csv
from analysis.summary import noisy_host

BEGIN = "<!-- result: written by python -m analysis.readme; do not edit by hand -->"
END = "<!-- end of result -->"


def result_block(records: pd.DataFrame, summary: pd.DataFrame, config: dict, image: str, noisy: bool) -> str:
    """The README's result in Markdown: a table with one row per paper (and ``common``, the paper-neutral
    experiments) of its measured and simulated points and its verdicts (``summary``:
    verdict_summary.csv), the run's sweep and hardware profile (``config``: its resolved config), a
    warning when its host was ``noisy`` (analysis.summary.noisy_host), and the verdicts figure at
    ``image`` (a path relative to the README)."""
    points = records.drop_duplicates(["paper", "experiment", "point"]).groupby(["paper", "mode"]).size()
    counts = summary.set_index("paper")
    papers = sorted(set(points.index.get_level_values("paper")) | set(counts.index) - {"all"})
    header = ["paper", "measured points", "simulated points", *VERDICTS, "weak"]
    rows = [header, ["---"] * len(header)]
    for paper in papers:
        verdicts = [str(counts.loc[paper, kind]) if paper in counts.index else "–" for kind in [*VERDICTS, "weak"]]
        rows.append([paper, *(str(points.get((paper, mode), 0)) for mode in ("measured", "simulated")), *verdicts])
    total = counts.loc["all"]
    lines = [
        BEGIN,
        "",
        f"The run of sweep `{config['sweep']['name']}` on `{config['hardware_profile']}` (measured here; "
        f"simulated on each paper's testbed profile): of {total['total']} published numbers, "
        f"{total['consistent']} consistent, {total['differs']} differ, {total['baseline-not-reproduced']} "
        f"baseline not reproduced, {total['not-comparable']} not comparable, {total['not-reproduced']} "
        "not reproduced."
        + (
            " Its host was noisy (other processes competed for the CPU), so its measured times are not to be trusted."
            if noisy
            else ""
        ),
        "",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"![Every published number with a verdict: reproduced / published on one log axis]({image})",
        "",
        END,
    ]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part from its BEGIN line to its END line replaced by ``block``; ValueError
    when it lacks either, so a README is never rewritten somewhere unmarked."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no result block: put the lines {BEGIN!r} and {END!r} where it goes")
    return text[:start] + block + text[end + len(END) :]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.readme", description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the finished run's results_dir")
    parser.add_argument("--readme", type=Path, default=Path("README.md"), help="the README to update")
    parser.add_argument(
        "--image", type=Path, default=Path("results/reference/readme/verdicts.png"), help="where the figure goes"
    )
    args = parser.parse_args(argv)
    try:
        configs = sorted((args.results / "config").glob("resolved-*.yaml"), key=os.path.getmtime)
        if not configs:
            raise ValueError(f"{args.results / 'config'} holds no resolved config: run the workflow to the end")
        block = result_block(
            read_csv(args.results / "tables" / "records.csv"),
            read_csv(args.results / "tables" / "verdict_summary.csv"),
            yaml.safe_load(configs[-1].read_text()),
            os.path.relpath(args.image, args.readme.parent).replace(os.sep, "/"),
            noisy_host(args.results / "logs") is not None,
        )
        text = replace_block(args.readme.read_text(), block)
        args.image.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.results / "figures" / "common" / "verdicts.png", args.image)
    except (OSError, ValueError, KeyError) as err:
        sys.exit(f"analysis.readme: error: {err}")
    args.readme.write_text(text)
    print(f"{args.readme}: result of {args.results}; {args.image}")


if __name__ == "__main__":
    main()
