"""SLURM sizing and launch decisions of experiments.launch (pure logic; tests/test_slurm.py runs them for real)."""

import pytest

from experiments import launch
from experiments.launch import SlurmJob, job_layout, slurm_agents, slurm_command, slurm_resources
from moe_core.config.load import ConfigError, load_config

ENTRY = ["-m", "experiments", "train_step", "--config", "c.yaml", "--out", "x.json"]


def cfg(*overrides):
    return load_config(["configs/default.yaml"], list(overrides))


def test_cpu_job_on_one_node_asks_one_task_with_a_core_per_rank():
    assert slurm_resources(cfg(), 4) == {"nodes": 1, "tasks": 1, "cpus_per_task": 4, "mem_mb": 6000, "runtime": 30}


def test_gpu_job_on_one_node_asks_gpus_without_tasks_per_gpu():
    res = slurm_resources(cfg("hardware_profile=h200-ndr-cluster"), 4)
    assert res["nodes"] == res["tasks"] == 1 and res["gpu"] == 4 and res["tasks_per_gpu"] == 0
    assert "mpi" not in res and "gres" not in res


def test_the_plan_counts_jobs_gpus_and_gpu_hours_at_most():
    """rule plan's text: one-node jobs of 4, 4 and 8 GPUs and a 4-node job of 32, 30 minutes each, are
    (4 + 4 + 8 + 32) x 0.5 = 24 GPU-hours at most; a CPU job asks no GPUs."""
    gpu = cfg("hardware_profile=h200-ndr-cluster")
    text = launch.plan_text(
        {
            "train_step": [slurm_resources(gpu, 4)] * 2 + [slurm_resources(gpu, 32)],
            "collectives": [slurm_resources(gpu, 8)],
        }
    )
    assert "Measured jobs of this config: 4" in text
    assert "train_step         3 jobs  1-4 nodes, 4-32 GPUs each" in text
    assert "collectives        1 job   1 node, 8 GPUs each" in text
    assert "GPU-hours at most: 24.0" in text
    assert "GPUs" not in launch.plan_text({"train_step": [slurm_resources(cfg(), 4)]}).splitlines()[1]


def test_gpu_job_across_nodes_asks_one_task_and_all_gpus_per_node_and_launches_its_own_step():
    res = slurm_resources(cfg("hardware_profile=h200-ndr-cluster"), 32)
    assert res == {
        "nodes": 4,
        "tasks": 4,
        "cpus_per_task": 32,
        "mem_mb": 64000,
        "runtime": 30,
        "mpi": "srun",
        "tasks_per_gpu": 0,
        "gres": "gpu:8",
    }


def test_a_world_size_that_does_not_fill_whole_nodes_is_rejected_by_name():
    with pytest.raises(ConfigError, match="multiple of 8"):
        job_layout(cfg("hardware_profile=h200-ndr-cluster").hardware, 12)


def test_an_emulated_testbed_is_one_host():
    assert job_layout(cfg("hardware_profile=emulated-2x2").hardware, 4) == (1, 4)


@pytest.mark.parametrize("counts,tasks,cpus", [("NumTasks=2 CPUs/Task=8", 2, 8), ("NumTasks=N/A CPUs/Task=N/A", 3, 1)])
def test_job_geometry_comes_from_scontrol(monkeypatch, counts, tasks, cpus):
    answers = {
        ("show", "job", "--oneliner", "77"): f"JobId=77 JobName=a b NumNodes=3 NumCPUs=24 {counts} "
        f"ReqB:S:C:T=0:0:*:* NodeList=gpu[07-09] BatchHost=gpu07\n",
        ("show", "hostnames", "gpu[07-09]"): "gpu07\ngpu08\ngpu09\n",
    }
    monkeypatch.setattr(launch, "_scontrol", lambda *args: answers[args])
    assert SlurmJob.query("77") == SlurmJob(
        "77", nodes=3, tasks=tasks, cpus_per_task=cpus, hosts=("gpu07", "gpu08", "gpu09")
    )


JOB = SlurmJob(job_id="4321", nodes=2, tasks=2, cpus_per_task=32, hosts=("gpu-a", "gpu-b"))


@pytest.mark.parametrize(
    "job,in_step,agents",
    [
        (None, False, 0),  # not under SLURM
        (SlurmJob("7", 1, 1, 4, ("n",)), False, 0),  # one-task batch script
        (SlurmJob("7", 1, 1, 4, ("n",)), True, 0),  # the plugin's `srun -n1` step
        (JOB, False, 2),  # multi-node batch script
    ],
)
def test_agents_one_per_task_only_from_a_multi_task_batch_script(job, in_step, agents):
    assert slurm_agents(job, in_step) == agents


def test_no_nested_srun_inside_a_step_of_a_multi_node_job():
    with pytest.raises(ConfigError, match="mpi='srun'"):
        slurm_agents(JOB, in_step=True)


def test_srun_starts_one_torchrun_per_task_with_c10d_on_the_first_node():
    argv, env = slurm_command(16, 2, JOB, ENTRY, {"OMP_NUM_THREADS": "64"})
    assert argv[:4] == ["srun", "--kill-on-bad-exit=1", "--ntasks=2", "--cpus-per-task=32"]
    assert {
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-id=4321",
        f"--rdzv-endpoint=gpu-a:{20000 + 4321}",
    } <= set(argv)
    assert argv[-len(ENTRY) :] == ENTRY and env["OMP_NUM_THREADS"] == "4"


def test_ranks_that_do_not_split_over_the_tasks_are_rejected():
    with pytest.raises(ConfigError, match="cannot be split evenly"):
        slurm_command(3, 2, JOB, ENTRY, {})


@pytest.fixture
def launched(monkeypatch):
    """The launcher inside SLURM job JOB's batch script, with the process runner replaced."""
    calls = []
    monkeypatch.setattr(launch, "run_all", lambda commands, grace_s: calls.append(commands) or 0)
    monkeypatch.setattr(SlurmJob, "query", classmethod(lambda cls, job_id: JOB))
    monkeypatch.setenv("SLURM_JOB_ID", JOB.job_id)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    return calls


def test_launcher_in_a_multi_node_batch_script_runs_srun_with_forwarded_config(launched):
    rc = launch.main(
        [
            "--config",
            "configs/default.yaml",
            "comm.policy=overlap",
            "--nproc",
            "4",
            "--",
            "-m",
            "experiments",
            "train_step",
            "--out",
            "x.json",
        ]
    )
    assert rc == 0
    ((argv, _env),) = launched[0]
    assert argv[0] == "srun" and "--nproc-per-node=2" in argv
    assert argv[-8:] == [
        "-m",
        "experiments",
        "train_step",
        "--config",
        "configs/default.yaml",
        "--out",
        "x.json",
        "comm.policy=overlap",
    ]


def test_launcher_refuses_an_emulated_testbed_across_slurm_tasks(launched, capsys):
    rc = launch.main(
        [
            "--config",
            "configs/default.yaml",
            "hardware_profile=emulated-2x2",
            "--nproc",
            "4",
            "--",
            "-m",
            "experiments",
            "train_step",
        ]
    )
    assert rc == 2 and not launched and "one-task job" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--config", "configs/default.yaml", "--help"]])
def test_help_prints_and_exits_0_without_a_command_to_launch(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        launch.parse_args(argv)
    assert exit_.value.code == 0 and "--nproc" in capsys.readouterr().out


def test_a_missing_command_is_refused_saying_what_to_add(capsys):
    with pytest.raises(SystemExit) as exit_:
        launch.parse_args(["--nproc", "2"])
    assert exit_.value.code == 2 and "missing `-- -m experiments <entry point> [args]`" in capsys.readouterr().err


def fake_srun(then: str) -> tuple[list[str], dict[str, str]]:
    """A command that reports a failed task as srun does, then runs ``then`` (shell)."""
    script = f"echo 'srun: error: node1: task 0: Exited with exit code 3' >&2; {then}"
    return ["sh", "-c", script], {}


def test_an_srun_stuck_after_a_failed_task_is_killed(monkeypatch, capsys):
    """A lost node keeps srun waiting for SLURM to declare it down (minutes): the launcher kills it."""
    monkeypatch.setattr(launch, "SRUN_EXIT_S", 0.5)
    start = launch.time.monotonic()
    code = launch.run_all([fake_srun("exec sleep 600")], grace_s=600)
    assert code == 128 + 9 and launch.time.monotonic() - start < 30
    assert "srun has not ended 0.5 s after `srun: error: node1: task 0: Exited with exit code 3`" in (
        capsys.readouterr().err
    )


def test_an_srun_that_ends_after_a_failed_task_keeps_its_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(launch, "SRUN_EXIT_S", 5)
    assert launch.run_all([fake_srun("sleep 1; exit 3")], grace_s=600) == 3
    assert "srun has not ended" not in capsys.readouterr().err
