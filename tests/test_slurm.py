"""The SLURM path on a real one-node SLURM cluster: profile, per-rule resources, launcher.

The fixture (tests/slurm_cluster.py) installs Debian's ``slurm-wlm`` and ``munge`` when they are
missing, then starts its own munged, slurmctld and slurmd, this host as the one node, and stops
them afterwards, failed test or not. The CI sweep (configs/ci.yaml), cut to two training-step
points and three message sizes, then runs through ``snakemake --executor slurm --profile configs/profiles/slurm``.

Multi-task jobs on one node: the sweep runs on a 2-node x 1-device hardware description
(``hardware.nodes=2``, ``hardware.devices_per_node=1``), so every 2-rank measured job is a
"2-node" job by the rules' own sizing (experiments.launch.slurm_resources: nodes=2,
tasks=2, mpi) and the launcher starts 2 torchrun agents with ``srun`` and c10d rendezvous, exactly
the multi-node path. Only the placement is changed (``--set-resources <rule>:nodes=1``), because
the cluster has a single node.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from slurm_cluster import Cluster, run, snakemake_slurm, started_cluster

from experiments.collectives import collective_points
from moe_core.config.load import load_config
from moe_core.schema.points import point_name, sweep_points

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
MEASURED_RULES = ("train_step", "collectives")
# The CI sweep cut to what the SLURM path needs: two training-step points (one to cancel, one to
# finish beside it) and the collectives at 1-4 KiB. The one-node cluster runs its jobs one after
# another, each a Snakemake job step, a launcher, two torchrun agents and two ranks starting on
# 2 cores, so every point left out saves about a minute. As Snakemake --config values, which
# load_config merges into the config files the same way.
SWEEP = ["sweep={num_experts: [2], policy: [sequential, overlap]}", "collectives={max_bytes: 4096}"]


@pytest.fixture(scope="module")
def cluster():
    with started_cluster(nodes=1) as cluster:
        yield cluster


def sweep_config():
    """The config of the test's sweep: configs/ci.yaml with the SWEEP overrides."""
    return load_config(["configs/default.yaml", "configs/ci.yaml"], SWEEP)


def measured_targets(results: Path) -> list[str]:
    """The sweep's measured records: its training-step points and the collectives microbenchmark.

    The simulated, analysis and paper-specific rules are local ones the plain CI smoke run (.ci/run)
    covers; leaving them out keeps this test short on 2 cores.
    """
    cfg = sweep_config()
    train = [results / "raw" / cfg.paper / cfg.experiment / f"{point_name(p)}.json" for p in sweep_points(cfg)[0]]
    collectives = results / "raw" / "common" / "collectives" / f"{collective_points(cfg)[0]}.json"
    return [str(path) for path in (*train, collectives)]


def snakemake(results: Path, *extra: str) -> list[str]:
    """The sweep's measured points as SLURM jobs on the test cluster."""
    return [
        *snakemake_slurm(results),
        "--config",
        f"results_dir={results}",
        "hardware={nodes: 2, devices_per_node: 1}",
        *SWEEP,
        "--set-resources",
        *(f"{rule}:nodes=1" for rule in MEASURED_RULES),
        *extra,
        "--",  # the targets: not more --set-resources values
        *measured_targets(results),
    ]


def submitted(output: str) -> Counter:
    """SLURM jobs snakemake's log says it submitted, per rule."""
    return Counter(re.findall(r"submitted with SLURM jobid \d+ \(log: \S*/slurm_logs/rule_(\w+?)/", output))


def measured_records(results: Path) -> dict[str, dict]:
    records = {}
    for path in sorted((results / "raw").rglob("*.json")):
        record = json.loads(path.read_text())
        if record["mode"] == "measured":
            records[str(path.relative_to(results / "raw"))] = record
    return records


@pytest.mark.timeout(1200)
def test_ci_sweep_runs_as_slurm_jobs_and_a_cancelled_point_reruns_alone(cluster, tmp_path):
    env = {**cluster.env, "WANDB_MODE": "disabled"}
    n_train = len(sweep_points(sweep_config())[0])
    assert n_train == 2
    results = tmp_path / "results"
    logs = results / "logs" / "train_step"

    # 1. The CI sweep, one SLURM job per measured point; one train_step job is cancelled while
    #    its ranks start (as a time limit or preemption would). --keep-going: the rest finish.
    start = time.monotonic()
    # Output to a file, not a pipe: nobody reads a pipe while the test waits, and a full one stalls snakemake.
    sweep_log = tmp_path / "sweep.log"
    with open(sweep_log, "w") as log:
        sweep = subprocess.Popen(snakemake(results, "--keep-going"), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        victim = cancel_first_launched_point(logs, cluster, sweep, sweep_log)
        sweep.wait(timeout=1200)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    first_run_s = time.monotonic() - start
    out = sweep_log.read_text()
    assert sweep.returncode != 0 and "CANCELLED" in out, out[-6000:]
    jobs = submitted(out)  # train_step: the sweep's points and any a paper's rules add
    assert jobs["train_step"] == n_train and jobs["collectives"] == 1, (jobs, out[-6000:])

    # The cancelled point left nothing in the records; every other point is a measured record.
    records = measured_records(results)
    assert not list((results / "raw").rglob(f"*{victim}*")), f"partial record of cancelled point {victim}"
    train = sorted(name for name in records if "/train_step/" in name)
    assert len(train) == jobs["train_step"] - 1 and any(name.startswith("common/collectives/") for name in records), (
        sorted(records)
    )
    for name, record in records.items():
        assert record["backend"] == "gloo" and record["hardware"] == "local-cpu", name
    # Each 2-rank job ran 2 SLURM tasks, one torchrun agent each, c10d rendezvous on the node.
    for name in train:
        log = next(logs.rglob(f"{Path(name).stem}.log")).read_text()
        assert "2 tasks: srun" in log and "--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d" in log, log

    # 2. The rerun submits only the cancelled point.
    start = time.monotonic()
    proc = run(*snakemake(results), env=env, timeout=900)
    rerun_s = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:] + cluster.logs()
    assert submitted(out) == Counter(train_step=1), out[-6000:]
    assert list((results / "raw").rglob(f"*/train_step/{victim}.json"))
    assert len(measured_records(results)) == len(records) + 1
    print(
        f"\nSLURM sweep: {first_run_s:.0f} s ({sum(jobs.values())} jobs, 1 cancelled); "
        f"rerun of 1 point: {rerun_s:.0f} s"
    )


def cancel_first_launched_point(
    logs: Path, cluster: Cluster, sweep: subprocess.Popen, sweep_log: Path, timeout_s: float = 240
) -> str:
    """scancel the first train_step job whose launcher has started its srun step; its point name."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sweep.poll() is None:
        for log in logs.rglob("*.log"):
            if "2 tasks: srun" in log.read_text():
                job_id = re.search(r"SLURM job (\d+)", log.read_text()).group(1)
                assert run("scancel", job_id, env=cluster.env).returncode == 0
                return log.stem
        time.sleep(0.2)
    raise AssertionError(
        f"no train_step job started its ranks within {timeout_s:g} s; snakemake said:\n"
        f"{sweep_log.read_text()[-6000:]}\n{cluster.logs()}"
    )
