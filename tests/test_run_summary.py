"""The run's summary on the console (analysis/summary.py): the verdicts as the run wrote them, whatever
their columns, the noisy-host warning only when calibration or validation logged one, where the report
is, and a failed job's rule with its log's last lines."""

import os

from analysis.summary import failed_jobs, run_summary

NOISY = "warning: 40 of 42 held-out records were measured on a noisy host: others used 37% of the host's CPU"


def results(tmp_path, verdicts: str | None = None, logs: dict[str, str] | None = None):
    """A results_dir with the verdict table ``verdicts`` (CSV text; None: none) and ``logs`` (name -> text)."""
    (tmp_path / "tables").mkdir()
    (tmp_path / "logs").mkdir()
    if verdicts is not None:
        (tmp_path / "tables" / "verdict_summary.csv").write_text(verdicts)
    for name, text in (logs or {}).items():
        (tmp_path / "logs" / f"{name}.log").write_text(text)
    return tmp_path


def test_the_verdicts_are_printed_with_whatever_columns_the_table_has(tmp_path):
    csv = "paper,consistent,weak,differs,total\naurora,7,,4,11\nall,7,2,4,13\n"
    lines = run_summary(results(tmp_path, csv)).splitlines()
    assert lines[0] == f"Verdicts per paper ({tmp_path}/tables/verdict_summary.csv):"
    assert lines[1].split() == ["paper", "consistent", "weak", "differs", "total"]
    assert lines[3].split() == ["aurora", "7", "-", "4", "11"] and lines[4].split() == ["all", "7", "2", "4", "13"]


def test_a_missing_or_unreadable_verdict_table_is_one_line_naming_it(tmp_path):
    path = tmp_path / "tables" / "verdict_summary.csv"
    assert run_summary(results(tmp_path)).startswith(f"no verdicts: {path} was not made")
    path.write_bytes(b"\xff\xfe\x00")
    assert run_summary(tmp_path).startswith(f"no verdicts: {path} could not be read (")


def test_a_noisy_host_is_named_with_what_to_do_only_when_a_log_flagged_it(tmp_path):
    quiet = run_summary(results(tmp_path, logs={"calibrate": "fit: ok\n", "validate": "warning: other\n"}))
    assert "NOISY" not in quiet and "--forcerun" not in quiet
    (tmp_path / "logs" / "validate.log").write_text(f"fit\n{NOISY}\n")
    noisy = run_summary(tmp_path)
    assert f"  {NOISY}\n" in noisy and "NOISY HOST: " in noisy
    assert "`--forcerun train_step collectives`" in noisy


def test_the_report_is_named_when_this_run_made_it_else_how_to_make_it(tmp_path):
    report = results(tmp_path) / "report.html"
    assert run_summary(tmp_path).endswith(
        f"no report at {report}; make this run's with the same command plus `--report {report}`"
    )
    report.write_text("<html>")
    os.utime(report, (1000.0, 1000.0))
    assert f"Report: {report} is from an earlier run" in run_summary(tmp_path, since=2000.0)
    assert run_summary(tmp_path, since=500.0).endswith(
        f"Report: {report} (open it in a browser; it opens on the verdicts)"
    )


def test_a_failed_job_is_named_with_its_logs_last_lines(tmp_path):
    log = tmp_path / "calibrate.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "error: config key 'x': bad\n")
    text = failed_jobs([("calibrate", [str(log)]), ("collect", [str(tmp_path / "none.log")]), ("all", [])])
    lines = text.splitlines()
    assert lines[:2] == ["error: rule calibrate failed", f"  the last 10 lines of {log}:"]
    assert lines[2:12] == [f"    line {i}" for i in range(21, 30)] + ["    error: config key 'x': bad"]
    assert lines[12:] == [
        "error: rule collect failed",
        f"  {tmp_path}/none.log: empty or missing",
        "error: rule all failed (it has no log)",
    ]
