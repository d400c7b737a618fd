# What every rules file shares: the resolved config, the SLURM sizing of measured jobs, and how a
# command line is built (every value quoted: config values never reach a shell unquoted).

import atexit
import shlex
from pathlib import Path
import sys
import time

from analysis.summary import failed_jobs, run_summary
from experiments.launch import SLURM_RESOURCE_KEYS, plan_text, slurm_resources
from moe_core.config.load import config_digest, derive_config
from moe_core.schema.points import chosen_setting, setting_overrides
from moe_core.records.run_lock import lock_results_dir


# One workflow run per results_dir (moe_core/records/run_lock.py): a second run on it, from another
# checkout or working directory, stops here naming the first. Taken when the run starts its jobs,
# not when the workflow is parsed, so dry runs, --summary and --lint, and the Snakemake a job runs
# in on a cluster (started with --no-hooks), never take it.
onstart:
    lock_results_dir(RESULTS)


# The console ends on the answer (analysis/summary.py). After a run that succeeded: the verdicts per
# paper, a noisy-host warning when calibration or validation found one, and where the report is.
# Snakemake writes the report (--report-after-run) after this handler returns, so the summary is
# printed when Snakemake exits, after the report's lines. Neither handler runs on a dry run, nor in
# the Snakemake a cluster job runs in (--no-hooks).
RUN_STARTED = time.time()  # a report older than this is an earlier run's


onsuccess:
    atexit.register(lambda: print(run_summary(RESULTS, since=RUN_STARTED), flush=True))


# After a failure: each failed job's rule and its log's last lines, last on the console (at exit too,
# after Snakemake's own closing lines). The quiet profile (configs/profiles/default: `quiet: [rules,
# ...]`) hides Snakemake's "Error in rule" block, which also lists every input file of the job. The
# failed jobs are the scheduler's (workflow.scheduler.failed: Snakemake 9 has no public name for them).
onerror:
    _failed = [(job.rule.name, [str(log) for log in job.log]) for job in workflow.scheduler.failed]
    atexit.register(lambda: print(failed_jobs(sorted(_failed)), file=sys.stderr, flush=True))


# The validated, fully resolved config every job of this run reads, named by its content and
# written by a job, never when the workflow is parsed. So a dry run, --summary or --lint writes
# nothing, and a later invocation with another config gets a snapshot of its own, so it cannot
# change the config of jobs another invocation has planned. A changed config is a new input file,
# newer than every record, so Snakemake re-measures what reads it, also where its metadata is gone
# (a copied or cleaned results directory). The Snakefile's rule resolved_config writes it.
RESOLVED_CONFIG = f"{RESULTS}/config/resolved-{config_digest(CFG)}.yaml"

# Every raw record file of the run: each rules file adds the records its rules write
# (``RAW_RECORDS += ...``), results/raw/<paper or "common">/<experiment>/<point>.json. The analysis
# collects them all; a paper's target (the Snakefile) makes its folder's.
RAW_RECORDS = []


# The workflow's second stage (analysis.compare: "simulated at the fit"). The testbed fit reads a smooth
# surface through the sensitivity runs, which smooths over steps the simulator takes; so each paper with
# a fit is simulated again at its fitted setting: rule fitted_settings writes the setting as a config
# layer (fitted_layer), the paper's at-fit rules run its simulations on it into AT_FIT, and rule compare
# reads those runs. A paper's rules file declares its at-fit rules' records (AT_FIT_RECORDS += ...), named
# with at_setting_config: a run at a setting has no sensitivity runs, and its names do not depend on it.
AT_FIT = f"{RESULTS}/at_fit"
AT_FIT_RECORDS = []
AT_FIT_PAPERS = []  # the papers simulated at their fit (each rules file adds its own)


# The priority of the simulated jobs that take longest (a minute or more each on 2 cores): Snakemake
# starts jobs of higher priority first, so the short ones fill the other cores around them instead of
# one long job running alone at the end of its stage (the default run's simulated stage: 226 s with
# Lina's inference simulation alone for the last 76, before this priority).
LONG_JOB = 1


def fitted_layer(paper):
    """The config layer of ``paper``'s fitted testbed (rule fitted_settings)."""
    return f"{RESULTS}/fits/{paper}.yaml"


def at_fit_dir(wildcards, output):
    """An at-fit rule's results directory, AT_FIT (its records are <it>/raw/<paper>/<experiment>/<point>.json)."""
    return str(Path(output[0]).parents[3])


def at_setting_config(paper):
    """The run's config at one setting of ``paper``'s unstated parameters (their chosen values, written
    out), which names the records of its runs at the fit."""
    return derive_config(CFG, setting_overrides(chosen_setting(paper)))


def at_fit_records(paper, record_points):
    """The records of ``paper``'s study at its fit: ``record_points`` (config -> experiment -> its point
    names) at a setting (at_setting_config), in AT_FIT."""
    return [
        f"{AT_FIT}/raw/{paper}/{experiment}/{point}.json"
        for experiment, points in record_points(at_setting_config(paper)).items()
        for point in points
    ]


def quoted(words):
    """One shell-safe string of ``words`` (config overrides, names, paths)."""
    return shlex.join(str(word) for word in words)


# Every measured job of the full run, rule -> each job's SLURM resources, filled where each measured
# rule is defined (measured_resources); rule `plan` (the Snakefile) prints their count and GPU-hours.
MEASURED_JOBS = {}


def print_plan(log):
    """Rule plan's work: what MEASURED_JOBS ask (experiments.launch.plan_text), on the console and in ``log``."""
    text = plan_text(MEASURED_JOBS)
    Path(log).write_text(f"{text}\n")
    print(text)


def measured_resources(world_size, rule, jobs=1):
    """Snakemake resources of a measured job of ``world_size`` ranks (experiments/launch.py sizes
    nodes, tasks, CPUs, memory, GPUs for SLURM; locally only threads matter), recorded in
    MEASURED_JOBS as ``jobs`` jobs of ``rule``. Keys a job leaves unset (e.g. mpi, gpu on CPU)
    evaluate to None, which Snakemake drops."""
    sizes = slurm_resources(CFG, world_size)
    MEASURED_JOBS.setdefault(rule, []).extend([sizes] * jobs)
    return {key: sizes.get(key) for key in SLURM_RESOURCE_KEYS}
