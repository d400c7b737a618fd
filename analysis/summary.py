"""The run's answer on the console: what the workflow prints last, so a run ends on its result rather
than on Snakemake's bookkeeping.

After a run that succeeded (the Snakefile's ``onsuccess``): the verdicts per paper as the run wrote
them (``tables/verdict_summary.csv``, printed with whatever columns it has), a warning when this run's
calibration or validation found the host noisy (their logs' ``warning: ... noisy`` lines, with what to
do), and where the report is. After a failure (``onerror``): each failed job's rule and the last lines
of its log, the line that names the bad key or the failed rank. Print a finished run's summary again:

    python -m analysis.summary --results results
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.files import read_csv, with_none
from moe_core.records.console import table

# The jobs whose logs say whether the measured records came from a noisy host (moe_core.host.noise):
# the calibration fits the simulator on them, the validation compares it with the held-out ones.
NOISE_LOGS = ("calibrate", "validate")
# The rules that measure the records calibration and validation read: rerunning them re-measures those
# records and redoes everything downstream.
MEASURED_RULES = ("train_step", "collectives")
FAILED_LOG_LINES = 10


def run_summary(results_dir: str | Path, report: str | Path | None = None, since: float | None = None) -> str:
    """The run's summary for ``results_dir``: verdicts, noisy-host warning, report. ``report``: where the
    report would be (default ``<results_dir>/report.html``); ``since``: the run's start (seconds since the
    epoch), so a report an earlier run left there is named as such."""
    results_dir = Path(results_dir)
    report = Path(report) if report is not None else results_dir / "report.html"
    parts = [verdicts(results_dir / "tables" / "verdict_summary.csv"), noisy_host(results_dir / "logs")]
    parts.append(report_line(report, since))
    return "\n\n".join(part for part in parts if part)


def verdicts(path: Path) -> str:
    """The verdict table as the run wrote it, or a line saying it is missing and why it may be."""
    if not path.is_file():
        return f"no verdicts: {path} was not made (this run's targets did not include the comparison, rule compare)"
    try:
        frame = read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        return f"no verdicts: {path} could not be read ({type(err).__name__}: {err})"
    rows = with_none(frame).to_dict("records")
    return f"Verdicts per paper ({path}):\n{table(rows, floatfmt='g')}"


def noisy_host(logs: Path) -> str | None:
    """This run's noisy-host warnings (calibration, validation) and what to do, or None when none."""
    warnings = []
    for name in NOISE_LOGS:
        path = logs / f"{name}.log"
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            warnings += [line for line in lines if line.startswith("warning:") and "noisy" in line]
    if not warnings:
        return None
    rules = " ".join(MEASURED_RULES)
    return "\n".join(
        [
            "NOISY HOST: other processes competed for this host's CPU while the suite measured, so the measured",
            "times, the calibrated simulator and its validation errors of this run are not to be trusted:",
            *(f"  {line}" for line in warnings),
            "What to do: stop other work on this host (or run on a quiet one), then re-measure with the same",
            f"command plus `--forcerun {rules}` (calibration, validation and the verdicts follow).",
        ]
    )


def report_line(report: Path, since: float | None) -> str:
    """Where the report is, or how to make it when this run did not."""
    if report.is_file() and (since is None or report.stat().st_mtime >= since):
        return f"Report: {report} (open it in a browser; it opens on the verdicts)"
    made = f"{report} is from an earlier run" if report.is_file() else f"no report at {report}"
    return f"Report: {made}; make this run's with the same command plus `--report {report}`"


def failed_jobs(jobs: list[tuple[str, list[str]]], lines: int = FAILED_LOG_LINES) -> str:
    """Each failed job (``(rule, its log files)``) named, with the last ``lines`` of each of its logs."""
    out = []
    for rule, logs in jobs:
        out.append(f"error: rule {rule} failed" + ("" if logs else " (it has no log)"))
        for log in map(Path, logs):
            text = log.read_text(errors="replace").splitlines() if log.is_file() else []
            out.append(f"  the last {min(lines, len(text))} lines of {log}:" if text else f"  {log}: empty or missing")
            out += [f"    {line}" for line in text[-lines:]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.summary", description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the run's results_dir")
    parser.add_argument("--report", type=Path, help="the report's path (default: <results>/report.html)")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results {args.results}: no such directory")
    print(run_summary(args.results, args.report))


if __name__ == "__main__":
    main()
