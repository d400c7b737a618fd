"""How a run fails (moe_core.runtime.distributed, experiments.launch, moe_core.records.results).

A killed, hung or never-started rank is named and ends the run within ``parallel.timeout_s`` plus
the stated margin; a launch that cannot work is refused before it starts; a diverged run writes no
record; an interrupted job stops with all its ranks. Faults are injected at known points with
MOE_BENCH_FAULT=SIGNAL@POINT:RANK (moe_core.runtime.distributed.inject_fault).
"""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments import launch
from moe_core.config.load import load_config
from moe_core.host.processes import BAD_LAUNCH_EXIT_CODE, started_at
from moe_core.records.results import (
    NonFiniteMetricError,
    ResultsDirError,
    check_writable,
    make_record,
    read_record,
    staged_records,
    write_record,
    write_records,
)
from moe_core.records.run_lock import ResultsDirInUse, lock_results_dir
from moe_core.runtime.distributed import FAULT_ENV, check_launch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 20  # parallel.timeout_s of the fault runs: large enough that the bound below
# (timeout_s + 20 s) stays under what a second timeout would take (2 x timeout_s + 3 s)
HUNG_MARGIN_S = 10  # the stated bound: a hung rank ends the run within timeout_s + 10 s ...
KILLED_BOUND_S = 5  # ... a killed one within a few seconds
LOAD_SLACK_S = 10  # what a loaded 2-core machine may add to either
TOKEN_ENV = "MOE_BENCH_TEST_TOKEN"  # marks the processes of one test run, to find any left behind
SMALL_STEP = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.seq_len=16",
    "model.n_layers=2",
    "train.batch_size=2",
    "parallel.world_size=2",
    "moe.num_experts=4",
    "moe.experts_per_rank=2",
]
SMALL_COLLECTIVES = [
    "collectives.world_size=2",
    "collectives.min_bytes=1024",
    "collectives.max_bytes=4096",
    "collectives.warmup_iters=1",
    "collectives.iters=2",
    "collectives.latency_iters=2",
]


@dataclass
class Run:
    returncode: int
    output: str
    after_fault_s: float | None  # from the fault injection to the exit of the whole run


def run(cmd: list[str], fault: str | None = None, timeout_s: float = 240) -> Run:
    """Run ``cmd`` in the repository with MOE_BENCH_FAULT=``fault``; fail on processes it left behind."""
    token = uuid.uuid4().hex
    env = {**os.environ, "WANDB_MODE": "disabled", TOKEN_ENV: token}
    env.pop(FAULT_ENV, None)
    env.update({FAULT_ENV: fault} if fault else {})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, fault_at = [], []

    def read():
        for line in proc.stdout:  # text mode: tqdm's '\r' ends a line too
            if not fault_at and "fault injection" in line:
                fault_at.append(time.monotonic())
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
        end = time.monotonic()
    finally:
        proc.kill()
        left = _kill_processes_marked(token)
    reader.join(timeout=10)
    out = "".join(lines)
    assert not left, f"processes left behind: {left}\n{out[-3000:]}"
    return Run(proc.returncode, out, end - fault_at[0] if fault_at else None)


def _kill_processes_marked(token: str) -> list[str]:
    """Kill the live processes whose environment carries ``token``; their command lines."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(TOKEN_ENV) == token:
                found.append(f"{p.pid} ({p.info['status']}): {' '.join(p.info['cmdline'] or [])[:200]}")
                p.kill()
        except psutil.Error:
            pass
    return found


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]


def launcher(*args: str) -> list[str]:
    """experiments.launch of two ranks, ``args`` before ``--``, then the collectives benchmark."""
    return [
        sys.executable,
        "-m",
        "experiments.launch",
        "--config",
        "configs/ci.yaml",
        *SMALL_COLLECTIVES,
        *args,
        "--nproc",
        "2",
        "--",
        "-m",
        "experiments",
        "collectives",
    ]


def records(results_dir: Path):
    return sorted(results_dir.glob("raw/**/*.json"))


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


# -- a failed rank, through torchrun ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_failed_rank_ends_the_run_naming_it_and_writes_no_record(tmp_path, fault):
    """Rank 1 dies (SIGKILL) or hangs (SIGSTOP) as the training starts, under plain torchrun."""
    done = run(
        torchrun(
            "-m",
            "experiments",
            "train_step",
            *SMALL_STEP,
            f"results_dir={tmp_path}",
            "train.iters=100000",
            f"parallel.timeout_s={TIMEOUT_S}",
        ),
        fault="SIGKILL@work:1" if fault == "killed" else "SIGSTOP@work:1",
    )
    assert done.returncode != 0 and done.after_fault_s is not None, done.output[-3000:]
    if fault == "killed":  # torchrun's first observed failure is rank 1, with its signal
        root_cause = done.output.rpartition("Root Cause (first observed failure):")[2]
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9 .*SIGKILL", root_cause), done.output[
            -3000:
        ]
        assert done.after_fault_s < KILLED_BOUND_S + LOAD_SLACK_S
    else:
        assert "rank 1 did not respond: its heartbeat stopped" in done.output, done.output[-3000:]
        assert done.after_fault_s < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S
    assert records(tmp_path) == []


# -- a failed rank, through experiments.launch --------------------------------------------------------------------


@pytest.mark.slow
def test_the_launcher_names_a_killed_rank_and_its_signal(tmp_path):
    done = run(launcher(f"results_dir={tmp_path}", f"parallel.timeout_s={TIMEOUT_S}"), fault="SIGKILL@work:1")
    assert done.returncode != 0
    assert last_line(done.output) == "error: rank 1 was killed by signal 9 (SIGKILL)", done.output[-3000:]
    assert done.after_fault_s < KILLED_BOUND_S + LOAD_SLACK_S
    assert records(tmp_path) == []


@pytest.mark.slow
def test_a_hung_rank_ends_the_launch_within_the_timeout_and_is_named(tmp_path):
    """SIGSTOP: a rank that not even torchrun's SIGTERM ends (torchrun alone would wait 30 s more)."""
    done = run(launcher(f"results_dir={tmp_path}", f"parallel.timeout_s={TIMEOUT_S}"), fault="SIGSTOP@work:1")
    assert done.returncode != 0
    assert last_line(done.output).startswith("error: rank 1 stopped responding: its heartbeat stopped: its process"), (
        done.output[-3000:]
    )
    assert "is stopped (SIGSTOP)" in last_line(done.output)
    assert done.after_fault_s < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S
    assert records(tmp_path) == []


@pytest.mark.slow
def test_a_rank_hung_during_start_up_is_named(tmp_path):
    """Before the process group exists; the others' start-up fails after parallel.timeout_s."""
    done = run(launcher(f"results_dir={tmp_path}", f"parallel.timeout_s={TIMEOUT_S}"), fault="SIGSTOP@init:1")
    assert done.returncode != 0
    assert re.search(
        r"error: rank 0 could not start: .* \| rank 1 did not respond: its heartbeat stopped", done.output
    ), done.output[-3000:]
    assert last_line(done.output).startswith("error: rank 1 stopped responding"), done.output[-3000:]
    assert done.after_fault_s < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S


@pytest.mark.slow
def test_a_rank_stopped_before_it_reaches_the_store_ends_the_launch_within_the_timeout(tmp_path):
    """No pid was published, so no rank can kill it: the launcher does, once the others have ended."""
    done = run(launcher(f"results_dir={tmp_path}", f"parallel.timeout_s={TIMEOUT_S}"), fault="SIGSTOP@start:1")
    assert done.returncode != 0
    assert last_line(done.output).startswith("error: rank 1 stopped responding: it never reached the launcher's store")
    assert re.search(r"error: rank 1 \(pid \d+\) is a stopped process \(SIGSTOP\).*the launcher killed it", done.output)
    assert done.after_fault_s < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S
    assert records(tmp_path) == []


@pytest.mark.slow
def test_a_rank_stopped_at_teardown_ends_the_launch_naming_it_and_publishes_no_record(tmp_path):
    """After the last collective, rank 0 writes the records and leaves: nobody but the launcher can
    end the stopped rank, and the run's records, complete as they are, are not published."""
    done = run(launcher(f"results_dir={tmp_path}", f"parallel.timeout_s={TIMEOUT_S}"), fault="SIGSTOP@teardown:1")
    assert done.returncode != 0
    summary = last_line(done.output)
    assert summary.startswith("error: rank 1 is a stopped process (SIGSTOP) and rank 0 has ended"), done.output[-3000:]
    assert done.after_fault_s < HUNG_MARGIN_S + LOAD_SLACK_S  # at once, not after a timeout
    assert records(tmp_path) == [] and not (tmp_path / ".staging").exists()


@pytest.mark.slow
def test_under_snakemake_a_stopped_rank_ends_each_job_within_the_timeout_and_is_named(tmp_path):
    """Three measured jobs in one Snakemake run on a two-core host, rank 1 of each stopped at work:
    each ends within timeout_s + 10 s of its fault (the worst of three is checked), Snakemake's own
    output names the rank, and no record is left. The three run at once (--cores 6: a job asks one
    core per rank), so each fault is detected while the other jobs load the host."""
    seeds = range(3)
    points = [f"ws2_e2_epr1_sequential_s{seed}" for seed in seeds]
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        *(str(tmp_path / "raw" / "gshard" / "train_step" / f"{point}.json") for point in points),
        "--cores",
        str(2 * len(points)),
        "--keep-going",
        "--configfile",
        "configs/ci.yaml",
        "--config",
        f"results_dir={tmp_path}",
        f"parallel={{timeout_s: {TIMEOUT_S}}}",
        f"sweep={{seed: {list(seeds)}, num_experts: [2], policy: [sequential]}}",
    ]
    done = run(cmd, fault="SIGSTOP@work:1", timeout_s=900)
    assert done.returncode != 0
    after_fault_s, texts = [], []
    for point in points:
        log = tmp_path / "logs" / "train_step" / "gshard" / f"{point}.log"
        texts.append(log.read_text())
        fault_time = float(re.search(r"fault injection .* time (\d+\.\d+)", texts[-1]).group(1))
        after_fault_s.append(log.stat().st_mtime - fault_time)  # its last line is the launcher's last word
    slowest = texts[after_fault_s.index(max(after_fault_s))]
    assert max(after_fault_s) < TIMEOUT_S + HUNG_MARGIN_S + LOAD_SLACK_S, (after_fault_s, slowest[-6000:])
    # each job is named once, and its log's tail names the rank (the job's own tail and the run's
    # closing one, experiments/rules/common.smk onerror, both quote it)
    assert done.output.count("error: rule train_step failed") == len(points), done.output
    assert done.output.count("error: rank 1 stopped responding: its heartbeat stopped") >= len(points), done.output
    assert records(tmp_path) == []


# -- the launcher's summary of a failed run (pure parsing) ---------------------------------------------------------


def torchrun_summary(*failures: tuple[int, int], root: tuple[int, int]) -> str:
    """The failure summary torchrun prints (torch.distributed.elastic ChildFailedError)."""

    def entry(i, rank, code):
        signame = f" ({signal.Signals(-code).name})" if code < 0 else ""
        return (
            f"[{i}]:\n  time      : 2026-01-01_00:00:00\n  host      : node\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 12{rank}){signame}\n"
            f"  error_file: <N/A>\n  traceback : -"
        )

    others = "\n".join(entry(i + 1, r, c) for i, (r, c) in enumerate(failures)) or "  <NO_OTHER_FAILURES>"
    return (
        f"====\nexperiments FAILED\n----\nFailures:\n{others}\n----\n"
        f"Root Cause (first observed failure):\n{entry(0, *root)}\n====\n"
    )


REPORT = "error: rank 0 stopped: Timed out | rank 1 did not respond: its heartbeat stopped: its process 5 {}"
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"  # torchrun's, before its summary
FAILED_WITH_1 = torchrun_summary(root=(0, 1))


@pytest.mark.parametrize(
    "outputs, summary",
    [
        ([torchrun_summary(root=(2, -9))], "rank 2 was killed by signal 9 (SIGKILL)"),
        ([torchrun_summary((0, 3), root=(1, 1))], "rank 1 exited with code 1"),
        # the dead rank and a survivor failed within one poll of torchrun's, which then blames rank 0
        (
            ["tqdm 50%\r" + REPORT.format("has exited") + "\n" + torchrun_summary((1, -9), root=(0, 3))],
            "rank 1 stopped responding: its heartbeat stopped: its process 5 has exited (found by rank 0)",
        ),
        ([torchrun_summary((0, 3), (2, -9), root=(0, 3))], "rank 2 was killed by signal 9 (SIGKILL)"),
        # a stopped rank, killed by the rank that named it: not a rank that was killed
        (
            [REPORT.format("is stopped (SIGSTOP), so rank 0 kills it") + "\n" + torchrun_summary(root=(1, -9))],
            (
                "rank 1 stopped responding: its heartbeat stopped: its process 5 is stopped (SIGSTOP), "
                "so rank 0 kills it "
                "(found by rank 0)"
            ),
        ),
        # one torchrun per node: node 1's rank 3 died
        ([torchrun_summary(root=(0, 3)), torchrun_summary(root=(3, -6))], "rank 3 was killed by signal 6 (SIGABRT)"),
        (["Traceback ... ValueError\n"], None),
        # a rank that exited with a code: the ranks' last error line, not torchrun's own exception
        (
            [f"error: cannot write record /r/a.json (No space left on device)\n{CHILD_FAILED}{FAILED_WITH_1}"],
            "rank 0 exited with code 1 (last error: cannot write record /r/a.json (No space left on device))",
        ),
        (
            [f"Traceback ...\nOSError: [Errno 28] No space left on device\n{torchrun_summary((1, -15), root=(0, 1))}"],
            "rank 0 exited with code 1 (last error: OSError: [Errno 28] No space left on device)",
        ),
        (
            ["RuntimeError: Connection closed by peer\n" + torchrun_summary(root=(2, -9))],
            "rank 2 was killed by signal 9 (SIGKILL)",
        ),
    ],
)
def test_the_launcher_names_the_rank_that_failed_first(outputs, summary):
    assert launch.failure_summary(outputs) == summary


# -- a launch that cannot work is refused before it starts --------------------------------------------------------


@pytest.fixture
def launched(monkeypatch):
    """Replace the process runner of experiments.launch; collects the commands it would run."""
    calls = []
    monkeypatch.setattr(launch, "run_all", lambda commands, grace_s: calls.append(commands) or 0)
    return calls


def launched_entry_points() -> list[str]:
    """Every entry point the workflow's rules start through experiments.launch (``-- -m experiments <name>``)."""
    rules = "\n".join(path.read_text() for path in sorted(Path("experiments/rules").glob("*.smk")))
    return sorted(set(re.findall(r"-- -m experiments (\w+)", rules)))


@pytest.mark.parametrize("entry", launched_entry_points())
def test_the_launcher_refuses_a_world_size_that_differs_from_nproc(launched, capsys, entry):
    """Every launched entry point names its world size's key, and the launcher checks --nproc against it."""
    key = launch.entry_world_size_key(["-m", "experiments", entry])
    assert key is not None, f"{entry} names no world size key (experiments.entry_points)"
    rc = launch.main(["--config", "configs/ci.yaml", f"{key}=4", "--nproc", "2", "--", "-m", "experiments", entry])
    assert rc == 2 and not launched
    assert f"error: --nproc 2 differs from {key}=4, the world size {entry} runs with" in capsys.readouterr().err


@pytest.mark.parametrize(
    "entry, error",
    [
        (["experiments", "no_such_entry"], "error: entry point 'no_such_entry' is unknown; the entry points: advise,"),
        (["experiments.train_step"], "'-m experiments.train_step' runs nothing: launch the entry point as"),
        (["experiments.no_such_module"], "error: module '-m experiments.no_such_module' cannot be found"),
    ],
)
def test_the_launcher_refuses_an_entry_point_it_cannot_run(launched, capsys, entry, error):
    rc = launch.main(["--config", "configs/ci.yaml", "--nproc", "2", "--", "-m", *entry])
    assert rc == 2 and not launched
    assert error in capsys.readouterr().err


def test_the_launcher_refuses_a_results_dir_it_cannot_write(launched, capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    rc = launch.main(
        [
            "--config",
            "configs/ci.yaml",
            f"results_dir={tmp_path}/a_file/results",
            "--nproc",
            "2",
            "--",
            "-m",
            "experiments",
            "collectives",
        ]
    )
    assert rc == 2 and not launched
    assert f"error: results_dir '{tmp_path}/a_file/results' cannot be written" in capsys.readouterr().err


@pytest.mark.parametrize(
    "environ, overrides, message",
    [
        (
            {"WORLD_SIZE": "2", "RANK": "0"},
            ["parallel.world_size=4"],
            "error: launched with WORLD_SIZE=2 ranks but the config says parallel.world_size=4",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0"},
            ["parallel.world_size=2", "moe.num_experts=2", "results_dir={tmp}/a_file/results"],
            "error: results_dir '{tmp}/a_file/results' cannot be written",
        ),
        ({"WORLD_SIZE": "2", "RANK": "1"}, ["parallel.world_size=4"], ""),  # the other ranks exit quietly
    ],
)
def test_an_entry_point_refuses_a_launch_that_cannot_work(monkeypatch, capsys, tmp_path, environ, overrides, message):
    (tmp_path / "a_file").write_text("")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(["configs/ci.yaml"], [o.format(tmp=tmp_path) for o in overrides])
    with pytest.raises(SystemExit) as exit_:
        check_launch(cfg, "parallel.world_size")
    assert exit_.value.code == BAD_LAUNCH_EXIT_CODE
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_with_the_wrong_world_size_exits_2_with_one_message_and_no_traceback(tmp_path):
    done = run(
        torchrun(
            "-m",
            "experiments",
            "collectives",
            "--config",
            "configs/ci.yaml",
            *SMALL_COLLECTIVES,
            "collectives.world_size=4",
            f"results_dir={tmp_path}",
        )
    )
    assert done.returncode != 0
    assert (
        done.output.count("error: launched with WORLD_SIZE=2 ranks but the config says collectives.world_size=4") == 1
    ), done.output[-3000:]
    assert "RuntimeError" not in done.output and re.search(r"exitcode\s*:\s*2 ", done.output)


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3)])
def test_an_entry_point_exits_with_its_code_after_its_exit_handlers_and_skips_finalisation(code, status):
    """exit_process: the atexit handlers run and the streams are flushed (W&B's service, logging, a
    last line), but nothing is freed at finalisation (where torch's C++ teardown aborted now and then)."""
    program = (
        "import atexit, sys\n"
        "from moe_core.host.processes import exit_process\n"
        "class Freed:\n"
        "    def __del__(self): print('finalised', flush=True)\n"
        "kept = Freed()\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "sys.stdout.write('unflushed line')\n"
        f"exit_process({code!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert "unflushed line" in done.stdout and "exit handler ran" in done.stdout
    assert "finalised" not in done.stdout


def test_check_writable_creates_the_directory(tmp_path):
    assert check_writable(tmp_path / "new" / "results").is_dir()
    assert list((tmp_path / "new" / "results").iterdir()) == []  # the probe file is gone
    (tmp_path / "f").write_text("")
    with pytest.raises(ResultsDirError, match=f"results_dir '{tmp_path}/f/r' cannot be written \\(Not a directory\\)"):
        check_writable(tmp_path / "f" / "r")


def test_the_launcher_refuses_a_gpu_config_on_a_host_without_gpus(launched, capsys):
    if __import__("torch").cuda.is_available():
        pytest.skip("this host has a GPU")
    rc = launch.main(
        ["--config", "configs/ci.yaml", "hardware_profile=h200-single", *SMALL_COLLECTIVES, "--nproc", "2", "--"]
        + ["-m", "experiments", "collectives"]
    )
    assert rc == 2 and not launched
    assert "hardware.device is 'cuda' but torch sees no GPU on this host" in capsys.readouterr().err


# -- a run publishes all of its records or none --------------------------------------------------------------------


def named_record(point: str, step_ms: float = 1.0) -> dict:
    return {**record_with({"step_ms": [step_ms, step_ms]}), "point": point}


def test_records_are_published_all_or_none(tmp_path):
    good = [named_record("a"), named_record("b")]
    with pytest.raises(NonFiniteMetricError):
        write_records([*good, named_record("c", math.inf)], tmp_path)
    assert records(tmp_path) == [] and not (tmp_path / ".staging").exists()
    paths = write_records(good, tmp_path)
    assert records(tmp_path) == sorted(paths) and read_record(paths[0])["point"] == "a"


def test_an_entry_point_under_a_staging_run_joins_its_stage(tmp_path):
    """The launcher stages; its ranks' records wait in its stage until the whole run succeeded."""
    with staged_records(tmp_path) as outer:
        with staged_records(tmp_path) as inner:
            assert inner is None
            path = write_record(named_record("a"), tmp_path / "raw" / "x" / "y" / "a.json")
        assert not path.exists() and len(list(outer.path.glob("*.json"))) == 1
    assert path.exists() and records(tmp_path) == [path]
    with staged_records(tmp_path) as failed:
        write_record(named_record("b"), tmp_path / "raw" / "x" / "y" / "b.json")
        failed.discard()
    assert records(tmp_path) == [path] and not (tmp_path / ".staging").exists()


def test_runs_that_stage_beside_each_other_never_lose_the_shared_staging_root(tmp_path, monkeypatch):
    """Two runs write into one results directory: when the other run publishes and removes the empty
    .staging root between this run's mkdir and its mkdtemp, this run makes the root again. A rank
    without records stages nothing (the ranks of one measured run all call write_records)."""
    assert write_records([], tmp_path) == [] and not (tmp_path / ".staging").exists()
    real_mkdtemp, removed = tempfile.mkdtemp, []

    def mkdtemp_after_the_other_run_removed_the_root(dir, prefix):
        if not removed:
            Path(dir).rmdir()
            removed.append(dir)
        return real_mkdtemp(dir=dir, prefix=prefix)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_after_the_other_run_removed_the_root)
    paths = write_records([named_record("a")], tmp_path)
    assert removed and records(tmp_path) == paths


def _process_that_ends_by_sigkill(code: str) -> subprocess.Popen:
    """A Python process that runs ``code``, says "ready" and waits to be killed."""
    script = f"{code}\nimport sys, time\nprint('ready', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def _staging_in(results_dir: Path) -> str:
    """Code that creates a stage of records in ``results_dir``, as a run's launcher does."""
    return f"from moe_core.records.results import RecordStage; stage = RecordStage({str(results_dir)!r})"


def _sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.parametrize("owner", ["none", "ended", "other results_dir"])
def test_an_inherited_staging_dir_is_refused_rather_than_swallowing_the_records(tmp_path, monkeypatch, owner):
    """MOE_BENCH_STAGING_DIR is the launcher's for its ranks; a value inherited from elsewhere (an
    exported variable, a run killed since, a run on another results_dir) would take this run's records
    into a folder that nobody publishes, and the run would end well without them."""
    stage = tmp_path / "other" / ".staging" / "1-stage"
    if owner == "ended":
        _sigkill(_process_that_ends_by_sigkill(_staging_in(tmp_path / "r")))
        (stage,) = (tmp_path / "r" / ".staging").iterdir()
    elif owner == "other results_dir":
        stage.parent.mkdir(parents=True)
        stage = Path(tempfile.mkdtemp(dir=stage.parent))
        (stage / "owner").write_text(f"{socket.gethostname()} {os.getpid()} {started_at(os.getpid())}")
    monkeypatch.setenv("MOE_BENCH_STAGING_DIR", str(stage))
    why = "is not a staging folder of results_dir" if owner == "other results_dir" else "is no staging folder of a run"
    with pytest.raises(ResultsDirError, match=f"MOE_BENCH_STAGING_DIR={stage} {why}.*unset it"):
        write_records([named_record("a")], tmp_path / "r")
    assert records(tmp_path / "r") == [] and not list(stage.glob("*.json"))


def test_the_stage_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    """A run killed with SIGKILL never publishes or removes its stage; the next run on the results
    directory removes it, and leaves alone a stage whose owner still runs or is on another host."""
    live = _process_that_ends_by_sigkill(_staging_in(tmp_path))
    killed = _process_that_ends_by_sigkill(_staging_in(tmp_path))
    _sigkill(killed)
    elsewhere = Path(tempfile.mkdtemp(dir=tmp_path / ".staging", prefix=f"{killed.pid}-"))
    (elsewhere / "owner").write_text(f"another-host {killed.pid} 1.000")
    stages = {p.name.split("-")[0]: p for p in (tmp_path / ".staging").iterdir() if p != elsewhere}
    assert set(stages) == {str(live.pid), str(killed.pid)}
    paths = write_records([named_record("a")], tmp_path)
    try:
        assert records(tmp_path) == paths
        assert sorted((tmp_path / ".staging").iterdir()) == sorted([stages[str(live.pid)], elsewhere])
    finally:
        _sigkill(live)


def test_a_second_run_on_a_results_dir_is_refused_naming_the_first_and_a_killed_ones_is_taken_over(tmp_path):
    """Two workflow runs (say, of two checkouts) on one results_dir would measure the same points at
    once; the second stops naming the first. The kernel releases the lock of a killed run."""
    first = _process_that_ends_by_sigkill(
        f"from moe_core.records.run_lock import lock_results_dir; lock_results_dir({str(tmp_path)!r})"
    )
    holder = f"the workflow run of pid {first.pid} on {socket.gethostname()}"
    try:
        with pytest.raises(ResultsDirInUse, match=rf"'{tmp_path}' is in use by {holder} .*: wait for that run to end"):
            lock_results_dir(tmp_path)
    finally:
        _sigkill(first)
    lock_results_dir(tmp_path)
    assert f"pid {os.getpid()} on" in (tmp_path / ".run.lock").read_text()


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB file system: a few records fit, a whole study does not (needs root to mount)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)]).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_leaves_no_record_and_names_the_file(full_disk):
    """12 records of about 9 KB each do not fit in 64 KiB: the study fails naming the file it could
    not write, in one line, and none of the records it did write is left."""
    done = subprocess.run(
        [sys.executable, "-m", "experiments", "dispatchers_sim", "--config", "configs/default.yaml"]
        + ["--config", "configs/ci.yaml", f"results_dir={full_disk}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert re.search(r"error: cannot write record \S+\.json \(No space left on device\)", done.stderr), done.stderr
    assert "Traceback" not in done.stderr
    assert records(full_disk) == [] and not list(full_disk.rglob("*.json"))


@pytest.mark.slow
def test_a_full_disk_under_the_launcher_names_the_file_and_leaves_no_record(full_disk):
    done = run(launcher(f"results_dir={full_disk}", "collectives.max_bytes=65536"))
    assert done.returncode != 0
    assert re.search(r"error: cannot write record \S+\.json \(No space left on device\)", done.output), done.output
    assert re.fullmatch(
        r"error: rank 0 exited with code 1 \(last error: cannot write record \S+\.json \(No space left on device\).*\)",
        last_line(done.output),
    ), done.output[-3000:]
    assert records(full_disk) == []


# -- a diverged run writes no record -------------------------------------------------------------------------------


def record_with(samples, extra=None, config=None):
    return make_record(
        paper="gshard",
        experiment="train_step",
        point="p",
        mode="measured",
        backend="gloo",
        hardware="local-cpu",
        params={},
        samples=samples,
        config=config or {},
        extra_metrics=extra,
    )


@pytest.mark.parametrize(
    "samples, extra, message",
    [
        (
            {"step_ms": [1.0, 2.0], "loss": [5.0, math.nan]},
            {},
            r"losses diverged: metric 'loss' has non-finite values \(1 of 2, the first nan at sample 1\)"
            r".*lower train.lr",
        ),
        ({"step_ms": [1.0, math.inf]}, {}, r"metric 'step_ms' has non-finite values \(1 of 2, the first inf"),
        ({"step_ms": [1.0]}, {"loss_last": math.nan}, r"losses diverged: metric 'loss_last'"),
    ],
)
def test_a_record_with_a_non_finite_metric_is_refused(samples, extra, message):
    with pytest.raises(NonFiniteMetricError, match=message):
        record_with(samples, extra)


def test_records_are_written_as_strict_json_and_nothing_non_finite_is_written(tmp_path):
    record = record_with({"step_ms": [1.0, 2.0]}, config={"train": {"lr": 1e-3}})
    path = write_record(record, tmp_path / "ok.json")
    assert read_record(path)["metrics"]["step_ms"]["median"] == 1.5
    record["config"]["train"]["lr"] = math.inf
    with pytest.raises(NonFiniteMetricError, match="record field 'config.train.lr' is inf"):
        write_record(record, tmp_path / "bad.json")
    record["config"]["train"]["lr"] = 1e-3
    record["samples"]["loss"] = [math.nan]
    with pytest.raises(NonFiniteMetricError, match=r"metric 'loss' .* \(at samples.loss.0\)"):
        write_record(record, tmp_path / "bad.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json"]  # not even a temporary file
    (tmp_path / "nan.json").write_text(json.dumps({"schema_version": 1, "x": math.nan}))
    with pytest.raises(ValueError, match="NaN is not strict JSON"):
        read_record(tmp_path / "nan.json")


@pytest.mark.slow
def test_a_diverged_training_run_fails_and_writes_no_record(tmp_path):
    done = run(
        torchrun(
            "-m",
            "experiments",
            "train_step",
            *SMALL_STEP,
            f"results_dir={tmp_path}",
            "train.iters=3",
            "train.warmup_iters=1",
            "train.lr=1e9",
        )
    )
    assert done.returncode != 0
    assert "losses diverged: metric 'loss' has non-finite values" in done.output, done.output[-3000:]
    assert records(tmp_path) == []


# -- an interrupted job --------------------------------------------------------------------------------------------

JOB = """\
import os, sys, time
from pathlib import Path
Path(os.environ["JOB_STARTED"]).touch()
time.sleep(float(os.environ["JOB_SLEEP_S"]))
Path(os.environ["JOB_OUT"]).write_text("{}")
"""
SNAKEFILE = """\
rule job:
    output: "out.json"
    log: "job.log"
    shell: "export JOB_OUT=$PWD/{{output}}; cd {root} && {python} -m experiments.launch --config configs/ci.yaml \\
results_dir={results} --nproc 1 -- {job} > $OLDPWD/{{log}} 2>&1"
"""


@pytest.mark.slow
def test_interrupting_snakemake_stops_the_job_and_the_same_command_runs_it_again(tmp_path):
    """Ctrl-C (SIGINT to Snakemake's process group): the launcher stops torchrun and its rank, the
    job writes nothing, and the next plain run (no --rerun-incomplete) runs the job again.

    (SIGINT to Snakemake's pid alone never reaches a job: Snakemake waits for it to finish and
    leaves its output marked incomplete; see experiments/launch.py.)"""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "Snakefile").write_text(
        SNAKEFILE.format(root=ROOT, python=sys.executable, job=tmp_path / "job.py", results=tmp_path / "results")
    )
    started = tmp_path / "started"
    token = uuid.uuid4().hex
    env = {**os.environ, "JOB_STARTED": str(started), "JOB_SLEEP_S": "300", TOKEN_ENV: token}
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "1", "--snakefile", str(tmp_path / "Snakefile")]
    proc = subprocess.Popen(
        snakemake,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), proc.communicate(timeout=30)[0][-3000:]
        interrupted = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert time.monotonic() - interrupted < 30
    finally:
        proc.kill()
        left = _kill_processes_marked(token)
    assert proc.returncode != 0 and not left, (left, out[-3000:])
    assert not (tmp_path / "out.json").exists()
    assert "interrupted by SIGINT" in (tmp_path / "job.log").read_text()
    rerun = subprocess.run(
        snakemake,
        check=False,
        cwd=tmp_path,
        env={**env, "JOB_SLEEP_S": "0"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (tmp_path / "out.json").exists()


@pytest.mark.parametrize("entry", ["simulate", "aurora"])
def test_simulated_entry_points_refuse_an_unwritable_results_dir_before_working(tmp_path, entry):
    (tmp_path / "a_file").write_text("")
    results = tmp_path / "a_file" / "results"
    done = subprocess.run(
        [sys.executable, "-m", "experiments", entry, "--config", "configs/ci.yaml", f"results_dir={results}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"error: results_dir '{results}' cannot be written" in done.stderr
    assert "aurora: workloads" not in done.stderr  # refused before any work
