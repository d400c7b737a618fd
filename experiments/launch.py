"""The launcher of every measured job: torchrun on this host, on an emulated multi-node testbed, or
across the nodes of a SLURM allocation.

    python -m experiments.launch --config FILE [--config FILE ...] [key=value ...] --nproc N \\
        -- -m experiments train_step [entry-point args ...]

Everything before ``--`` is the launcher's: the config files and ``key=value`` overrides it loads
(with the hardware profile, moe_core.config.load) and the number of ranks ``N``. After ``--`` comes what
torchrun runs: an entry point, ``-m experiments NAME`` (the runner, experiments/__main__.py), or
another ``-m module`` or a script. The launcher forwards its config files and overrides to the
entry point, so each key is given once:

    <entry> --config FILE ... [entry-point args ...] key=value ...

Keys the launcher acts on (``hardware_profile``, ``hardware.*``, ``parallel.timeout_s``) therefore
belong before ``--``; entry-point flags such as ``--out`` after it.

Three cases, by ``cfg.hardware.emulation``:

* disabled: ``torchrun --standalone --nproc-per-node=N <entry>``, all ranks on this host's loopback.
* enabled, and the host can build it (root, iproute2): a :class:`moe_core.host.testbed.EmulatedTestbed`
  with ``hardware.nodes`` nodes, one torchrun per node inside its namespace, ranks
  ``k * devices_per_node ...`` on node k.
* enabled but unavailable: one line on stderr and the standalone launch, with
  ``hardware.emulation.enabled=false hardware.name=<name>-loopback-fallback`` forwarded so the
  record says its inter-node links were not rate-limited.

With emulation enabled, ``N`` must equal ``hardware.nodes * hardware.devices_per_node`` either way.

Under SLURM (``SLURM_JOB_ID`` set), by the job's task count (asked from ``scontrol``):

* one task (a single-node job; Snakemake's SLURM executor runs such a job inside its own
  ``srun -n1`` step): the standalone torchrun above, on this node's devices.
* T > 1 tasks (a multi-node job, one task per node; see :func:`slurm_resources`), from the batch
  script:
  ``srun torchrun --nnodes=T --nproc-per-node=N/T --rdzv-backend=c10d
  --rdzv-endpoint=<first node of the allocation>:<port>``, one torchrun agent per task.

Why srun + torchrun rather than one srun task per rank (RANK=SLURM_PROCID, ...): the entry points
then see exactly the environment they see locally (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), so there is one start-up path to test; torchrun's agent stops
a node's ranks when one of them fails; and a job asks SLURM for one task per node, which maps
one-to-one onto the plugin's ``nodes``/``tasks`` resources and never needs SLURM's GPU binding.
c10d rendezvous needs no node rank: torchrun numbers the agents in joining order and gives each a
block of consecutive global ranks, so an expert-parallel group (consecutive ranks) stays on one
node whichever node joins first. For a multi-node job the launcher runs once, in the batch script,
and starts the only ``srun`` step: inside a step (``SLURM_STEP_ID`` set) it never calls ``srun``
again, and refuses a multi-node job there (a nested srun would wait for resources its own step holds).

Exit code: the job's (the first failing node's when emulated); 128 + the signal when interrupted;
2 for bad input before any launch: a bad config, an entry point the runner does not know, a ``--nproc``
that differs from the world size the entry point runs with (the config key its line in
experiments.entry_points names: ``parallel.world_size`` for train_step), a ``results_dir`` that
cannot be written.

Failures. Every node's stderr passes through the launcher, and when the job fails its last line
names the rank that failed first and how (:func:`failure_summary`, from torchrun's failure
summary and the ranks' own reports, moe_core.runtime.distributed): ``error: rank 2 was killed by signal 9
(SIGKILL)``, ``error: rank 1 exited with code 1``, or for a hung rank what the others found,
``error: rank 1 stopped responding: its heartbeat stopped: ...``. How long that takes:

* a killed rank: a few seconds (torchrun notices the dead process and stops the others);
* a hung rank: within ``parallel.timeout_s + 10 s`` (typically + 4 to 6 s): the other ranks'
  collectives time out after ``parallel.timeout_s``, they take HEALTH_WINDOW_S (3 s) to name it,
  kill it if it is a stopped process on their host (SIGSTOP: torchrun's SIGTERM cannot end it),
  and exit; torchrun then stops the rest at once, and exits, and the launcher with it.

* a rank stopped or hung where the others cannot reach it (before it reached the store, or at
  teardown after the last collective): the launcher watches the rank processes of its torchrun
  agents and, once any rank has ended, kills a stopped one at once and an idle one after
  ``parallel.timeout_s`` (experiments.rank_watch), naming it.

* a node lost under SLURM (its slurmd and the job's processes there killed, or the node cut off): the
  ranks elsewhere lose their peers at once and name them with their host (``rank 2 stopped
  responding: its heartbeat stopped: its process 4711 runs on node2``); srun reports its first failed
  task and, with ``--kill-on-bad-exit``, stops the others, but would wait for the lost node's tasks
  until SLURM declares the node down (``SlurmdTimeout``, minutes). So the launcher kills an srun that
  has not ended SRUN_EXIT_S after it reported a failed task; the job then ends, and SLURM removes
  what is left of it.

When one node fails, the others get ``parallel.timeout_s`` to notice and report, then are stopped
(srun's ``--kill-on-bad-exit`` does the same for SLURM tasks).

Records. The ranks write theirs into a staging folder (moe_core.records.results.staged_records), which the
launcher publishes only when every rank has exited 0: a run that fails anywhere, teardown
included, leaves none of its records, and Snakemake never sees an output of a failed job.

Interrupts. SIGINT, SIGTERM and SIGHUP stop torchrun and every rank, and the launcher exits with
128 + the signal; only a run that finished writes its record. Under Snakemake, Ctrl-C (SIGINT to
the whole foreground process group, as ``kill -INT -- -<pgid>``) reaches the launcher, so the job
stops with Snakemake without writing its record, and the same command later runs it again (no
``--rerun-incomplete`` needed). ``kill -INT <snakemake pid>`` alone never reaches the job:
Snakemake's local executor waits for its running jobs to finish (they write their records) and
exits leaving their outputs marked incomplete, so the next run needs ``--rerun-incomplete``.
"""

from __future__ import annotations

import argparse
import codecs
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass

from omegaconf import OmegaConf

from experiments.entry_points import ENTRY_POINTS
from experiments.rank_watch import RankWatch, descendants
from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import FAILED_RANK_EXIT_CODE, status_of
from moe_core.host.testbed import EmulatedTestbed, emulation_unavailable
from moe_core.records.results import ResultsDirError, check_writable, staged_records
from moe_core.schema.sections import ConfigError

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# torchrun's wait for its ranks after it passes on a stop signal (SIGTERM, SIGINT: the launcher
# stopping it), before it kills them; its default, 30 s, only ever matters for a rank that cannot
# run (SIGSTOP, uninterruptible sleep). Read by torch >= 2.12 (TORCH_ELASTIC_SHUTDOWN_TIMEOUT).
TORCHRUN_SHUTDOWN_S = 3
# Each node's namespace is fresh, so a fixed rendezvous port cannot collide with anything.
RENDEZVOUS_PORT = 29500
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long srun may take to end after it reported a failed task: --kill-on-bad-exit has SLURM stop the
# step's other tasks (SIGTERM; each torchrun stops its ranks within TORCHRUN_SHUTDOWN_S), which takes
# seconds on every node it can reach.
SRUN_EXIT_S = 10.0
# SLURM c10d rendezvous port: derived from the job id, so two jobs sharing a first node do not
# collide; below Linux's ephemeral range (32768-) so outgoing connections do not take it first.
SLURM_RENDEZVOUS_PORT_BASE, SLURM_RENDEZVOUS_PORTS = 20000, 10000
# What a measured job asks of SLURM per rank: a GPU rank gets a few cores for its host-side work
# (kernel launches, heartbeat thread), a CPU rank one core (the ranks share the node, see
# moe_core.runtime.distributed.cpu_threads_per_rank). Host memory: a CUDA context alone holds a few GB.
CPUS_PER_RANK = {"cpu": 1, "cuda": 4}
MEM_MB_PER_RANK = {"cpu": 1500, "cuda": 8000}
JOB_RUNTIME_MIN = 30
# Every key slurm_resources can set, for rules whose points differ in which ones they set.
SLURM_RESOURCE_KEYS = ("nodes", "tasks", "cpus_per_task", "mem_mb", "runtime", "mpi", "gpu", "gres", "tasks_per_gpu")


# What the launcher reads of the config (named by --help); the rest is the entry point's.
CONFIG_KEYS = ("hardware_profile", "hardware", "parallel.timeout_s", "results_dir")
# --help: what comes after ``--``, and which keys go where (the module docstring says more).
ENTRY_FORM = """\
after `--`: what torchrun runs on every rank, `-m experiments NAME` (an entry point; or another
`-m MODULE`, or a script) and its own arguments, e.g. `-- -m experiments collectives --check`. The
launcher forwards its --config files and key=value overrides to it, so each key is given once: the
keys the launcher acts on (hardware_profile, hardware.*, parallel.timeout_s) before `--`, the entry
point's flags after it. --nproc must equal the world size the entry point runs with (its world size
key in experiments.entry_points, e.g. collectives.world_size)."""
# What names an entry point after ``--``: the runner, then the entry point's name.
RUNNER = ["-m", "experiments"]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` at ``--`` into the launcher's arguments and the entry point's command."""
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.prog = "python -m experiments.launch"
    parser.usage = "%(prog)s [--config FILE]... [key=value]... --nproc N -- -m experiments NAME [ARGS]..."
    parser.epilog = f"{ENTRY_FORM}\n\n{parser.epilog}"
    parser.add_argument("--nproc", type=int, required=True, metavar="N", help="total number of ranks")
    if "--" not in argv:
        if {"-h", "--help"} & set(argv):
            parser.parse_args(["--help"])  # prints the help and exits 0
        parser.error("missing `-- -m experiments <entry point> [args]`: what to launch")
    split = argv.index("--")
    args = parser.parse_intermixed_args(argv[:split])
    entry = argv[split + 1 :]
    target = entry_target(entry)
    if len(entry) < target or entry[target - 1].startswith("-"):
        parser.error(f"after `--` expected `-m experiments <entry point>`, `-m <module>` or a script, got {entry}")
    if args.nproc < 1:
        parser.error(f"--nproc must be >= 1, got {args.nproc}")
    return args, entry


def entry_target(entry: list[str]) -> int:
    """How many leading words of ``entry`` name what runs: ``-m experiments NAME`` (the runner and
    an entry point), ``-m MODULE`` or a script; its own arguments follow them."""
    if entry[:2] == RUNNER:
        return 3
    return 2 if entry[:1] == ["-m"] else 1


def entry_command(entry: list[str], configs: list[str], overrides: list[str]) -> list[str]:
    """The entry point's command line with the launcher's config files and overrides forwarded."""
    target = entry_target(entry)
    config_args = [arg for path in configs for arg in ("--config", path)]
    return [*entry[:target], *config_args, *entry[target:], *overrides]


def run_all(commands: list[tuple[list[str], dict[str, str]]], grace_s: float) -> int:
    """Run ``(argv, env)`` commands concurrently; return the first failure's exit code, else 0.

    Once one fails, the rest get ``grace_s`` to finish (normally they notice the lost peer within
    seconds and report it), then are stopped. Each command's stderr is copied to ours as it comes;
    when the job failed, one last line names the rank that failed first and how
    (:func:`failure_summary`). SIGINT, SIGTERM and SIGHUP stop everything (:func:`_stop`) and
    return 128 + the signal.
    """
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    procs, relays, code, interrupted = [], [], 0, False
    watch = RankWatch(agents=[], timeout_s=grace_s)
    try:
        for argv, env in commands:
            procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, start_new_session=True))
            relays.append(StderrRelay(procs[-1].stderr))
            watch.agents.append(procs[-1].pid)
        code = _wait(procs, relays, grace_s, watch)
    except _Interrupted as stop:
        code, interrupted = 128 + stop.signum, True
        print(
            f"error: interrupted by {signal.Signals(stop.signum).name}: stopping torchrun and its ranks",
            file=sys.stderr,
            flush=True,
        )
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        _stop(procs)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outputs = [relay.text(timeout_s=2.0) for relay in relays]
    summary = failure_summary(outputs, watch.killed) if code and not interrupted else None
    if summary:
        print(f"error: {summary}", file=sys.stderr, flush=True)
    return code


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum, frame):
    raise _Interrupted(signum)


def _wait(procs: list[subprocess.Popen], relays: list[StderrRelay], grace_s: float, watch: RankWatch) -> int:
    """Wait for every process, watching their ranks (``watch``: a rank that cannot finish once
    another has ended is killed) and killing an srun stuck on a lost node (:func:`_kill_stuck_srun`);
    once one process fails, the others get ``grace_s``. The first failure's code."""
    first_failure, deadline, srun_failed_at = 0, None, {}
    while True:
        for line in watch.poll():
            print(line, file=sys.stderr, flush=True)
        for proc, relay in zip(procs, relays):
            _kill_stuck_srun(proc, relay, srun_failed_at)
        codes = [p.poll() for p in procs]
        failed = [_exit_code(code) for code in codes if code not in (None, 0)]
        if failed and deadline is None:
            first_failure, deadline = failed[0], time.monotonic() + grace_s
        if None not in codes:
            return first_failure
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"error: a node failed with exit code {first_failure} and the others did not stop "
                f"within {grace_s:g} s; stopping them",
                file=sys.stderr,
            )
            return first_failure
        time.sleep(0.2)


def _kill_stuck_srun(proc: subprocess.Popen, relay: StderrRelay, failed_at: dict[int, float]) -> None:
    """SIGKILL ``proc`` (and its process group) when it is an srun that reported a failed task
    (``srun: error: node1: task 0: Exited with exit code 3``) more than SRUN_EXIT_S ago and still runs:
    it waits for a node it cannot reach. ``failed_at``: pid -> when its report was first seen."""
    report = relay.find(_SRUN_TASK_FAILED) if proc.poll() is None else None
    if report is None:
        return
    since = failed_at.setdefault(proc.pid, time.monotonic())
    if time.monotonic() - since > SRUN_EXIT_S:
        print(
            f"error: srun has not ended {SRUN_EXIT_S:g} s after `{report}`: it waits for a node it cannot "
            f"reach (dead, or its slurmd is); killing it",
            file=sys.stderr,
            flush=True,
        )
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + signal number for a process killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the commands still running: SIGTERM to each one's process group (torchrun passes it on
    to its ranks), after STOP_GRACE_S SIGKILL to the group, then to every process it had started
    that still runs.

    NOTE: torchrun starts each rank in a session of its own, out of reach of its group's signals;
    a rank that torchrun could not stop (SIGSTOP) would outlive it without the last step.
    """
    running = [p for p in procs if p.poll() is None]
    started = [child for p in running for child in descendants(p.pid)]
    for p in running:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
    for pid, start_time in started:
        if status_of(pid, start_time) is not None:  # still the same process, running
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class StderrRelay:
    """Copies a child's stderr to ours as it comes, keeping its last TAIL_BYTES to name failures."""

    TAIL_BYTES = 1 << 16

    def __init__(self, stream):
        self._tail = bytearray()
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may end mid-character
        while chunk := os.read(stream.fileno(), 1 << 16):
            self._tail += chunk
            del self._tail[: -self.TAIL_BYTES]
            try:
                sys.stderr.write(decoder.decode(chunk))
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone; keep draining, or the ranks block on a full pipe
                pass
        stream.close()

    def find(self, pattern: re.Pattern) -> str | None:
        """The first match of ``pattern`` in the tail so far, or None."""
        match = pattern.search(bytes(self._tail).decode(errors="replace"))
        return match.group(0) if match else None

    def text(self, timeout_s: float) -> str:
        """The tail, once the child's stderr is closed (or after ``timeout_s``)."""
        self._thread.join(timeout_s)
        return bytes(self._tail).decode(errors="replace")


# srun's report of a task that ended badly (it then stops the step's other tasks: --kill-on-bad-exit).
_SRUN_TASK_FAILED = re.compile(r"srun: error: \S+: tasks? [\d,-]+: [^\n]+")
# torchrun's failure summary (torch.distributed.elastic's ChildFailedError): one entry per failed rank.
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure):"
# A rank's own report (moe_core.runtime.distributed.Health.exit_naming_failed_ranks).
_RANK_REPORT = re.compile(r"error: rank (\d+) (?:stopped|could not start): .*? \| (.*)")
_UNRESPONSIVE = re.compile(r"rank (\d+) did not respond: ([^;]*)")
_KILLED_BY_A_RANK = re.compile(r"so rank \d+ kills it")
# A rank's own one-line error (``error: ...``, moe_core.records.results.exit_if_unwritable) or the last
# line of an uncaught exception's traceback (``OSError: [Errno 28] No space left on device``).
_ERROR_LINE = re.compile(r"^error: (.+)$|^((?:\w+\.)*\w*(?:Error|Exception): .+)$")
_TORCHRUN_ERROR = "ChildFailedError"  # torchrun's own exception, which says only that a rank failed


def failure_summary(outputs: list[str], killed: dict[int, str] | None = None) -> str | None:
    """Which rank failed first and how, from the stderr of a failed job (one text per torchrun) and
    the ranks the launcher killed (``killed``: rank -> why, experiments.rank_watch).

    In order: torchrun's first observed failure ("rank 2 was killed by signal 9 (SIGKILL)"), unless
    it is a rank that only reported a failed peer (FAILED_RANK_EXIT_CODE) or a stopped rank that
    such a rank or the launcher killed; else the ranks that the others found unresponsive (a hung
    rank, which never fails by itself); else the ranks the launcher killed (stopped or hung after
    another rank had ended, e.g. at teardown); else torchrun's other failures that are neither such
    reports nor the SIGTERMs it stops ranks with. None when nothing is known. A rank that exited with
    a code comes with the last error line the ranks printed (:func:`last_error`): its cause (a full
    disk) is otherwise only in the job's log.
    """
    killed = killed or {}
    roots, others, reported = [], [], {}
    for text in outputs:
        head, marker, tail = text.rpartition(_ROOT_CAUSE)
        if marker:
            roots += [(int(r), int(c)) for r, c in _TORCHRUN_FAILURE.findall(tail)[:1]]
            start = head.rfind("Failures:")
            others += [(int(r), int(c)) for r, c in _TORCHRUN_FAILURE.findall(head[start:] if start >= 0 else "")]
        for line in text.replace("\r", "\n").splitlines():
            report = _RANK_REPORT.search(line)
            for rank, why in _UNRESPONSIVE.findall(report.group(2)) if report else ():
                reported.setdefault(int(rank), f"{why.strip()} (found by rank {report.group(1)})")
    killed_by_a_rank = {r for r, why in reported.items() if _KILLED_BY_A_RANK.search(why)}
    first = [(r, c) for r, c in roots if c != FAILED_RANK_EXIT_CODE and r not in killed_by_a_rank | killed.keys()]
    if first:
        return _with_last_error("; ".join(f"rank {r} {_how(c)}" for r, c in first), first, outputs)
    if reported:
        return "; ".join(f"rank {r} stopped responding: {why}" for r, why in sorted(reported.items()))
    if killed:
        return "; ".join(f"rank {r} {why}; the launcher killed it" for r, why in sorted(killed.items()))
    rest = [(r, c) for r, c in roots + others if c not in (FAILED_RANK_EXIT_CODE, -signal.SIGTERM)]
    return _with_last_error("; ".join(f"rank {r} {_how(c)}" for r, c in rest), rest, outputs) or None


def _with_last_error(summary: str, failed: list[tuple[int, int]], outputs: list[str]) -> str:
    """``summary`` of the ``failed`` (rank, exit code) pairs, with the ranks' last error line when one
    of them exited with a code rather than a signal."""
    error = last_error(outputs) if any(code > 0 for _, code in failed) else None
    return f"{summary} (last error: {error})" if error else summary


def last_error(outputs: list[str]) -> str | None:
    """The last error line in the ranks' stderr (one text per torchrun): a rank's own ``error: ...``
    line, not a report of a failed peer (failure_summary reads those), or an exception's last
    traceback line, not torchrun's own ChildFailedError. None when there is none."""
    found = None
    for text in outputs:
        for line in text.replace("\r", "\n").splitlines():
            match = _ERROR_LINE.match(line.strip())
            if match and not _RANK_REPORT.search(line) and _TORCHRUN_ERROR not in line:
                found = match.group(1) or match.group(2)
    return found


def _how(exitcode: int) -> str:
    """torchrun's exit code of a rank (negative: the signal that killed it) in words."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with code {exitcode}"


def torchrun_env(environ) -> dict[str, str]:
    """``environ`` for a torchrun, with its shutdown timeout TORCHRUN_SHUTDOWN_S unless one is set."""
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TORCHRUN_SHUTDOWN_S), **environ}


def entry_world_size_key(entry: list[str]) -> str | None:
    """The config key an entry point (``-m experiments NAME``) takes its world size from: its line in
    experiments.entry_points (the key its ``run`` passes to moe_core.runtime.distributed), read
    without importing its module; None for an entry point that names none, another module or a
    script. ConfigError, as none of its ranks could start, for a NAME that is no entry point (a
    misspelt name), a module that cannot be found, or an entry point's module run as
    ``-m experiments.NAME`` (the module defines the work; the runner runs it)."""
    if entry[:2] == RUNNER:
        if entry[2] not in ENTRY_POINTS:
            raise ConfigError(f"entry point '{entry[2]}' is unknown; the entry points: {', '.join(ENTRY_POINTS)}")
        return ENTRY_POINTS[entry[2]].world_size_key
    if entry[0] != "-m":
        return None
    module = entry[1]
    if module.startswith("experiments.") and module.removeprefix("experiments.") in ENTRY_POINTS:
        name = module.removeprefix("experiments.")
        raise ConfigError(f"'-m {module}' runs nothing: launch the entry point as `-m experiments {name}`")
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a package on the way is missing
        found = False
    if not found:
        raise ConfigError(f"module '-m {module}' cannot be found; launch an entry point: `-m experiments NAME`")
    return None


def check_world_size(nproc: int, entry: list[str], cfg) -> None:
    """Raise ConfigError when ``--nproc`` differs from the world size the entry point runs with
    (checked before anything starts)."""
    key = entry_world_size_key(entry)
    expected = OmegaConf.select(cfg, key) if key else nproc
    if expected != nproc:
        raise ConfigError(
            f"--nproc {nproc} differs from {key}={expected}, the world size {entry[entry_target(entry) - 1]} runs "
            f"with: pass --nproc {expected} or {key}={nproc}"
        )


def standalone_command(nproc: int, entry: list[str]) -> list[str]:
    return [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", *entry]


# -- SLURM ----------------------------------------------------------------------------------------


def job_layout(hw, world_size: int) -> tuple[int, int]:
    """``(nodes, ranks per node)`` of a measured job with ``world_size`` ranks on hardware ``hw``.

    A job fits on one node while ``world_size <= hw.devices_per_node`` (and always on an emulated
    testbed, which is one host); beyond that it takes whole nodes. Raises ConfigError otherwise.
    """
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    per_node = hw.devices_per_node
    if hw.emulation.enabled or world_size <= per_node:
        return 1, world_size
    if world_size % per_node:
        raise ConfigError(
            f"world size {world_size} spans several nodes of hardware profile '{hw.name}' "
            f"(hardware.devices_per_node={per_node}) and must then fill whole nodes: "
            f"use a multiple of {per_node}"
        )
    return world_size // per_node, per_node


def slurm_resources(cfg, world_size: int) -> dict[str, int | str]:
    """Snakemake resources of a measured job for the SLURM executor plugin (unset keys left out).

    One task per node, each a torchrun agent with that node's ranks (:func:`main`). A multi-node
    job carries ``mpi``, so the plugin runs its shell in the batch script instead of wrapping it in
    ``srun -n1`` on one node, and the launcher starts the ``srun`` step itself. GPUs: a single-node
    job asks ``gpu`` (``--gpus``, which the plugin also hands to its ``srun -n1`` step), a
    multi-node one ``gres=gpu:<per node>`` (``--gres`` is per node, ``--gpus`` a per-job total);
    ``tasks_per_gpu=0`` keeps the plugin from adding ``--ntasks-per-gpu``. ``mem_mb`` (``--mem``)
    is per node. Runtime, memory and CPUs can be raised with ``--set-resources``.
    """
    nodes, per_node = job_layout(cfg.hardware, world_size)
    device = cfg.hardware.device
    resources = {
        "nodes": nodes,
        "tasks": nodes,
        "cpus_per_task": per_node * CPUS_PER_RANK[device],
        "mem_mb": per_node * MEM_MB_PER_RANK[device],
        "runtime": JOB_RUNTIME_MIN,
    }
    if nodes > 1:
        resources["mpi"] = "srun"
    if device == "cuda":
        resources["tasks_per_gpu"] = 0
        if nodes > 1:
            resources["gres"] = f"gpu:{per_node}"
        else:
            resources["gpu"] = per_node
    return resources


def job_gpus(resources: dict[str, int | str]) -> int:
    """The GPUs a measured job asks (slurm_resources): ``gpu`` on one node, ``gres=gpu:<per node>`` on
    each of its nodes; 0 on CPU."""
    if "gres" in resources:
        return int(resources["nodes"]) * int(str(resources["gres"]).rsplit(":", 1)[1])
    return int(resources.get("gpu", 0))


def plan_text(jobs: dict[str, list[dict[str, int | str]]]) -> str:
    """What a run's measured jobs ask, for a reader deciding whether to submit it: per rule the jobs,
    nodes and GPUs each, and the total GPU-hours at most (each job's GPUs for its whole runtime limit).
    ``jobs``: rule -> each job's slurm_resources."""
    lines, gpu_hours = [], 0.0
    for rule, each in sorted(jobs.items()):
        nodes, gpus = [int(r["nodes"]) for r in each], [job_gpus(r) for r in each]
        gpu_hours += sum(g * int(r["runtime"]) / 60 for g, r in zip(gpus, each))
        what = f"{_span(nodes)} node{'s' if max(nodes) > 1 else ''}" + (f", {_span(gpus)} GPUs" if max(gpus) else "")
        lines.append(f"  {rule:<16}{len(each):>4} job{'s' if len(each) != 1 else ' '}  {what} each")
    total = sum(len(each) for each in jobs.values())
    return "\n".join(
        [
            f"Measured jobs of this config: {total} (one SLURM job each on a cluster)",
            *lines,
            f"GPU-hours at most: {gpu_hours:.1f} (each job's GPUs for its whole runtime limit)",
            "Every other job (simulation, calibration, analysis) runs on the login node (localrule).",
        ]
    )


def _span(values: list[int]) -> str:
    """``a`` or ``a-b``: the range of ``values``."""
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


@dataclass(frozen=True)
class SlurmJob:
    """The SLURM job this process runs in, as the controller reports it (``scontrol show job``).

    Asked from the controller rather than read from ``SLURM_*`` variables: Snakemake's SLURM
    jobstep removes all of them but ``SLURM_JOB_ID`` from a rule's environment.
    """

    job_id: str
    nodes: int
    tasks: int
    cpus_per_task: int
    hosts: tuple[str, ...]  # the allocation's nodes, first node first

    @classmethod
    def query(cls, job_id: str) -> SlurmJob:
        """Ask the controller about job ``job_id``; raises ConfigError when scontrol fails."""
        show = _scontrol("show", "job", "--oneliner", job_id)
        fields = dict(item.split("=", 1) for item in show.split() if "=" in item)
        nodes = int(fields["NumNodes"])
        # A job submitted without --ntasks / --cpus-per-task may report them as N/A.
        tasks = fields.get("NumTasks", "")
        cpus = fields.get("CPUs/Task", "")
        return cls(
            job_id=job_id,
            nodes=nodes,
            tasks=int(tasks) if tasks.isdigit() else nodes,
            cpus_per_task=int(cpus) if cpus.isdigit() else 1,
            hosts=tuple(_scontrol("show", "hostnames", fields["NodeList"]).split()),
        )


def _scontrol(*args: str) -> str:
    proc = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"`scontrol {' '.join(args)}` failed inside SLURM job: {proc.stderr.strip()}")
    return proc.stdout


def slurm_agents(job: SlurmJob | None, in_step: bool) -> int:
    """How many torchrun agents to start with ``srun``: 0 for a plain torchrun on this host.

    0 outside SLURM, inside a job step (e.g. the plugin's ``srun -n1``) and in a one-task job;
    the job's task count T in the batch script of a T-task job. Raises ConfigError for a
    multi-node job seen from inside a step, where launching would need a nested srun.
    """
    if job is None:
        return 0
    if in_step:
        if job.nodes > 1:
            raise ConfigError(
                f"inside a job step of {job.nodes}-node SLURM job {job.job_id}: run the launcher "
                f"once in the batch script (Snakemake: resource mpi='srun', as "
                f"experiments.launch.slurm_resources sets), not under srun"
            )
        return 0
    return job.tasks if job.tasks > 1 else 0


def slurm_command(
    nproc: int, agents: int, job: SlurmJob, entry: list[str], environ
) -> tuple[list[str], dict[str, str]]:
    """``srun`` starting one torchrun agent per SLURM task, rendezvous (c10d) on the first node."""
    if nproc % agents:
        raise ConfigError(
            f"--nproc {nproc} cannot be split evenly over the {agents} tasks of SLURM job "
            f"{job.job_id}; ask one task per node and whole nodes"
        )
    per_agent = nproc // agents
    port = SLURM_RENDEZVOUS_PORT_BASE + int(job.job_id) % SLURM_RENDEZVOUS_PORTS
    argv = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--ntasks={agents}",
        f"--cpus-per-task={job.cpus_per_task}",
        *TORCHRUN,
        f"--nnodes={agents}",
        f"--nproc-per-node={per_agent}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={job.hosts[0]}:{port}",
        f"--rdzv-id={job.job_id}",
        *entry,
    ]
    # A task's cores are shared by its ranks; torchrun would pass on the OMP_NUM_THREADS that
    # Snakemake exported for the whole job.
    return argv, {**torchrun_env(environ), "OMP_NUM_THREADS": str(max(1, job.cpus_per_task // per_agent))}


def run_emulated(cfg, entry: list[str]) -> int:
    """One torchrun per emulated node, inside its namespace; the testbed is always torn down.

    Static rendezvous (``--master-addr/--master-port`` with ``--node-rank``) rather than c10d: c10d
    hands out node ranks in joining order and ignores ``--node-rank``, so which namespace held ranks
    0, 1, ... would vary between runs; static ranks are node_rank * devices_per_node + local_rank,
    so consecutive ranks (one expert-parallel group, see moe_core.parallel.layout.Layout) share a node.
    Node 0's torchrun hosts the store on its eth0 address.
    """
    hw = cfg.hardware
    emu = hw.emulation
    env = {
        **torchrun_env(os.environ),
        "GLOO_SOCKET_IFNAME": "eth0",
        # All nodes share this host's cores, but moe_core.runtime.distributed.cpu_threads_per_rank divides them
        # by the ranks of one node only (LOCAL_WORLD_SIZE); cap the threads by the ranks of all nodes.
        "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // (hw.nodes * hw.devices_per_node))),
    }
    with EmulatedTestbed(hw.nodes, emu.rate_mbit, emu.burst_kb, emu.latency_ms) as testbed:
        print(
            f"emulated testbed {testbed.prefix}: {hw.nodes} nodes x {hw.devices_per_node} ranks, "
            f"links {emu.rate_mbit:g} Mbit/s per direction",
            file=sys.stderr,
            flush=True,
        )
        commands = []
        for node in range(hw.nodes):
            argv = [
                "ip",
                "netns",
                "exec",
                testbed.netns(node),
                *TORCHRUN,
                f"--nnodes={hw.nodes}",
                f"--node-rank={node}",
                f"--nproc-per-node={hw.devices_per_node}",
                f"--master-addr={testbed.address(0)}",
                f"--master-port={RENDEZVOUS_PORT}",
                *entry,
            ]
            commands.append((argv, env))
        return run_all(commands, grace_s=cfg.parallel.timeout_s)


def main(argv: list[str] | None = None) -> int:
    args, entry = parse_args(sys.argv[1:] if argv is None else argv)
    from moe_core.config.load import load_config  # the schema and every paper: once the command line is parsed

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    hw = cfg.hardware
    try:
        check_world_size(args.nproc, entry, cfg)
        check_device(hw.device)
        check_writable(cfg.results_dir)
        job = SlurmJob.query(os.environ["SLURM_JOB_ID"]) if "SLURM_JOB_ID" in os.environ else None
        agents = slurm_agents(job, in_step="SLURM_STEP_ID" in os.environ)
        if agents and hw.emulation.enabled:
            raise ConfigError(
                f"hardware profile '{cfg.hardware_profile}' emulates its nodes on one host, "
                f"but SLURM job {job.job_id} has {agents} tasks; run it as a one-task job"
            )
        if not agents and hw.emulation.enabled and args.nproc != hw.nodes * hw.devices_per_node:
            raise ConfigError(
                f"--nproc {args.nproc} does not fill hardware profile '{cfg.hardware_profile}': "
                f"hardware.nodes * hardware.devices_per_node = {hw.nodes} * {hw.devices_per_node} = "
                f"{hw.nodes * hw.devices_per_node}"
            )
        # The ranks' records are staged and published only when every rank has exited 0: a run that
        # fails anywhere, a rank hung at teardown included, leaves none of its records behind.
        with staged_records(cfg.results_dir) as stage:
            code = launch(cfg, args, entry, job, agents)
            if code and stage:
                stage.discard()
    except (ConfigError, ResultsDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return code


def launch(cfg, args: argparse.Namespace, entry: list[str], job: SlurmJob | None, agents: int) -> int:
    """Start the job's torchrun(s) (one of the three cases of this module's docstring); the exit code."""
    hw, overrides = cfg.hardware, list(args.overrides)
    if agents:
        slurm = slurm_command(args.nproc, agents, job, entry_command(entry, args.config, overrides), os.environ)
        print(f"SLURM job {job.job_id}, {agents} tasks: {' '.join(slurm[0])}", file=sys.stderr, flush=True)
        return run_all([slurm], grace_s=cfg.parallel.timeout_s)
    if hw.emulation.enabled:
        reason = emulation_unavailable()
        if reason is None:
            return run_emulated(cfg, entry_command(entry, args.config, overrides))
        print(
            f"emulated testbed unavailable ({reason}); falling back to plain loopback: "
            f"inter-node links are NOT rate-limited",
            file=sys.stderr,
            flush=True,
        )
        overrides += ["hardware.emulation.enabled=false", f"hardware.name={hw.name}-loopback-fallback"]
    command = standalone_command(args.nproc, entry_command(entry, args.config, overrides))
    return run_all([(command, torchrun_env(os.environ))], grace_s=cfg.parallel.timeout_s)


def check_device(device: str) -> None:
    """Raise ConfigError when the config asks for GPUs this host does not have (before any rank
    starts, rather than on every rank after the start). Imports torch only for ``cuda``."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "hardware.device is 'cuda' but torch sees no GPU on this host; use hardware_profile=local-cpu, "
            "or run on a GPU node"
        )


if __name__ == "__main__":
    sys.exit(main())
