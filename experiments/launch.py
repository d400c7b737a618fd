"""The launcher of every measured job: torchrun on this host, or on an emulated multi-node testbed.

    python -m experiments.launch --config FILE [--config FILE ...] [key=value ...] --nproc N \\
        -- -m experiments.train_step [entry-point args ...]

Everything before ``--`` is the launcher's: the config files and ``key=value`` overrides it loads
(with the hardware profile, moe_core.config) and the number of ranks ``N``. After ``--`` comes what
torchrun runs (``-m module`` or a script). The launcher forwards its config files and overrides to
the entry point, so each key is given once:

    <entry> --config FILE ... [entry-point args ...] key=value ...

Keys the launcher acts on (``hardware_profile``, ``hardware.*``, ``parallel.timeout_s``) therefore
belong before ``--``; entry-point flags such as ``--out`` after it.

Three cases, by ``cfg.hardware.emulation``:

* disabled: ``torchrun --standalone --nproc-per-node=N <entry>``, all ranks on this host's loopback.
* enabled, and the host can build it (root, iproute2): a :class:`moe_core.testbed.EmulatedTestbed`
  with ``hardware.nodes`` nodes, one torchrun per node inside its namespace, ranks
  ``k * devices_per_node ...`` on node k.
* enabled but unavailable: one line on stderr and the standalone launch, with
  ``hardware.emulation.enabled=false hardware.name=<name>-loopback-fallback`` forwarded so the
  record says its inter-node links were not rate-limited.

With emulation enabled, ``N`` must equal ``hardware.nodes * hardware.devices_per_node`` either way.

Exit code: the job's (the first failing node's when emulated), 2 for bad input before any launch.
When one node fails, the others get ``parallel.timeout_s`` to notice and report, then are stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from moe_core.config import ConfigError, config_arg_parser, load_config
from moe_core.testbed import EmulatedTestbed, emulation_unavailable

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# Each node's namespace is fresh, so a fixed rendezvous port cannot collide with anything.
RENDEZVOUS_PORT = 29500
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` at ``--`` into the launcher's arguments and the entry point's command."""
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m experiments.launch"
    parser.add_argument("--nproc", type=int, required=True, help="total number of ranks")
    if "--" not in argv:
        parser.error("missing `-- -m <module> [args]`: what to launch")
    split = argv.index("--")
    args = parser.parse_intermixed_args(argv[:split])
    entry = argv[split + 1:]
    target = 2 if entry[:1] == ["-m"] else 1
    if len(entry) < target or entry[target - 1].startswith("-"):
        parser.error(f"after `--` expected `-m <module>` or a script, got {entry}")
    if args.nproc < 1:
        parser.error(f"--nproc must be >= 1, got {args.nproc}")
    return args, entry


def entry_command(entry: list[str], configs: list[str], overrides: list[str]) -> list[str]:
    """The entry point's command line with the launcher's config files and overrides forwarded."""
    target = 2 if entry[0] == "-m" else 1
    config_args = [arg for path in configs for arg in ("--config", path)]
    return [*entry[:target], *config_args, *entry[target:], *overrides]


def run_all(commands: list[tuple[list[str], dict[str, str]]], grace_s: float) -> int:
    """Run ``(argv, env)`` commands concurrently; return the first failure's exit code, else 0.

    Once one fails, the rest get ``grace_s`` to finish (normally they notice the lost peer within
    seconds and report it), then are stopped. Each command runs in its own session, so stopping it
    stops its whole process tree (torchrun and its workers). SIGINT and SIGTERM stop everything.
    """
    previous_sigterm = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    procs = []
    try:
        procs = [subprocess.Popen(argv, env=env, start_new_session=True) for argv, env in commands]
        first_failure, deadline = 0, None
        while True:
            codes = [p.poll() for p in procs]
            failed = [_exit_code(code) for code in codes if code not in (None, 0)]
            if failed and deadline is None:
                first_failure, deadline = failed[0], time.monotonic() + grace_s
            if None not in codes:
                return first_failure
            if deadline is not None and time.monotonic() > deadline:
                print(f"error: a node failed with exit code {first_failure} and the others did not stop "
                      f"within {grace_s:g} s; stopping them", file=sys.stderr)
                return first_failure
            time.sleep(0.2)
    finally:
        _stop(procs)
        signal.signal(signal.SIGTERM, previous_sigterm)


def _exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + signal number for a process killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the process groups still running, SIGKILL them after STOP_GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        running = [p for p in procs if p.poll() is None]
        for p in running:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        for p in running:
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass


def standalone_command(nproc: int, entry: list[str]) -> list[str]:
    return [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", *entry]


def run_emulated(cfg, entry: list[str]) -> int:
    """One torchrun per emulated node, inside its namespace; the testbed is always torn down.

    Static rendezvous (``--master-addr/--master-port`` with ``--node-rank``) rather than c10d: c10d
    hands out node ranks in joining order and ignores ``--node-rank``, so which namespace held ranks
    0, 1, ... would vary between runs; static ranks are node_rank * devices_per_node + local_rank,
    so consecutive ranks (one expert-parallel group, see moe_core.config.Layout) share a node.
    Node 0's torchrun hosts the store on its eth0 address.
    """
    hw = cfg.hardware
    emu = hw.emulation
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0",
           # All nodes share this host's cores, but moe_core.distributed.cpu_threads_per_rank divides them
           # by the ranks of one node only (LOCAL_WORLD_SIZE); cap the threads by the ranks of all nodes.
           "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // (hw.nodes * hw.devices_per_node)))}
    with EmulatedTestbed(hw.nodes, emu.rate_mbit, emu.burst_kb, emu.latency_ms) as testbed:
        print(f"emulated testbed {testbed.prefix}: {hw.nodes} nodes x {hw.devices_per_node} ranks, "
              f"links {emu.rate_mbit:g} Mbit/s per direction", file=sys.stderr, flush=True)
        commands = []
        for node in range(hw.nodes):
            argv = ["ip", "netns", "exec", testbed.netns(node), *TORCHRUN, f"--nnodes={hw.nodes}",
                    f"--node-rank={node}", f"--nproc-per-node={hw.devices_per_node}",
                    f"--master-addr={testbed.address(0)}", f"--master-port={RENDEZVOUS_PORT}", *entry]
            commands.append((argv, env))
        return run_all(commands, grace_s=cfg.parallel.timeout_s)


def main(argv: list[str] | None = None) -> int:
    args, entry = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    hw = cfg.hardware
    overrides = list(args.overrides)
    if hw.emulation.enabled:
        if args.nproc != hw.nodes * hw.devices_per_node:
            print(f"error: --nproc {args.nproc} does not fill hardware profile '{cfg.hardware_profile}': "
                  f"hardware.nodes * hardware.devices_per_node = {hw.nodes} * {hw.devices_per_node} = "
                  f"{hw.nodes * hw.devices_per_node}", file=sys.stderr)
            return 2
        reason = emulation_unavailable()
        if reason is None:
            return run_emulated(cfg, entry_command(entry, args.config, overrides))
        print(f"emulated testbed unavailable ({reason}); falling back to plain loopback: "
              f"inter-node links are NOT rate-limited", file=sys.stderr, flush=True)
        overrides += ["hardware.emulation.enabled=false", f"hardware.name={hw.name}-loopback-fallback"]
    command = standalone_command(args.nproc, entry_command(entry, args.config, overrides))
    return run_all([(command, dict(os.environ))], grace_s=cfg.parallel.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
