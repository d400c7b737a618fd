"""Process-group start-up shared by every measured entry point (run under ``torchrun``), and how a
failed rank is found and named.

How a failure ends a run
------------------------
Every rank publishes a heartbeat in the launcher's key-value store (torchrun's TCPStore) from a
thread of its own (:class:`Health`). When start-up or a collective fails on a rank (a dead peer
shows up as "Connection closed by peer" at once, a hung one as a timeout after
``parallel.timeout_s``), that rank watches every rank's heartbeat for HEALTH_WINDOW_S, prints one
line naming the ranks that stopped (``error: rank 0 stopped: <error> | rank 1 did not respond:
<why>``) and exits with FAILED_RANK_EXIT_CODE. Then:

* a killed rank: torchrun sees the dead process within its monitor interval (0.1 s), reports it
  with its signal or exit code as its "Root Cause" and stops the other ranks: the run ends within
  a few seconds. The survivors' HEALTH_WINDOW_S of watching keeps them from exiting first, so the
  first failure torchrun observes is the dead rank and not a survivor.
* a hung rank: the run ends ``parallel.timeout_s + HEALTH_WINDOW_S`` after the hang, plus the
  second or two torchrun (and experiments.launch) take to stop the rest and exit: within
  ``parallel.timeout_s + 10 s`` (typically + 4 to 6 s), under plain torchrun as under
  experiments.launch. A hung rank that obeys SIGTERM is stopped by
  torchrun; one that cannot, because it is a stopped process (SIGSTOP), is killed by the ranks on
  its host that named it (torchrun would wait 30 s for it). A rank stuck in the kernel
  (uninterruptible sleep) is left to torchrun.
* a rank hung before it reached the store (no pid to kill) or after the others have left
  (teardown): the others cannot reach it, so experiments.launch does (experiments.rank_watch): it
  kills a stopped rank as soon as another rank has ended, and an idle one ``parallel.timeout_s``
  later. Start-up's waits share one deadline, ``timeout_s`` in all, so they cannot add up.

A launch that cannot work (WORLD_SIZE differs from the config's world size, ``results_dir`` cannot
be written) exits with code 2 before any process group exists (:func:`check_launch`).

Fault injection for tests: ``MOE_BENCH_FAULT=SIGNAL@POINT:RANK`` makes rank RANK send itself SIGNAL
at POINT: ``start`` (before it reaches the store), ``init`` (connected to the store, before the
process group exists), ``work`` (start-up done, entering the measured work) or ``teardown`` (the
work done and rank 0's records written, leaving the process group): ``SIGSTOP@work:1`` hangs rank
1, ``SIGKILL@init:1`` kills it.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import psutil
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from moe_core.host.processes import BAD_LAUNCH_EXIT_CODE, FAILED_RANK_EXIT_CODE, RANK_HOSTS, started_at, status_of
from moe_core.records.results import ResultsDirError, check_writable

HEARTBEAT_S = 0.5  # a rank's heartbeat period
HEALTH_WINDOW_S = 3.0  # how long a rank that saw a failure watches the heartbeats (6 beats)
STORE_TIMEOUT_S = 5.0  # bounds each store operation of the health checks, should the store hang
FAULT_ENV = "MOE_BENCH_FAULT"
FAULT_POINTS = ("start", "init", "work", "teardown")
_health: Health | None = None  # this process's heartbeat, stopped by shutdown()


@dataclass(frozen=True)
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    health: Health | None  # None in a world of one
    timeout_s: float


def init_distributed(cfg: DictConfig, world_size_key: str = "parallel.world_size") -> Env:
    """Join the process group that ``torchrun`` (or SLURM) set up in the environment.

    Backend and device from ``cfg.hardware``; one device per LOCAL_RANK on GPU.
    ``parallel.timeout_s`` bounds every collective, so a hung or dead peer ends the run with an
    error instead of a hang. Exits with code 2, naming the problem, when the launch cannot work
    (:func:`check_launch`; ``world_size_key`` is the config key of the entry point's world size),
    and with FAILED_RANK_EXIT_CODE, naming the ranks that did not join, when start-up fails.
    """
    backend, device_type, timeout_s = cfg.hardware.backend, cfg.hardware.device, cfg.parallel.timeout_s
    check_launch(cfg, world_size_key)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("hardware.device is 'cuda' but torch sees no GPU; use hardware_profile=local-cpu")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(cpu_threads_per_rank())
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m ...` run: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return Env(0, 1, local_rank, device, backend, None, timeout_s)
    # Start-up waits (the store, the heartbeat's connection, the other ranks joining) share one
    # deadline, timeout_s from now, so that they cannot add up; collectives get timeout_s each.
    deadline = time.monotonic() + timeout_s
    inject_fault("start", int(os.environ["RANK"]))
    # The store first (as init_process_group would connect it), so that a rank that never joins
    # the group can be named.
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(_until(deadline))
    global _health
    health = _health = Health(rank, world_size, _until(deadline))
    inject_fault("init", rank)
    try:
        store.set_timeout(_until(deadline))
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("default_pg", store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    except RuntimeError as err:  # DistStoreError: some rank never registered before the deadline
        health.exit_naming_failed_ranks("could not start", err)
    store.set_timeout(timeout)
    RANK_HOSTS[:] = health.hosts()
    health.set_state("running")
    return Env(rank, world_size, local_rank, device, backend, health, timeout_s)


def _until(deadline: float) -> timedelta:
    """The time left before ``deadline`` (time.monotonic), at least a second: the shortest wait
    that still lets a store answer."""
    return timedelta(seconds=max(1.0, deadline - time.monotonic()))


def check_launch(cfg: DictConfig, world_size_key: str) -> None:
    """Refuse a launch that cannot work before any process group exists: exit 2 naming the problem.

    The world torchrun started (WORLD_SIZE) must be the config's ``world_size_key``, and rank 0,
    which writes the records, must be able to write ``results_dir`` (checked now rather than after
    the whole run). Rank 0 prints the error; every rank exits.
    """
    expected = OmegaConf.select(cfg, world_size_key)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    problem = None
    if world_size != expected:
        problem = (
            f"launched with WORLD_SIZE={world_size} ranks but the config says {world_size_key}={expected}; "
            f"launch {expected} ranks (torchrun --nproc-per-node={expected}) or set "
            f"{world_size_key}={world_size}"
        )
    elif rank == 0:
        try:
            check_writable(cfg.results_dir)
        except ResultsDirError as err:
            problem = str(err)
    if problem:
        if rank == 0:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(BAD_LAUNCH_EXIT_CODE)


def cpu_threads_per_rank() -> int:
    """Intra-op threads of one CPU rank: the host's cores shared by its local ranks.

    NOTE: Snakemake exports OMP_NUM_THREADS=<job threads> and torchrun passes it on, so 4 ranks of a
    2-core job would each start 2 threads; oversubscribed ranks spin against each other and step
    times grow several-fold. OMP_NUM_THREADS still caps the share when it is smaller.
    """
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return min(share, int(os.environ.get("OMP_NUM_THREADS", share)))


class Health:
    """This rank's heartbeat in the launcher's store, and, after a failure, a look at everyone's.

    Keys (under ``moe_bench/``): ``proc/<rank>`` = "<host> <pid> <start time>", ``beat/<rank>`` a
    counter the heartbeat thread raises every HEARTBEAT_S, ``state/<rank>`` = starting | running |
    failed.

    The store is torchrun's (its agent hosts it), so it outlives any rank. The heartbeat has a
    store client of its own: the main thread's client can be blocked for ``timeout_s`` in a store
    wait during start-up, and the heartbeat must not stop with it.
    """

    def __init__(self, rank: int, world_size: int, connect_timeout: timedelta):
        self.rank, self.world_size = rank, world_size
        client = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=connect_timeout
        )
        client.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        self.store = dist.PrefixStore("moe_bench", client)
        start_time = started_at(os.getpid()) or "?"  # tells a reused pid apart
        self.store.set(f"proc/{rank}", f"{socket.gethostname()} {os.getpid()} {start_time}")
        self.set_state("starting")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="moe-bench-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(f"beat/{self.rank}", 1)
            except RuntimeError:  # the store is gone: the launcher is stopping the run
                return
            self._stop.wait(HEARTBEAT_S)

    def set_state(self, state: str) -> None:
        self.store.set(f"state/{self.rank}", state)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * STORE_TIMEOUT_S)

    def unresponsive_ranks(self) -> tuple[dict[int, str], list[int]]:
        """The ranks that stopped, each with why, from HEALTH_WINDOW_S of watching their heartbeats,
        and the pids of those that are stopped processes on this host.

        A rank that never reached the store, or whose heartbeat did not advance, is named; failing
        that, the ranks that are alive but neither finished start-up nor reported a failure of
        their own (a rank hung in its own code, whose heartbeat thread still runs). Empty when
        every other rank saw the failure too: then it is local to this rank.
        """
        before = self._beats()
        time.sleep(HEALTH_WINDOW_S)
        after = self._beats()
        stopped, idle, stopped_pids = {}, {}, []
        for k in range(self.world_size):
            if k == self.rank:
                continue
            proc = self._get(f"proc/{k}")
            if proc is None:
                stopped[k] = "it never reached the launcher's store (it did not start, or hung before start-up)"
            elif after[k] == before[k]:
                what_os_says, stopped_pid = _process_state(proc, self.rank)
                stopped[k] = f"its heartbeat stopped: {what_os_says}"
                if stopped_pid:
                    stopped_pids.append(stopped_pid)
            else:
                state = self._get(f"state/{k}")
                if state == "starting":
                    idle[k] = "it is alive but has not finished start-up"
                elif state != "failed":
                    idle[k] = "it is alive but did not take part (hung in its own code, or waiting on another rank)"
        return stopped or idle, stopped_pids

    def exit_naming_failed_ranks(self, what: str, err: BaseException) -> NoReturn:
        """Print which ranks stopped (one line: ``error: rank R <what>: <err> | <diagnosis>``), kill
        those that are stopped processes on this host, and exit with FAILED_RANK_EXIT_CODE.

        NOTE: ``os._exit`` skips interpreter teardown on purpose: destroying a process group whose
        peer is hung can block forever.
        """
        culprits, stopped_pids = {}, []
        try:
            self.set_state("failed")
            culprits, stopped_pids = self.unresponsive_ranks()
            diagnosis = (
                "; ".join(f"rank {k} did not respond: {why}" for k, why in culprits.items())
                or "every other rank still responds, so the failure is local to this rank"
            )
        except RuntimeError as store_err:
            diagnosis = f"the launcher's store does not answer ({_first_line(store_err)}): cannot name the failed rank"
        if not culprits:
            traceback.print_exception(err, file=sys.stderr)
        print(f"error: rank {self.rank} {what}: {_first_line(err)} | {diagnosis}", file=sys.stderr, flush=True)
        for pid in stopped_pids:
            with suppress(ProcessLookupError):  # another rank may have killed it first
                os.kill(pid, signal.SIGKILL)
        os._exit(FAILED_RANK_EXIT_CODE)

    def hosts(self) -> list[str]:
        """The host of every rank, by rank, as each published it (``proc/<rank>``) before joining the
        group: once the group exists, every rank has."""
        return [self.store.get(f"proc/{k}").decode().split()[0] for k in range(self.world_size)]

    def _beats(self) -> list[int]:
        return [self.store.add(f"beat/{k}", 0) for k in range(self.world_size)]

    def _get(self, key: str) -> str | None:
        return self.store.get(key).decode() if self.store.check([key]) else None


def _process_state(proc: str, me: int) -> tuple[str, int | None]:
    """What the OS says of a rank's process (``proc`` = "<host> <pid> <start time>") when it runs on
    this host, and its pid when it is stopped (SIGSTOP), which :meth:`Health.exit_naming_failed_ranks`
    then kills: torchrun's SIGTERM cannot end a stopped process, and torchrun would wait 30 s."""
    host, pid, start_time = proc.split()
    if host != socket.gethostname():
        return f"its process {pid} runs on {host}", None
    status = status_of(int(pid), start_time)
    if status is None:
        return f"its process {pid} has exited", None
    if status == psutil.STATUS_STOPPED:
        return f"its process {pid} is stopped (SIGSTOP), so rank {me} kills it", int(pid)
    return {
        psutil.STATUS_TRACING_STOP: f"its process {pid} is stopped by a debugger",
        psutil.STATUS_DISK_SLEEP: f"its process {pid} is stuck in the kernel (uninterruptible sleep, e.g. I/O)",
    }.get(status, f"its process {pid} runs, but not its heartbeat thread"), None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


@contextmanager
def naming_failed_ranks(env: Env) -> Iterator[None]:
    """Turn a failed or timed-out collective into an exit that names the ranks that stopped.

    A dead peer shows up on the others as "Connection closed by peer", a hung one as a timeout
    after ``timeout_s``; neither names the culprit. Here the rank that caught the error names the
    ranks whose heartbeat stopped (Health.exit_naming_failed_ranks) and exits with
    FAILED_RANK_EXIT_CODE HEALTH_WINDOW_S later; when no other rank stopped, its own traceback is
    printed too. In a world of one the error propagates as it is.
    """
    inject_fault("work", env.rank)
    try:
        yield
    except RuntimeError as err:  # torch.distributed.DistError is one
        if env.health is None:
            raise
        env.health.exit_naming_failed_ranks("stopped", err)


def inject_fault(point: str, rank: int) -> None:
    """Test hook: under ``MOE_BENCH_FAULT=SIGNAL@POINT:RANK`` rank RANK sends itself SIGNAL at POINT."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, where = spec.partition("@")
    fault_point, _, fault_rank = where.partition(":")
    if name not in signal.Signals.__members__ or fault_point not in FAULT_POINTS or not fault_rank.isdigit():
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: expected SIGNAL@POINT:RANK with POINT one of {FAULT_POINTS}, e.g. SIGSTOP@work:1"
        )
    if fault_point == point and int(fault_rank) == rank:
        print(
            f"fault injection ({FAULT_ENV}={spec}): rank {rank} sends itself {name} at {point}, time {time.time():.3f}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.Signals[name])


def leave_together(env: Env) -> None:
    """Wait, after a successful run, until every rank is done (rank 0 writes the records meanwhile)
    before any rank tears its process group down.

    A rank that destroys its gloo process group while a peer still holds its connections open now
    and then aborts at exit ("terminate called without an active exception", SIGABRT) after it
    wrote its record: seen on the two-agent SLURM path, where rank 0 wrote while rank 1 had already
    left. Leaving together is what torch's own examples do before ``destroy_process_group``. A peer
    that fails here is named like one that fails at work.
    """
    if env.world_size == 1:
        return
    try:
        dist.barrier()
    except RuntimeError as err:
        env.health.exit_naming_failed_ranks("stopped before teardown", err)


def shutdown() -> None:
    """Stop the heartbeat and leave the process group (after a successful run). A rank that hangs
    here is found by the launcher (experiments.rank_watch), not by the others, which have left.

    Garbage is collected first. Queued collectives (``async_op=True``) leave gloo work objects that
    hold tensors, often inside reference cycles of modules and hooks; left to the interpreter's
    finalisation, their tensors are freed after Python has begun to shut down, and the process now
    and then aborts at exit ("terminate called without an active exception", SIGABRT) after it
    wrote its record (seen once in CI on a Lina policy; pytorch/pytorch#179291 describes the same
    path). Collected here, they go while the interpreter and the process groups are whole. The
    entry points then skip finalisation altogether (moe_core.host.processes.exit_process), where
    the abort still came now and then.
    """
    global _health
    if _health is not None:
        inject_fault("teardown", _health.rank)
        _health.stop()
        _health = None
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
