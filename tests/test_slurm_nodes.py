"""The multi-node SLURM path on a real two-node SLURM cluster: ``srun`` + ``torchrun`` across nodes.

The fixture (tests/slurm_cluster.py) starts a cluster of two slurmd nodes, node1 and node2, each in
namespaces of its own and joined by veths, so that torchrun's c10d rendezvous and gloo cross a
network between nodes; it skips where namespaces cannot be made. Every job goes through the suite's
SLURM profile and Snakemake's SLURM executor, unchanged: on a 2-node x 2-device hardware
description a 4-rank point is a 2-node job of 2 ranks each (experiments.launch.slurm_resources),
and the launcher starts one torchrun agent per node with srun. Only the CPUs a job asks are cut
(``cpus_per_task=1``), so that the two measured jobs of the first test fit the nodes at once.

The faults, each to node2 while the job's training loop runs: its ranks stopped (SIGSTOP, a hung
node), or the node lost (its slurmd and everything else on it killed). Each job must end within
``parallel.timeout_s`` + 10 s of its fault, its last line naming the node's ranks (which ranks:
c10d numbers the agents in joining order) and the node, Snakemake must report the failed job, and
no record may be published.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from slurm_cluster import Cluster, snakemake_slurm, started_cluster

from moe_core.config.load import load_config
from moe_core.schema.points import point_name, point_overrides, sweep_points

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 20  # parallel.timeout_s of every job here
HUNG_MARGIN_S = 10  # a job ends within timeout_s + 10 s of its fault (experiments.launch) ...
LOAD_SLACK_S = 10  # ... plus what a loaded 2-core machine may add
SNAKEMAKE_S = 600  # a generous bound on one Snakemake run here (each takes one to two minutes)
# One training point of 4 ranks and the collectives of 4 ranks at 1 KiB; Snakemake --config values.
SETTINGS = [
    "hardware={nodes: 2, devices_per_node: 2}",
    f"parallel={{timeout_s: {TIMEOUT_S}}}",
    "collectives={world_size: 4, max_bytes: 1024}",
]
# The faults' jobs: work long enough (minutes) to be caught at it, on node2, which is not the one
# that runs the job's batch script (and launcher).
LONG_WORK = "train={iters: 2000}"
LOST_NODE = "node2"
LOSS_TOLERANCE = {"rel": 1e-5, "abs": 1e-6}  # as the expert-parallel tests compare losses across layouts


@pytest.fixture(scope="module")
def cluster():
    with started_cluster(nodes=2) as cluster:
        yield cluster


def sweep(seed: int) -> str:
    return f"sweep={{world_size: [4], num_experts: [4], policy: [overlap], seed: [{seed}]}}"


def train_point(seed: int) -> dict:
    """The one training point of the sweep with ``seed``."""
    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], [*SETTINGS, sweep(seed)])
    (point,) = sweep_points(cfg)[0]
    return point


def record_of(results: Path, seed: int) -> Path:
    return results / "raw" / "gshard" / "train_step" / f"{point_name(train_point(seed))}.json"


def job_log(results: Path, seed: int) -> Path:
    return results / "logs" / "train_step" / "gshard" / f"{point_name(train_point(seed))}.log"


def snakemake(cluster: Cluster, results: Path, seed: int, *targets: Path | str) -> subprocess.Popen:
    """The SLURM profile's Snakemake on ``targets`` (training point ``seed``; a ``key=value`` target is
    a --config value), its output in ``results/snakemake.log`` (a file: nobody reads a pipe while the
    test waits)."""
    env = {**cluster.env, "WANDB_MODE": "disabled"}
    settings = [target for target in targets if isinstance(target, str)]
    argv = [
        *snakemake_slurm(results),
        "--config",
        f"results_dir={results}",
        *SETTINGS,
        *settings,
        sweep(seed),
        "--set-resources",
        "train_step:cpus_per_task=1",
        "collectives:cpus_per_task=1",
        "--",  # the targets: not more --set-resources values
        *(str(target) for target in targets if isinstance(target, Path)),
    ]
    results.mkdir(parents=True, exist_ok=True)
    with open(results / "snakemake.log", "w") as log:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, results: Path, cluster: Cluster) -> str:
    """Wait for a Snakemake run; its output. Once it has reported a failed job it is stopped
    (SIGTERM): its shutdown waits out the SLURM plugin's next status check, which backs off to a
    minute and more while a job runs."""
    log, deadline = results / "snakemake.log", time.monotonic() + SNAKEMAKE_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if "Shutting down" in log.read_text():
                proc.terminate()
            time.sleep(0.5)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return (results / "snakemake.log").read_text() + ("" if proc.returncode == 0 else cluster.logs())


def local_run(results: Path, seed: int) -> subprocess.Popen:
    """The same training point on this host: the launcher with the same config, 4 local ranks."""
    point = train_point(seed)
    argv = [sys.executable, "-m", "experiments.launch", "--config", "configs/default.yaml", "--config"]
    argv += ["configs/ci.yaml", *SETTINGS, f"results_dir={results}", *point_overrides(point), "--nproc", "4"]
    argv += ["--", "-m", "experiments", "train_step", "--out", str(record_of(results, seed))]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(900)
def test_a_training_point_and_the_collectives_run_across_both_nodes_as_locally(cluster, tmp_path):
    results, local = tmp_path / "slurm", tmp_path / "local"
    collectives = results / "raw" / "common" / "collectives" / "all_reduce_ws4_1KiB.json"
    sweep_run = snakemake(cluster, results, 0, record_of(results, 0), collectives)
    reference = local_run(local, 0)  # beside the SLURM jobs, which mostly wait
    out = finish(sweep_run, results, cluster)
    local_out, _ = reference.communicate(timeout=SNAKEMAKE_S)
    assert sweep_run.returncode == 0, out[-8000:]
    assert reference.returncode == 0, local_out[-3000:]

    log = job_log(results, 0).read_text()
    assert "2 tasks: srun" in log and "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in log, log
    record = json.loads(record_of(results, 0).read_text())
    assert record["environment"]["hosts"] == ["node1", "node1", "node2", "node2"], record["environment"]
    expected = json.loads(record_of(local, 0).read_text())
    assert record["samples"]["loss"] == pytest.approx(expected["samples"]["loss"], **LOSS_TOLERANCE)
    assert record["metrics"]["loss_last"] == pytest.approx(expected["metrics"]["loss_last"], **LOSS_TOLERANCE)
    assert record["params"] == expected["params"] and record["backend"] == "gloo"

    made = sorted(collectives.parent.glob("*.json"))
    assert len(made) == 8, made  # each collective at 1 KiB
    for path in made:
        env = json.loads(path.read_text())["environment"]
        assert sorted(set(env["hosts"])) == ["node1", "node2"] and len(env["hosts"]) == 4, (path.name, env)


def ranks_on_lost_node(results: Path, seed: int, run: subprocess.Popen, timeout_s: float = 300) -> dict:
    """Wait until the job's training loop runs (rank 0's progress bar); rank -> process of its ranks
    on LOST_NODE."""
    log, deadline = job_log(results, seed), time.monotonic() + timeout_s
    while run.poll() is None and time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if "train_step overlap:" in text:
            ranks = job_ranks(re.search(r"SLURM job (\d+)", text).group(1))
            if len(ranks) == 4:
                return {rank: proc for rank, (node, proc) in ranks.items() if node == LOST_NODE}
        time.sleep(0.2)
    raise AssertionError(f"the job never reached its work:\n{(results / 'snakemake.log').read_text()[-6000:]}")


def job_ranks(job_id: str) -> dict[int, tuple[str, psutil.Process]]:
    """rank -> (node, process) of SLURM job ``job_id``'s ranks (every node's processes run on this host)."""
    ranks = {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("RANK", "").isdigit() and "LOCAL_RANK" in env:
            ranks[int(env["RANK"])] = (env["SLURMD_NODENAME"], proc)
    return ranks


def check_failed_job(results: Path, seed: int, out: str, fault_time: float, ranks: list[int]) -> None:
    """The job ended within timeout_s + 10 s of its fault (``fault_time``, time.time()), its last
    line naming ``ranks`` on LOST_NODE; Snakemake reported it; no record is published."""
    log = job_log(results, seed)
    text = log.read_text()
    assert log.stat().st_mtime - fault_time < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S, text[-4000:]
    last = text.strip().splitlines()[-1]
    for rank in ranks:
        assert re.search(rf"rank {rank} stopped responding: .*process \d+ runs on {LOST_NODE}\b", last), text[-4000:]
    assert "Error in rule train_step" in out and "SLURM-job" in out, out[-6000:]
    assert not list((results / "raw").rglob("*.json")) and not (results / ".staging").exists()


@pytest.mark.timeout(900)
def test_a_node_whose_ranks_are_stopped_ends_the_job_naming_them_and_their_node(cluster, tmp_path):
    run = snakemake(cluster, tmp_path, 1, record_of(tmp_path, 1), LONG_WORK)
    lost = ranks_on_lost_node(tmp_path, 1, run)
    fault_time = time.time()
    for proc in lost.values():
        proc.send_signal(signal.SIGSTOP)
    out = finish(run, tmp_path, cluster)
    assert run.returncode != 0
    check_failed_job(tmp_path, 1, out, fault_time, sorted(lost))


@pytest.mark.timeout(900)
def test_a_node_lost_mid_job_ends_the_job_naming_its_ranks_and_the_node(cluster, tmp_path):
    run = snakemake(cluster, tmp_path, 2, record_of(tmp_path, 2), LONG_WORK)
    lost = ranks_on_lost_node(tmp_path, 2, run)
    fault_time = time.time()
    cluster.kill_node(LOST_NODE)
    log = job_log(tmp_path, 2)
    deadline = time.monotonic() + TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S
    while "stopped responding" not in log.read_text().strip().splitlines()[-1] and time.monotonic() < deadline:
        time.sleep(0.2)
    # The node comes back (as after a reboot): SLURM then ends the job's remains there, and
    # Snakemake sees the job end (else only once SLURM has declared the node down, minutes later).
    cluster.revive_node(LOST_NODE)
    out = finish(run, tmp_path, cluster)
    assert run.returncode != 0
    assert "srun has not ended" in log.read_text(), log.read_text()[-4000:]
    check_failed_job(tmp_path, 2, out, fault_time, sorted(lost))


PRESET = "configs/clusters/h100-8x-nodes.yaml"
# What the preset's 1-node (8 GPUs) and 2-node (16 GPUs) points ask of SLURM (slurm_resources).
PREVIEW = {
    "ws8_e256_epr32_overlap_s0": ["--nodes=1", "--cpus-per-task=32", "--mem 64000", "--gpus=8"],
    "ws16_e256_epr16_overlap_s0": ["--nodes=2", "--ntasks=2", "--cpus-per-task=32", "--mem 64000", "--gres=gpu:8"],
}


def test_the_sbatch_lines_of_a_gpu_preset_ask_what_the_preset_needs(cluster, tmp_path):
    """The plugin's sbatch lines for configs/clusters/h100-8x-nodes.yaml, previewed without GPUs: an
    ``sbatch`` on PATH that only writes down its command line and refuses the job (the plugin asks
    the cluster for its partitions first, with sinfo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "sbatch $*" >> {calls}\necho "preview only" >&2\nexit 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    results = tmp_path / "results"
    argv = ["snakemake", "--executor", "slurm", "--profile", "configs/profiles/slurm", "--configfile", PRESET]
    argv += ["--config", f"results_dir={results}", "--slurm-no-account", "--keep-going"]
    argv += [str(results / "raw" / "gshard" / "train_step" / f"{point}.json") for point in PREVIEW]
    env = {**cluster.env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WANDB_MODE": "disabled"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=SNAKEMAKE_S)
    lines = calls.read_text().splitlines() if calls.exists() else []
    assert proc.returncode != 0 and len(lines) == len(PREVIEW), proc.stdout[-4000:] + proc.stderr[-4000:]
    for point, asks in PREVIEW.items():
        (line,) = [line for line in lines if f"/{point}/" in line or f"_{point}" in line]
        print(f"\n{point}: {line[:400]}")
        assert all(ask in line for ask in asks), (asks, line)
        assert "--ntasks-per-gpu" not in line, line
