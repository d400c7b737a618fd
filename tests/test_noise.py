"""Host noise: the noise block of measured records, the one "noisy" rule, and what calibration and
validation do with noisy records (keep the last good profile, warn, say so in the table)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from matplotlib.figure import Figure
from omegaconf import OmegaConf

import analysis.papers  # noqa: F401  (registers the figures)
from analysis.registry import FIGURE_REGISTRY
from experiments import calibrate as calibration
from experiments.__main__ import main as run_entry_point
from moe_core.host.noise import (
    MIN_WINDOW_S,
    NOISY_CONTENTION,
    NOISY_CV,
    HostSample,
    NoiseWindow,
    contention,
    is_noisy,
    noise_summary,
    sample_host,
)
from moe_core.records.results import make_record, read_record
from moe_core.sim.calibrate import calibration_split

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.d_ff=64", "model.seq_len=16", "model.n_layers=2", "train.batch_size=2"]
COLLECTIVES = [
    "collectives.world_size=2",
    "collectives.min_bytes=1024",
    "collectives.max_bytes=16384",
    "collectives.iters=3",
    "collectives.warmup_iters=1",
    "collectives.latency_bytes=4096",
    "collectives.latency_iters=3",
]
QUIET = {"load_avg": [0.1, 0.1, 0.1], "cpus": 2, "contention": 0.02, "cv": {"step_ms": 0.05}}
NOISY = {"load_avg": [9.0, 8.0, 7.0], "cpus": 2, "contention": 0.6, "cv": {"step_ms": 0.4}}


def _torchrun(entry: str, overrides: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "experiments",
        entry,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run([*cmd, *overrides], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[Path]:
    """Real records of a 2-rank run: collectives (alone and paired) and one training step."""
    results = tmp_path_factory.mktemp("measured")
    _torchrun("collectives", [*COLLECTIVES, f"results_dir={results}"])
    steps = ["parallel.world_size=2", "moe.num_experts=2", "train.iters=4", "train.warmup_iters=1"]
    _torchrun("train_step", [*TINY, *steps, f"results_dir={results}"])
    return sorted(results.glob("raw/**/*.json"))


def _with_noise(paths: list[Path], noise: dict, out: Path) -> list[str]:
    """Copies of the real records ``paths`` whose noise block is replaced by ``noise``."""
    copies = []
    for path in paths:
        record = read_record(path)
        record["noise"] = noise
        copy = out / path.relative_to(path.parents[2])
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(json.dumps(record))
        copies.append(str(copy))
    return copies


# ---- the noise block ---------------------------------------------------------------------------


@pytest.mark.slow
def test_measured_records_carry_the_noise_they_were_taken_under(measured):
    for path in measured:
        record = read_record(path)
        noise = record["noise"]
        assert set(noise) == {"load_avg", "cpus", "contention", "cv"}
        assert len(noise["load_avg"]) == 3 and all(v >= 0 for v in noise["load_avg"])
        assert noise["cpus"] == os.cpu_count()
        assert 0 <= noise["contention"] <= 1  # /proc is readable here, and the window was timed
        for name, values in record["samples"].items():
            x = np.asarray(values)
            if x.mean() != 0:
                assert noise["cv"][name] == pytest.approx(x.std() / abs(x.mean()))
    assert {read_record(p)["experiment"] for p in measured} == {"collectives", "train_step"}


def test_simulated_records_carry_no_noise():
    record = make_record(
        paper="gshard",
        experiment="e",
        point="p",
        mode="simulated",
        backend="sim",
        hardware="h",
        params={},
        samples={},
        config={},
        extra_metrics={"step_ms": 1.0},
    )
    assert "noise" not in record


def test_a_window_counts_the_hosts_busy_time_and_this_jobs_own():
    me = psutil.Process()
    start, own_start = sample_host(), me.cpu_times().user
    x = 0
    while me.cpu_times().user < own_start + 0.3:  # 0.3 s of this process's CPU
        x += 1
    end = sample_host()
    job_s = end.job_cpu_s - start.job_cpu_s
    assert job_s >= 0.3
    assert end.host_busy_s - start.host_busy_s >= job_s - 0.05  # the host's busy time includes the job's


def test_other_processes_count_as_contention_and_the_jobs_own_do_not():
    """A busy process outside this job's tree (detached) shows up as contention at least by its CPU time."""
    spawn = "python -c 'while 1: pass' >/dev/null 2>&1 & echo $!"
    hog_pid = int(subprocess.run(["sh", "-c", spawn], capture_output=True, text=True, check=True).stdout)
    try:
        hog = psutil.Process(hog_pid)
        assert hog_pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        window = NoiseWindow()
        hog_start = sum(hog.cpu_times()[:2])
        window.open()
        while sum(hog.cpu_times()[:2]) < hog_start + 0.3:  # until the hog used 0.3 s of CPU
            psutil.Process().cpu_times()
        hog_s = sum(hog.cpu_times()[:2]) - hog_start
        window.close()
        noise = window.noise({"t_ms": [1.0, 2.0]})
        others_s = noise["contention"] * (window.end.wall_s - window.start().wall_s) * noise["cpus"]
        assert others_s >= hog_s - 0.05
    finally:
        os.kill(hog_pid, signal.SIGKILL)


def test_contention_is_the_share_others_used_of_the_hosts_capacity():
    start = HostSample(wall_s=10.0, host_busy_s=100.0, job_cpu_s=5.0)
    end = HostSample(wall_s=12.0, host_busy_s=103.0, job_cpu_s=7.0)  # 2 s wall, 3 s busy, 2 s of them the job's
    assert contention(start, end, cpus=2) == pytest.approx(0.25)
    assert contention(start, HostSample(12.0, 102.0, 8.0), cpus=2) == 0  # never negative (tick rounding)
    assert contention(None, end, cpus=2) is None and contention(end, start, cpus=2) is None


def test_a_short_window_is_widened_back_to_a_reading_long_enough_before_its_end():
    window = NoiseWindow()
    window.readings = [HostSample(0.0, 0.0, 0.0), HostSample(5.0, 1.0, 0.0), HostSample(9.9, 2.0, 0.0)]
    window.end = HostSample(10.0, 3.0, 0.0)
    assert window.start() == window.readings[1]  # the latest at least MIN_WINDOW_S before the end
    window.end = HostSample(10.0 - 9.9 + MIN_WINDOW_S / 2, 3.0, 0.0)  # nothing old enough: the earliest
    assert window.start() == window.readings[0]


def test_an_unclosed_or_unopened_window_has_no_contention():
    window = NoiseWindow()
    assert window.noise({})["contention"] is None
    window.open()
    assert window.noise({})["contention"] is None
    window.close()
    assert window.noise({})["contention"] is not None


# ---- the noisy rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "noise, noisy",
    [
        (QUIET, False),
        (NOISY, True),
        ({**QUIET, "contention": NOISY_CONTENTION}, False),
        ({**QUIET, "contention": NOISY_CONTENTION + 0.01}, True),
        ({**QUIET, "contention": None, "cv": {"gate_ms": 0.1, "step_ms": NOISY_CV + 0.01}}, True),
        ({**QUIET, "contention": None, "cv": {"gate_ms": NOISY_CV + 1, "step_ms": NOISY_CV}}, False),  # phases vary
        ({**QUIET, "contention": None, "cv": {"time_ms": NOISY_CV + 0.1, "busbw_GBps": 0.0}}, True),
        ({**QUIET, "contention": 0.0, "cv": {"step_ms": 5.0}}, False),  # a reading outranks the spread
        ({**QUIET, "contention": None, "cv": {"loss": 1.0}}, False),  # no per-iteration time: unknown
        (None, False),
    ],
)
def test_is_noisy(noise, noisy):
    assert is_noisy(noise) is noisy


def test_noise_summary_counts_the_noisy_measured_records():
    records = [{"mode": "measured", "noise": n} for n in (QUIET, NOISY, {**NOISY, "contention": 0.4})]
    summary = noise_summary([*records, {"mode": "simulated"}])
    assert summary == {
        "records": 3,
        "noisy_records": 2,
        "noisy_share": pytest.approx(2 / 3),
        "noisy_contention_median": pytest.approx(0.5),
        "noisy_contention_max": 0.6,
    }


# ---- calibration keeps the last good profile ---------------------------------------------------


def _calibrate(records: list[str], out: Path, *configs: str) -> int:
    return run_entry_point(
        ["calibrate", "--config", str(REPO_ROOT / "configs/ci.yaml"), *configs, "--out", str(out), *records]
    )


@pytest.mark.slow
def test_calibration_keeps_the_last_good_profile_over_a_noisy_fit(measured, tmp_path, capsys):
    out = tmp_path / "calibration" / "local-cpu-calibrated.yaml"
    last_good, noisy_fit = calibration.last_good_path(out), calibration.noisy_fit_path(out)
    assert _calibrate(_with_noise(measured, QUIET, tmp_path / "quiet"), out) == 0
    good = OmegaConf.load(out)
    assert good.calibration_noise.noisy_records == 0 and last_good.read_text() == out.read_text()

    assert _calibrate(_with_noise(measured, NOISY, tmp_path / "noisy"), out) == 0
    err = capsys.readouterr().err
    used = len(calibration_split([read_record(p) for p in measured])[0])
    assert f"{used} of {used} calibration records were measured on a noisy host" in err
    assert "60% of the host's CPU" in err
    assert OmegaConf.load(out) == good and out.read_text().endswith(last_good.read_text())
    assert OmegaConf.load(noisy_fit).calibration_noise.noisy_share == 1.0
    assert OmegaConf.load(last_good) == good  # a noisy fit never becomes the last good one


@pytest.mark.slow
def test_accept_noisy_writes_the_noisy_fit(measured, tmp_path):
    out = tmp_path / "calibration" / "local-cpu-calibrated.yaml"
    assert _calibrate(_with_noise(measured, QUIET, tmp_path / "quiet"), out) == 0
    accept = tmp_path / "accept.yaml"
    accept.write_text("calibration: {accept_noisy: true}\n")
    assert _calibrate(_with_noise(measured, NOISY, tmp_path / "noisy"), out, "--config", str(accept)) == 0
    assert OmegaConf.load(out).calibration_noise.noisy_share == 1.0
    assert OmegaConf.load(calibration.last_good_path(out)).calibration_noise.noisy_records == 0


@pytest.mark.slow
def test_without_a_good_profile_the_noisy_fit_is_written_flagged_and_validation_says_so(measured, tmp_path, capsys):
    out = tmp_path / "calibration" / "local-cpu-calibrated.yaml"
    noisy = _with_noise(measured, NOISY, tmp_path / "noisy")
    assert _calibrate(noisy, out) == 0
    assert "no good profile" in capsys.readouterr().err
    profile = OmegaConf.load(out)
    assert profile.calibration_noise.noisy_share == 1.0 and "from a noisy host" in profile.description
    assert not calibration.last_good_path(out).exists()

    table = tmp_path / "sim_validation.csv"
    assert run_entry_point(["validate", "--calibrated", str(out), "--out", str(table), *noisy]) == 0
    err = capsys.readouterr().err
    assert "held-out records were measured on a noisy host" in err and "fitted on records from a noisy host" in err
    rows = pd.read_csv(table)
    assert rows["noisy"].all() and rows["profile_noisy"].all() and (rows["contention"] == 0.6).all()
    fig = Figure()
    FIGURE_REGISTRY["sim_validation"].draw(rows, fig)
    title = fig.axes[0].get_title()
    assert f"noisy host: {len(rows)} of {len(rows)} held-out points" in title and "profile was fitted" in title


@pytest.mark.slow
def test_quiet_validation_has_no_noise_warning_or_note(measured, tmp_path, capsys):
    out = tmp_path / "calibration" / "local-cpu-calibrated.yaml"
    quiet = _with_noise(measured, QUIET, tmp_path / "quiet")
    assert _calibrate(quiet, out) == 0
    table = tmp_path / "sim_validation.csv"
    assert run_entry_point(["validate", "--calibrated", str(out), "--out", str(table), *quiet]) == 0
    assert "noisy" not in capsys.readouterr().err
    rows = pd.read_csv(table)
    assert not rows["noisy"].any() and not rows["profile_noisy"].any()
    fig = Figure()
    FIGURE_REGISTRY["sim_validation"].draw(rows, fig)
    assert "noisy" not in fig.axes[0].get_title()
