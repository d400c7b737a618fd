"""The measured training step end to end under torchrun (how a run fails: tests/test_faults.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.seq_len=16",
    "model.n_layers=2",
    "train.batch_size=2",
    "parallel.world_size=2",
    "moe.num_experts=4",
    "moe.experts_per_rank=2",
]


def torchrun(world, args, env=None, **popen):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "experiments",
        "train_step",
        *args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}, **popen
    )


def records(results_dir: Path):
    return sorted(results_dir.glob("raw/**/*.json"))


def test_training_steps_write_a_record_and_the_loss_falls(tmp_path):
    """Also with --profile: the traced steps follow the timed ones and never enter the record."""
    profile = tmp_path / "profile"
    proc = torchrun(
        2,
        [
            *SMALL,
            f"results_dir={tmp_path}",
            "train.iters=25",
            "train.warmup_iters=2",
            "comm.policy=overlap",
            "--profile",
            str(profile),
            "--profile-steps=2",
        ],
        env={"WANDB_MODE": "offline"},
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    (path,) = records(tmp_path)
    assert path.name == "ws2_e4_epr2_overlap_s0.json"
    record = json.loads(path.read_text())
    assert record["mode"] == "measured" and record["backend"] == "gloo" and record["hardware"] == "local-cpu"
    m = record["metrics"]
    assert m["loss_last"]["value"] < 0.7 * m["loss_first"]["value"]
    assert len(record["samples"]["step_ms"]) == 25 and len(record["samples"]["loss"]) == 25
    phases = sum(m[k]["median"] for k in ("gate_ms", "dispatch_a2a_ms", "expert_ms", "combine_a2a_ms"))
    assert 0 < phases < m["step_ms"]["median"]
    assert 0 < m["a2a_share"]["median"] < 1 and m["a2a_bytes"]["value"] > 0
    # W&B mirror, offline: one run directory with its run file
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    for rank in (0, 1):
        summary = json.loads((profile / f"profile_rank{rank}.json").read_text())
        assert summary["steps"] == 2
        per_step = summary["per_step"]
        assert per_step["kernels"] == 0 and per_step["host_ops"] > 50  # a CPU run issues no device kernels
        assert per_step["step_wall_ms"] > 0 and per_step["wall_us_per_host_op"] > 0
        assert per_step["host_window_ms"] > 0 and "aten::multinomial" not in str(summary["top_host_ops"])
        assert "traceEvents" in json.loads((profile / f"trace_rank{rank}.json").read_text())


def test_lina_packing_is_decided_in_the_run_and_keeps_the_losses(tmp_path):
    """lina starts unpacked and decides its packing from its own measured times after the warm-up
    step and again 4 steps later, repacking when the factor changes; the math stays lina-pipeline's.
    (Whether this testbed packs depends on its timings; tests/test_expert_parallel.py forces an
    exchange and checks it.)"""
    losses = {}
    for policy in ("lina", "lina-pipeline"):
        proc = torchrun(
            2,
            [
                *SMALL,
                f"results_dir={tmp_path / policy}",
                "train.iters=6",
                "train.warmup_iters=1",
                f"comm.policy={policy}",
                "comm.partition_mb=0.01",
            ],
            env={"WANDB_MODE": "disabled"},
        )
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
