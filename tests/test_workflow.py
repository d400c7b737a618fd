"""The Snakemake workflow: lint, the planned jobs of the default sweep, and bad configuration."""

import os
import subprocess
from pathlib import Path

import pytest

from experiments.collectives import collective_points
from moe_core.config import load_config
from moe_core.papers.lina.sweeps import lina_measured_points
from moe_core.papers.monta.sweeps import monta_measured_points
from moe_core.points import point_name, sim_points, sweep_points


def snakemake(*args, timeout=300):
    return subprocess.run(["snakemake", *args], capture_output=True, text=True, timeout=timeout)


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dry_run_plans_one_job_per_sweep_point_and_every_figure(tmp_path):
    proc = snakemake("--cores", "2", "-n", "--quiet", "rules", "--config", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    cfg = load_config(["configs/default.yaml"])
    points, _ = sweep_points(cfg)
    out = proc.stdout + proc.stderr
    job_lines = [line.split() for line in out.splitlines()]
    counts = {words[0]: words[1] for words in job_lines if len(words) == 2 and words[1].isdigit()}
    assert len(points) == 12 and len(lina_measured_points(cfg)) == 2 and len(monta_measured_points(cfg)) == 3
    assert int(counts["train_step"]) == len(points) + len(lina_measured_points(cfg)) + len(monta_measured_points(cfg))
    # 24: Lina's 4 x 6 points again at the other end of its unstated intra-node link; MoNTA's 29 and
    # its 3 tp-8 dispatches again at the other end of its unstated NIC count
    assert int(counts["sim_train_step"]) == 1 and len(sim_points(cfg)) == 45 + 29 + 3 + 24
    assert int(counts["lina_inference"]) == 1
    assert int(counts["monta_a2a"]) == int(counts["monta_model"]) == int(counts["monta_strategy_table"]) == 1
    assert int(counts["dispatchers"]) == int(counts["dispatchers_simulated"]) == int(counts["dispatcher_table"]) == 1
    assert int(counts["figure_dispatchers_under_skew"]) == 1
    assert int(counts["collectives"]) == 1
    assert all(
        int(counts[f"figure_{name}"]) == 1
        for name in (
            "step_breakdown",
            "a2a_share_vs_experts",
            "a2a_slowdown_cdf",
            "busbw_vs_size",
            "lina_step_speedup",
            "lina_moe_speedup",
            "lina_partition_sweep",
            "lina_inference",
        )
    )
    assert int(counts["aurora_simulated"]) == int(counts["aurora_a2a"]) == 1
    assert all(
        int(counts[f"figure_aurora_{name}"]) == 1
        for name in ("order_speedup", "gpu_utilisation", "gap_to_optimum", "imprecision", "ordered_vs_library")
    )
    assert all(
        int(counts[f"figure_monta_{name}"]) == 1
        for name in ("a2a_vs_tp", "chunks", "iteration_breakdown", "strategy_ranking", "hierarchical")
    )
    assert point_name(points[0]) == "ws2_e4_epr2_sequential_s0"


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


def test_a_changed_config_re_measures_even_without_snakemake_metadata(tmp_path):
    """A config change must rerun the measurements that read it, also where Snakemake kept no
    metadata (a copied or cleaned results directory, as here: no job ever ran): else the run
    silently reuses old records."""
    base = ["--cores", "1", "--config", f"results_dir={tmp_path}"]
    assert snakemake(*base, "-n", "--quiet").returncode == 0
    resolved = tmp_path / "config" / "resolved.yaml"
    os.utime(resolved, (resolved.stat().st_mtime - 100,) * 2)
    # Stand-ins for the collectives records, newer than the resolved config they were measured with.
    cfg = load_config(["configs/default.yaml"], [f"results_dir={tmp_path}"])
    records = [tmp_path / "raw" / "common" / "collectives" / f"{name}.json" for name in collective_points(cfg)]
    records[0].parent.mkdir(parents=True)
    for record in records:
        record.write_text("{}")
    target = str(records[0])
    unchanged = snakemake(*base, "-n", target)
    assert unchanged.returncode == 0 and "Nothing to be done" in unchanged.stdout + unchanged.stderr
    changed = snakemake(*base, "collectives={iters: 11}", "-n", target)
    assert changed.returncode == 0, changed.stderr
    assert "rule collectives:" in changed.stdout + changed.stderr
    assert "iters: 11" in resolved.read_text()


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
    command = next(line for line in proc.stdout.splitlines() if "experiments.train_step" in line)
    assert f"--out '{target}'" in command and f"--config '{results}/config/resolved.yaml'" in command
    assert not Path("PWNED").exists() and not (tmp_path / "PWNED").exists()
