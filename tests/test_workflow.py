"""The Snakemake workflow: lint, the planned jobs of the default sweep, and bad configuration."""

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import analysis.papers  # noqa: F401  (registers every paper's tables and figures)
from analysis.registry import FIGURE_REGISTRY, TABLE_REGISTRY
from experiments.dispatchers_sim import sim_points as dispatcher_sim_points
from experiments.lina_inference_sim import record_points as lina_inference_points
from moe_core.config.load import derive_config, load_config
from moe_core.papers import PAPERS
from moe_core.papers.aurora.study import aurora_points
from moe_core.papers.axonn.study import record_points as axonn_record_points
from moe_core.papers.gshard.study import record_points as gshard_record_points
from moe_core.papers.lina.sweeps import lina_measured_points
from moe_core.papers.monta.sweeps import monta_measured_points
from moe_core.schema.points import UNSTATED_PARAMS, point_name, setting_overrides, sim_points, sweep_points


def snakemake(*args, timeout=300):
    return subprocess.run(["snakemake", *args], capture_output=True, text=True, timeout=timeout)


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@dataclass
class DryRun:
    """One dry run (``-n -p``) of the whole default workflow, shared by the tests that read it."""

    results: Path  # its results_dir, which did not exist before the dry run
    output: str  # Snakemake's stdout and stderr
    wrote_results: bool  # whether results_dir existed right after the dry run


@pytest.fixture(scope="module")
def default_dry_run(tmp_path_factory) -> DryRun:
    """The default workflow planned once (a whole dry run takes tens of seconds on 2 cores) into a
    results_dir holding spaces, quotes, `$(...)` and backticks, which the tests below all need."""
    results = tmp_path_factory.mktemp("dry_run") / "we ird 'q\" $(touch PWNED) `touch PWNED2`"
    proc = snakemake("-n", "-p", "--cores", "2", "--config", f"results_dir={results}")
    assert proc.returncode == 0, proc.stderr
    return DryRun(results, proc.stdout + proc.stderr, results.exists())


def job_counts(output: str) -> dict[str, int]:
    """Rule -> jobs planned, from the "Job stats" table a dry run prints."""
    lines = output.partition("Job stats:\n")[2].split("\n\n", 1)[0].splitlines()
    return {words[0]: int(words[1]) for words in map(str.split, lines) if len(words) == 2 and words[1].isdigit()}


def test_dry_run_plans_one_job_per_sweep_point_and_every_figure(default_dry_run):
    cfg = load_config(["configs/default.yaml"])
    points, _ = sweep_points(cfg)
    counts = job_counts(default_dry_run.output)
    assert len(points) == 12 and len(lina_measured_points(cfg)) == 2 and len(monta_measured_points(cfg)) == 3
    assert counts["train_step"] == len(points) + len(lina_measured_points(cfg)) + len(monta_measured_points(cfg))
    # 312: Lina's 4 x 6 points again at each of the 13 settings of its 3 unstated parameters' joint
    # design (5 ends one at a time: the link's two, the batch's two, the launch cost's one; the 8
    # corners); MoNTA's 29 and its 3 tp-8 dispatches again at the other end of its unstated NIC count
    assert counts["sim_train_step"] == 1 and len(sim_points(cfg)) == 45 + 29 + 3 + 312
    assert counts["lina_inference"] == counts["lina_inference_simulated"] == 1
    assert counts["monta_a2a"] == counts["monta_model"] == counts["collectives"] == 1
    assert counts["dispatchers"] == counts["dispatchers_simulated"] == counts["dispatchers_predictions"] == 1
    assert counts["external_steps"] == counts["external_dispatch"] == 1
    assert counts["aurora_simulated"] == counts["aurora_a2a"] == 1
    assert counts["axonn_grids"] == counts["axonn_grid_predictions"] == counts["axonn_simulated"] == 1
    # one rule per registered table, and per paper and source table for the figures, generated from
    # the analysis registries
    tables = {f"table_{table.file}" for table in TABLE_REGISTRY.values()}
    assert {name for name in counts if name.startswith("table_")} == tables
    figures = {
        f"figures_{fig.paper}" + ("" if fig.reads == "tables" else f"_{fig.reads}") for fig in FIGURE_REGISTRY.values()
    }
    assert {name for name in counts if name.startswith("figures_")} == figures
    assert all(counts[name] == 1 for name in counts if name.startswith(("table_", "figures_")))
    assert point_name(points[0]) == "ws2_e4_epr2_sequential_s0"


def test_the_report_opens_on_its_landing_page(tmp_path):
    """The Snakefile declares the report's landing page (analysis/captions/landing.rst), which Snakemake
    renders with the config; made here before any result exists, it says the run's facts are missing."""
    report = tmp_path / "report.html"
    args = [
        "resolved_config",
        "--cores",
        "1",
        "--configfile",
        "configs/ci.yaml",
        "--config",
        f"results_dir={tmp_path / 'r'}",
    ]
    proc = snakemake(*args, "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    landing = json.loads(re.search(r"var workflow_desc = (.*);\n", report.read_text()).group(1))
    assert '<h1 class="title">MoE communication: published vs reproduced</h1>' in landing
    assert "local-cpu" in landing and "How to read a verdict" in landing
    assert "are missing" in landing and "system-message" not in landing  # no RST error in the page


def test_a_paper_target_plans_that_papers_experiments_alone(tmp_path):
    """`snakemake aurora` plans Aurora's record-making jobs and nothing of another paper."""
    proc = snakemake("aurora", "-n", "--cores", "2", "--config", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    jobs = set(job_counts(proc.stdout + proc.stderr)) - {"total"}
    assert jobs == {"resolved_config", "aurora_simulated", "aurora_a2a", "aurora"}


def test_axonn_measures_its_grids_without_the_calibration(tmp_path):
    """A measured AxoNN grid record holds measurements only: it needs no calibration (its prediction,
    axonn_grid_predictions, does), so a new calibration re-runs no measured job."""
    record = tmp_path / "raw" / "axonn" / "axonn_grids" / "ws4_data1xdepth2xrow2xcol1_none.json"
    proc = snakemake(str(record), "-n", "--cores", "2", "--config", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert set(job_counts(proc.stdout + proc.stderr)) - {"total"} == {"resolved_config", "axonn_grids"}


@pytest.mark.parametrize(
    "override,needle",
    [
        ("moe={top_k: 5}", "moe.top_k"),
        ("comm={policy: fifo}", "comm.policy"),
        ("sweep={polcy: [overlap]}", "sweep.polcy"),
        ("aurora={world_size: 0}", "aurora.world_size"),
        ("inference={policies: [fifo]}", "inference.policies"),
        ("paper=a$(touch PWNED)", "paper"),
    ],
)
def test_bad_config_stops_the_workflow_before_any_job(tmp_path, override, needle):
    proc = snakemake("--cores", "2", "--config", f"results_dir={tmp_path}", override)
    assert proc.returncode != 0
    assert "invalid configuration" in proc.stderr and needle in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@dataclass
class MadeRecord:
    """One record of configs/ci.yaml made for real, shared by the tests that only plan around it."""

    results: Path
    target: str  # the record
    args: list[str]  # the Snakemake arguments that made it
    console: list[str]  # what that run printed (stderr, then stdout), quiet as README's profile is


# The quiet levels of README's profile (a whole profile would also write the report).
PROFILE = yaml.safe_load(Path("configs/profiles/default/config.yaml").read_text())


@pytest.fixture(scope="module")
def ci_record(tmp_path_factory) -> MadeRecord:
    """The first dispatcher-study record of configs/ci.yaml, with the config snapshot its job read."""
    results = tmp_path_factory.mktemp("ci_record")
    args = ["--cores", "1", "--configfile", "configs/ci.yaml", "--config", f"results_dir={results}"]
    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], [f"results_dir={results}"])
    target = str(results / "raw" / "common" / "dispatchers_sim" / f"{dispatcher_sim_points(cfg)[0]}.json")
    made = snakemake(target, *args, "--quiet", *PROFILE["quiet"])
    assert made.returncode == 0, made.stderr[-3000:]
    return MadeRecord(results, target, args, (made.stderr + made.stdout).splitlines())


def test_a_quiet_run_lists_no_files_and_ends_on_its_summary(ci_record):
    """README's profile keeps Snakemake to the jobs' names and the progress (no job's file lists, no
    host header), and the run ends on its summary (analysis/summary.py), printed after Snakemake's own
    last lines: here, a record alone, no verdicts and no report yet, each said with where it would be."""
    console, results = ci_record.console, ci_record.results
    assert (
        any(line.endswith("(Rule: dispatchers_simulated)") for line in console)
        and "2 of 2 steps (100%) done" in console
    )
    assert not [
        line for line in console if line.startswith(("localrule ", "rule ", "    output:", "    input:", "  Host:"))
    ]
    assert console[-3:] == [
        f"no verdicts: {results}/tables/verdict_summary.csv was not made (this run's targets did not include the "
        "comparison, rule compare)",
        "",
        f"Report: no report at {results}/report.html; make this run's with the same command plus "
        f"`--report {results}/report.html`",
    ]


def test_a_changed_config_re_measures_what_read_the_old_one(ci_record):
    """The jobs read a config snapshot named by its content, so a changed config is a new input
    of every job that reads it, and Snakemake plans those jobs again (its default rerun trigger
    on a changed set of input files); an unchanged config plans nothing."""
    unchanged = snakemake(ci_record.target, "-n", *ci_record.args)
    assert unchanged.returncode == 0 and "Nothing to be done" in unchanged.stdout + unchanged.stderr
    changed = snakemake(ci_record.target, "-n", *ci_record.args, "dispatch_study={capacity_factor: 1.5}")
    assert changed.returncode == 0, changed.stderr
    assert "rule dispatchers_simulated:" in changed.stdout + changed.stderr
    assert len(list((ci_record.results / "config").iterdir())) == 1  # the dry run wrote no snapshot


def test_a_dry_run_writes_nothing_and_leaves_planned_jobs_their_config(ci_record, default_dry_run):
    """A dry run (or --summary) of another config writes nothing, so the jobs of a sweep already
    planned keep reading the snapshot of the config they were planned with; a dry run into a new
    results_dir (the shared one) does not even create it."""
    results = ci_record.results
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert any(p.parent.name == "config" for p in before)  # the snapshot its jobs read
    for extra in (["-n"], ["--summary"], ["-n", "--configfile", "configs/ci.yaml"]):
        proc = snakemake("--cores", "1", *extra, "--config", f"results_dir={results}", "collectives={iters: 3}")
        assert proc.returncode == 0, proc.stderr
    after = {p: p.read_bytes() for p in results.rglob("*") if p.is_file() and ".snakemake" not in p.parts}
    assert after == before
    assert not default_dry_run.wrote_results


def test_a_second_run_on_a_results_dir_stops_before_its_first_job(ci_record):
    """Two checkouts running the workflow on one results_dir would measure the same points at once,
    contending, and the last writer would win: while one run holds it (moe_core/records/run_lock.py),
    another stops when it starts, naming the first, and leaves the record it would remake as it was."""
    hold = f"from moe_core.records.run_lock import lock_results_dir; lock_results_dir({str(ci_record.results)!r})"
    script = f"{hold}; print('ready', flush=True); input()"
    first = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline() == "ready\n"
    record = Path(ci_record.target).read_bytes()
    try:
        second = snakemake(ci_record.target, "--force", *ci_record.args)  # its job, planned again
    finally:
        first.communicate("\n", timeout=30)
    assert second.returncode != 0
    assert f"is in use by the workflow run of pid {first.pid} on " in second.stderr, second.stderr[-3000:]
    assert Path(ci_record.target).read_bytes() == record


def commands_of_every_rule(output: str) -> dict[str, list[str]]:
    """Rule -> the shell commands a dry run (``-n -p``) of the whole workflow prints for its jobs."""
    commands, rule = {}, None
    for line in output.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("rule", "localrule") and words[1].endswith(":"):
            rule = words[1][:-1]
        elif line.startswith("Shell command: ") and line != "Shell command: None":
            commands.setdefault(rule, []).append(line.removeprefix("Shell command: "))
    return commands


# Stands in for python on the PATH: records its arguments, runs nothing.
FAKE_PYTHON = """#!{python}
import json, os, sys
with open(os.environ["ARGV_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def test_no_rule_lets_the_shell_interpret_results_dir(tmp_path, default_dry_run):
    """Every rule's shell command, run by bash as Snakemake would (with the Snakefile's `logged`
    prefix), passes a results_dir holding spaces, quotes, `$(...)` and backticks to python as
    whole arguments, and the shell runs nothing of it."""
    results = default_dry_run.results
    commands = commands_of_every_rule(default_dry_run.output)
    rules = {line.split()[0] for line in snakemake("--list-rules").stdout.splitlines() if line[:1].isalpha()}
    assert rules - set(commands) == {"all", "resolved_config", "plan", *PAPERS}  # the rules without a shell command
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON.format(python=sys.executable))
    (bin_dir / "python").chmod(0o755)
    prefix = re.search(r'"set -euo pipefail; "\n\s+\'(.*)\'\n', Path("Snakefile").read_text()).group(1)
    prefix = prefix.replace("{{", "{").replace("}}", "}")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_LOG": str(tmp_path / "argv.jsonl")}
    for rule, lines in commands.items():
        for command in lines:
            Path(shlex.split(command)[1]).parent.mkdir(parents=True, exist_ok=True)  # Snakemake makes log folders
            script = f"set -euo pipefail; {prefix}{command}"  # on stdin: collect's command is long
            done = subprocess.run(["bash"], input=script, text=True, cwd=tmp_path, env=env)
            assert done.returncode == 0, (rule, command)
    argvs = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert len(argvs) == sum(len(lines) for lines in commands.values())
    for argv in argvs:
        for arg in argv:
            if "we ird" in arg:  # the whole path in one argument, as a value or as key=value
                assert str(results) in arg, (arg, argv)
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path(".").glob("PWNED*"))
    assert not list(results.parent.rglob("PWNED*"))


def test_a_requested_target_outside_results_dir_matches_no_rule(tmp_path):
    results = tmp_path / "R"
    escaped = f"{results}/raw/../../ESC/train_step/ws2_e2_epr1_sequential_s0.json"
    proc = snakemake(
        "-n", "--cores", "2", escaped, "--configfile", "configs/ci.yaml", "--config", f"results_dir={results}"
    )
    assert proc.returncode != 0 and "MissingRuleException" in proc.stdout + proc.stderr
    assert not (tmp_path / "ESC").exists()


def test_a_yte_template_config_file_is_refused(tmp_path):
    template = tmp_path / "templated.yaml"
    template.write_text("__use_yte__: true\ntrain:\n  iters: ?2 + 1\n")
    proc = snakemake("-n", "--cores", "1", "--configfile", str(template), "--config", f"results_dir={tmp_path}/r")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "invalid configuration" in out and "YTE template" in out, out[-2000:]


# Config files Snakemake's own reading survives but the loader refuses: (content, what the error says).
# Each hung the workflow (a billion values, from 9 lines of aliases) or overflowed its stack at parse.
OVER_LIMIT_CONFIG_FILES = {
    "alias bomb": (
        "l0: &l0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n"
        + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)),
        "YAML node expansion exceeds the configured limit",
    ),
    "nesting": ("train: " + "[" * 100 + "]" * 100 + "\n", "nests lists and mappings deeper than 32 levels"),
    "size": ("train: {iters: 3}\n#" + "x" * 2**20 + "\n", "over the 1 MiB a config file may hold"),
}


@pytest.mark.parametrize("content,problem", OVER_LIMIT_CONFIG_FILES.values(), ids=OVER_LIMIT_CONFIG_FILES)
def test_a_config_file_over_the_loaders_limits_is_refused_at_parse(tmp_path, content, problem):
    configfile = tmp_path / "over.yaml"
    configfile.write_text(content)
    results = tmp_path / "results"
    args = ["-n", "--cores", "1", "--configfile", str(configfile), "--config", f"results_dir={results}"]
    proc = snakemake(*args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"invalid configuration: config file '{configfile}'" in out, out[-2000:]
    assert problem in out and not results.exists(), out[-2000:]


def test_a_results_dir_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    (tmp_path / "a_file").write_text("")
    proc = snakemake("-n", "--cores", "1", "--config", f"results_dir={tmp_path}/a_file/results")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"invalid configuration: results_dir '{tmp_path}/a_file/results': " in out, out[-2000:]
    assert "Traceback" not in out


def test_commands_quote_every_value(tmp_path):
    """A results directory with spaces and shell syntax reaches the job's command line quoted: the
    shell sees one word, runs nothing (no PWNED file), and the job would write where it was told."""
    results = tmp_path / "we ird$(touch PWNED)"
    target = results / "raw/gshard/train_step/ws2_e2_epr1_sequential_s0.json"
    proc = subprocess.run(
        [
            "snakemake",
            str(target),
            "-n",
            "-p",
            "--cores",
            "2",
            "--configfile",
            "configs/ci.yaml",
            "--config",
            f"results_dir={results}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    command = next(line for line in proc.stdout.splitlines() if "-m experiments train_step" in line)
    assert f"--out '{target}'" in command and f"--config '{results}/config/resolved-" in command
    assert not Path("PWNED").exists() and not (tmp_path / "PWNED").exists()


def _lina_at_fit_points(cfg):
    """Lina's records at its fit: its simulated training points and its simulated inference."""
    return sorted(name for name, (paper, _) in sim_points(cfg).items() if paper == "lina") + lina_inference_points(cfg)


AT_FIT_NAMES = {
    "gshard": gshard_record_points,
    "aurora": aurora_points,
    "axonn": axonn_record_points,
    "lina": _lina_at_fit_points,
}


@pytest.mark.parametrize("paper", sorted(AT_FIT_NAMES))
def test_a_run_at_a_fit_names_its_records_alike_at_every_setting(paper):
    """The workflow names a paper's at-fit records before the fit (at the chosen values written out,
    experiments/rules/common.smk): the names must not depend on where the fit lands in the range."""
    cfg = load_config(["configs/default.yaml"])
    params = list(UNSTATED_PARAMS[paper].values())

    def names_at(values):
        return AT_FIT_NAMES[paper](derive_config(cfg, setting_overrides(dict(zip((p.key for p in params), values)))))

    chosen = names_at([p.chosen for p in params])
    assert chosen and names_at([p.low for p in params]) == chosen == names_at([p.high for p in params])
