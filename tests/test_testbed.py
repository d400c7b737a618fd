"""The emulated multi-node testbed (moe_core.host.testbed) and the launcher of measured jobs (experiments.launch)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments import launch
from moe_core.host import testbed as tb
from moe_core.host.testbed import EmulatedTestbed, emulation_unavailable

UNAVAILABLE = emulation_unavailable()
needs_testbed = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"emulated testbed unavailable: {UNAVAILABLE}")

# One rank of a 2-rank gloo job: times an all_to_all_single of A2A_BYTES per rank, prints seconds (JSON).
A2A_BYTES = 8 * 2**20
A2A_RANK = f"""
import json, os, statistics, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://{{os.environ['MASTER']}}:29500",
                        rank=int(os.environ["RANK"]), world_size=2)
send = torch.ones({A2A_BYTES} // 4)
recv = torch.empty_like(send)
dist.all_to_all_single(recv, send)  # warm-up: opens the connections
seconds = []
for _ in range(3):
    dist.barrier()
    start = time.perf_counter()
    dist.all_to_all_single(recv, send)
    seconds.append(time.perf_counter() - start)
print(json.dumps(statistics.median(seconds)))
dist.destroy_process_group()
"""

TINY = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.seq_len=16",
    "model.n_layers=2",
    "train.batch_size=2",
    "train.iters=3",
    "train.warmup_iters=1",
    "moe.num_experts=4",
    "moe.experts_per_rank=1",
    "parallel.world_size=4",
]


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def ours(prefix: str) -> set[str]:
    return {name for name in namespaces() if name.startswith(prefix + "-")}


# -- availability -------------------------------------------------------------------------------------------


def test_unavailable_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in emulation_unavailable() and "1000" in emulation_unavailable()


def test_unavailable_without_tc(monkeypatch):
    monkeypatch.setattr(tb.shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "`tc` not found" in emulation_unavailable()


def test_failing_command_is_named_with_its_stderr():
    with pytest.raises(tb.TestbedError, match=r"`ip netns del mt-no-such-ns` failed \(exit \d+\): .+"):
        tb._run("ip", "netns", "del", "mt-no-such-ns")


# -- launcher (commands only; the processes are not started) ---------------------------------------------------


@pytest.fixture
def launched(monkeypatch):
    """Replace the process runner of experiments.launch; collects the commands it would run."""
    calls = []
    monkeypatch.setattr(launch, "run_all", lambda commands, grace_s: calls.append(commands) or 0)
    return calls


def test_launcher_without_emulation_runs_standalone_torchrun_with_forwarded_config(launched):
    rc = launch.main(
        [
            "--config",
            "configs/default.yaml",
            "comm.policy=overlap",
            "parallel.world_size=2",
            "moe.num_experts=2",
            "--nproc",
            "2",
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
    assert argv == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "experiments",
        "train_step",
        "--config",
        "configs/default.yaml",
        "--out",
        "x.json",
        "comm.policy=overlap",
        "parallel.world_size=2",
        "moe.num_experts=2",
    ]


def test_launcher_falls_back_to_loopback_and_says_so(launched, monkeypatch, capsys):
    monkeypatch.setattr(launch, "emulation_unavailable", lambda: "needs root")
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
    assert rc == 0
    ((argv, _env),) = launched[0]
    assert "--standalone" in argv and "--nproc-per-node=4" in argv
    assert argv[-2:] == ["hardware.emulation.enabled=false", "hardware.name=emulated-2x2-loopback-fallback"]
    err = capsys.readouterr().err
    assert (
        "emulated testbed unavailable (needs root); falling back to plain loopback: "
        "inter-node links are NOT rate-limited"
    ) in err


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "configs/default.yaml", "hardware_profile=emulated-2x2", "--nproc", "2"],  # 2 != 2 nodes x 2
        ["--config", "configs/default.yaml", "moe.num_experts=x", "--nproc", "2"],  # bad config
        ["--config", "configs/no-such.yaml", "--nproc", "2"],
    ],
)
def test_launcher_rejects_bad_input_with_exit_code_2(launched, args, capsys):
    assert launch.main([*args, "--", "-m", "experiments", "train_step"]) == 2
    assert not launched and "error:" in capsys.readouterr().err


def test_run_all_returns_the_failure_and_stops_the_rest_after_the_grace():
    start = time.monotonic()
    rc = launch.run_all(
        [
            ([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ)),
            ([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)),
        ],
        grace_s=1.0,
    )
    assert rc == 3 and time.monotonic() - start < 20


# -- the testbed itself ---------------------------------------------------------------------------------------


@needs_testbed
@pytest.mark.slow
def test_inter_node_all_to_all_is_rate_limited_and_nothing_is_left(tmp_path):
    rate_mbit = 200
    links_before = host_links()
    with EmulatedTestbed(nodes=2, rate_mbit=rate_mbit) as testbed:
        assert {testbed.netns(0), testbed.netns(1), testbed.switch} <= namespaces()
        assert host_links() == links_before  # nothing in the host's namespace
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "MASTER": testbed.address(0), "OMP_NUM_THREADS": "1"}
        ranks = [
            subprocess.Popen(
                ["ip", "netns", "exec", testbed.netns(r), sys.executable, "-c", A2A_RANK],
                env={**env, "RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        outputs = [p.communicate(timeout=60) for p in ranks]
        assert all(p.returncode == 0 for p in ranks), outputs
    seconds = json.loads(outputs[0][0])
    # Half of each rank's buffer goes to the other node; both directions run at once, each on its own links.
    bound_s = (A2A_BYTES / 2) * 8 / (rate_mbit * 1e6)
    print(
        f"all_to_all_single {A2A_BYTES / 2**20:.0f} MiB/rank over {rate_mbit} Mbit/s: {seconds * 1e3:.0f} ms, "
        f"shaping bound {bound_s * 1e3:.0f} ms"
    )
    assert 0.7 * bound_s <= seconds <= 3 * bound_s + 0.1
    assert not ours(testbed.prefix)
    assert host_links() == links_before


def test_rates_are_one_for_all_nodes_or_one_per_node():
    with pytest.raises(ValueError, match="one per node"):
        EmulatedTestbed(nodes=3, rate_mbit=[100, 50])
    with pytest.raises(ValueError, match="must be > 0"):
        EmulatedTestbed(nodes=2, rate_mbit=[100, 0])


@needs_testbed
def test_each_node_link_is_shaped_to_its_own_rate():
    with EmulatedTestbed(nodes=2, rate_mbit=[100, 50]) as testbed:
        for node, rate in enumerate(("100Mbit", "50Mbit")):
            shown = [
                subprocess.run(
                    ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev], capture_output=True, text=True
                ).stdout
                for ns, dev in ((testbed.netns(node), "eth0"), (testbed.switch, f"v{node}"))
            ]
            assert all(f"rate {rate}" in out for out in shown), shown


def test_link_sharing_rejects_bad_input_with_exit_code_2(capsys):
    from experiments.__main__ import main as run_entry_point

    with pytest.raises(SystemExit) as exit_info:
        run_entry_point(["link_sharing", "--out", "x.json", "--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats" in capsys.readouterr().err


def test_link_sharing_rules_differ_where_the_measurement_decides():
    """The two rules of experiments/link_sharing.py on its setting (A's link at half B's): byte-fair
    sharing ends both flows together at A's stand-alone time; own-speed fractions end B at 3/4 of
    it and A at 5/4."""
    from experiments import link_sharing

    rates, nbytes = {"A": 1e6, "B": 2e6}, 1e6
    assert link_sharing.predict(rates, nbytes) == pytest.approx({"A": 1.0, "B": 1.0})
    assert link_sharing.own_speed_fractions(rates, nbytes) == pytest.approx({"A": 1.25, "B": 0.75})


@needs_testbed
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failing_body_leaves_nothing_behind(error):
    with pytest.raises(error), EmulatedTestbed(nodes=2, rate_mbit=100) as testbed:
        assert len(ours(testbed.prefix)) == 3
        raise error("boom")
    assert not ours(testbed.prefix)


TESTBED_HOLDER = """
import sys, time
from moe_core.host.testbed import EmulatedTestbed
with EmulatedTestbed(nodes=2, rate_mbit=100) as testbed:
    print(testbed.prefix, flush=True)
    time.sleep(60)
"""


def _hold_testbed():
    proc = subprocess.Popen([sys.executable, "-c", TESTBED_HOLDER], stdout=subprocess.PIPE, text=True)
    prefix = proc.stdout.readline().strip()
    assert len(ours(prefix)) == 3
    return proc, prefix


@needs_testbed
def test_sigterm_tears_the_testbed_down():
    proc, prefix = _hold_testbed()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not ours(prefix)


@needs_testbed
def test_testbeds_of_a_killed_process_are_removed_by_the_next_one():
    proc, prefix = _hold_testbed()
    proc.kill()
    proc.wait(timeout=30)
    stale = ours(prefix)
    assert len(stale) == 3  # SIGKILL cannot be handled
    assert stale <= set(tb.remove_stale_testbeds())
    assert not ours(prefix)


# -- launcher end to end --------------------------------------------------------------------------------------


@needs_testbed
@pytest.mark.slow
def test_launcher_runs_a_training_step_on_the_emulated_cluster(tmp_path):
    before = namespaces()
    cmd = [
        sys.executable,
        "-m",
        "experiments.launch",
        "--config",
        "configs/default.yaml",
        "hardware_profile=emulated-2x2",
        *TINY,
        f"results_dir={tmp_path}",
        "--nproc",
        "4",
        "--",
        "-m",
        "experiments",
        "train_step",
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("raw/**/*.json")
    record = json.loads(path.read_text())
    assert record["hardware"] == "emulated-2x2" and record["config"]["hardware"]["emulation"]["enabled"]
    assert record["params"]["world_size"] == 4
    assert namespaces() == before


@needs_testbed
@pytest.mark.slow
def test_launcher_stops_the_other_nodes_when_one_fails(tmp_path):
    script = tmp_path / "node1_fails.py"
    script.write_text("import os, sys, time\nsys.exit(3) if os.environ['GROUP_RANK'] == '1' else time.sleep(300)\n")
    before = namespaces()
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.launch",
            "--config",
            "configs/default.yaml",
            "hardware_profile=emulated-2x2",
            "parallel.timeout_s=2",
            "--nproc",
            "4",
            "--",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # node 0's ranks are stopped by whichever of the launcher's two watches fires first, both after
    # 2 s: the node deadline (node 1 failed) or the rank watch (node 0's ranks idle since rank 2 ended)
    stopped = "did not stop within 2 s" in done.stderr or "idle for parallel.timeout_s=2 s after rank 2" in done.stderr
    assert done.returncode != 0 and stopped, done.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert namespaces() == before
