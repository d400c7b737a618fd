"""The measured training step end to end under torchrun, and how it fails."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = ["model.d_model=32", "model.d_ff=64", "model.seq_len=16", "model.n_layers=2", "train.batch_size=2",
         "parallel.world_size=2", "moe.num_experts=4", "moe.experts_per_rank=2"]


def torchrun(world, args, env=None, **popen):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "experiments.train_step", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, **popen)


def records(results_dir: Path):
    return sorted(results_dir.glob("raw/**/*.json"))


def test_training_steps_write_a_record_and_the_loss_falls(tmp_path):
    proc = torchrun(2, [*SMALL, f"results_dir={tmp_path}", "train.iters=25", "train.warmup_iters=2",
                        "comm.policy=overlap"], env={"WANDB_MODE": "offline"})
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    (path,) = records(tmp_path)
    assert path.name == "ws2_e4_epr2_overlap_s0.json"
    record = json.loads(path.read_text())
    assert record["mode"] == "measured" and record["backend"] == "gloo" and record["hardware"] == "local-cpu"
    m = record["metrics"]
    assert m["loss_last"]["value"] < 0.7 * m["loss_first"]["value"]
    assert len(record["samples"]["step_ms"]) == 25
    phases = sum(m[k]["median"] for k in ("gate_ms", "dispatch_a2a_ms", "expert_ms", "combine_a2a_ms"))
    assert 0 < phases < m["step_ms"]["median"]
    assert 0 < m["a2a_share"]["median"] < 1 and m["a2a_bytes"]["value"] > 0
    # W&B mirror, offline: one run directory with its run file
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1


def _worker_pids(launcher_pid):
    """Worker processes of a torchrun launcher, by RANK (read from /proc/<pid>/environ)."""
    import psutil

    workers = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if "RANK" in env and "experiments.train_step" in " ".join(child.cmdline()):
            workers[int(env["RANK"])] = child.pid
    return workers


def _start_long_run(tmp_path, timeout_s):
    proc = torchrun(2, [*SMALL, f"results_dir={tmp_path}", "train.iters=100000", f"parallel.timeout_s={timeout_s}"],
                    env={"WANDB_MODE": "disabled"})
    deadline = time.time() + 120
    while time.time() < deadline:
        workers = _worker_pids(proc.pid)
        if len(workers) == 2:
            time.sleep(8)  # let the ranks get into the training loop
            return proc, workers
        time.sleep(0.5)
    proc.kill()
    pytest.fail("torchrun did not start its workers")


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_failed_rank_ends_the_run_naming_it_and_writes_no_record(tmp_path, fault):
    timeout_s = 10
    proc, workers = _start_long_run(tmp_path, timeout_s)
    start = time.time()
    os.kill(workers[1], signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    try:
        out, _ = proc.communicate(timeout=timeout_s + 60)
    finally:
        if fault == "hung":
            with contextlib.suppress(ProcessLookupError):  # torchrun usually killed it already
                os.kill(workers[1], signal.SIGKILL)
    assert proc.returncode != 0
    assert time.time() - start < timeout_s + 60
    if fault == "killed":
        assert "rank        : 1" in out or "rank: 1" in out or "Rank 1" in out, out[-3000:]
    else:
        assert "Rank 1 failed to pass monitoredBarrier" in out, out[-3000:]
    assert records(tmp_path) == []


def test_lina_packing_is_decided_in_the_run_and_keeps_the_losses(tmp_path):
    """lina starts unpacked and decides its packing from its own measured times after the warm-up
    step and again 4 steps later, repacking when the factor changes; the math stays lina-pipeline's.
    (Whether this testbed packs depends on its timings; tests/test_expert_parallel.py forces an
    exchange and checks it.)"""
    losses = {}
    for policy in ("lina", "lina-pipeline"):
        proc = torchrun(2, [*SMALL, f"results_dir={tmp_path / policy}", "train.iters=6", "train.warmup_iters=1",
                            f"comm.policy={policy}", "comm.partition_mb=0.01"], env={"WANDB_MODE": "disabled"})
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
        (path,) = records(tmp_path / policy)
        record = json.loads(path.read_text())
        losses[policy] = record["samples"]["loss"]
        metrics = record["metrics"]
        factor, repacks, exchange_ms = (metrics[k]["value"] for k in ("packing_factor", "repacks", "exchange_ms"))
        if policy == "lina":
            assert factor in (1, 2)  # expert parallel 2: unpacked, or every expert local
            assert repacks >= (factor != 1) and (repacks > 0) == (exchange_ms > 0)
            assert len(record["samples"]["step_ms"]) == 6  # no iteration dropped for a decision
            assert record["params"]["experts_per_rank"] == 2  # the point is the configured layout
        else:
            assert (factor, repacks, exchange_ms) == (1, 0, 0)
    assert losses["lina"] == pytest.approx(losses["lina-pipeline"], rel=1e-5)
