"""The launcher's watch over the ranks on its host: once one rank has ended, the others must follow.

The ranks find and name a peer that hangs *during* the work themselves (moe_core.runtime.distributed: their
collectives time out, they read the heartbeats). What they cannot cover is what comes after a rank
has left: a rank stopped (SIGSTOP) or hung at teardown, after the last collective, keeps torchrun
waiting forever, and a rank stopped before it reached the store keeps torchrun's stop of the
workers waiting its own 30 s (it only signals SIGTERM, which a stopped process never handles).
So the launcher, which outlives every rank, watches the rank processes of its torchrun agents
(their direct children, told apart by the ``RANK`` torchrun puts in their environment) and, once
any rank has ended:

* kills at once a rank that is a stopped process (SIGSTOP): it can never finish;
* kills a rank whose process tree (the rank and every process it started, e.g. W&B's service)
  used less than IDLE_CPU_SHARE of a core for ``timeout_s``: it is hung, not finishing its work
  (its heartbeat thread alone, or gloo's, uses far less; writing a record or W&B's files far more).

Each kill is named (:attr:`RankWatch.killed`), so that the launcher's last line says which rank
was stopped and when. Ranks on other hosts (a multi-node SLURM job) are out of sight: there
``srun --kill-on-bad-exit`` and the ranks' own timeouts are all there is.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field

import psutil

from moe_core.host.processes import start_stamp, status_of

IDLE_CPU_SHARE = 0.01  # below this share of one core a rank's process tree is idle, not finishing


@dataclass
class _Rank:
    pid: int
    start_time: str
    busy_cpu_s: float = -1.0  # CPU seconds of its process tree when it was last seen busy
    busy_at: float = 0.0  # and when that was


@dataclass
class RankWatch:
    """Watches the rank processes below the launcher's ``agents`` (pids of the torchrun processes)."""

    agents: list[int]
    timeout_s: float
    ranks: dict[int, _Rank] = field(default_factory=dict)
    first_end: tuple[int, float] | None = None  # (rank, when) of the first rank that ended
    killed: dict[int, str] = field(default_factory=dict)  # rank -> why the launcher killed it

    def poll(self, now: float | None = None) -> list[str]:
        """One look at the ranks; returns a line for each rank killed now."""
        now = time.monotonic() if now is None else now
        tree = process_tree()
        alive = self._alive_ranks(tree)
        for rank in self.ranks:
            if rank not in alive and self.first_end is None:
                self.first_end = (rank, now)
        for rank, (pid, start_time) in alive.items():
            if rank not in self.ranks or self.ranks[rank].pid != pid:
                self.ranks[rank] = _Rank(pid, start_time)
        if self.first_end is None:
            return []
        lines = []
        ended, since = self.first_end
        for rank, proc in sorted(self.ranks.items()):
            if rank not in alive or rank in self.killed:
                continue
            why = self._why_kill(rank, proc, ended, since, tree, now)
            if why:
                with suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                self.killed[rank] = why
                lines.append(f"error: rank {rank} (pid {proc.pid}) {why}; the launcher killed it")
        return lines

    def _why_kill(self, rank: int, proc: _Rank, ended: int, since: float, tree, now: float) -> str | None:
        status = status_of(proc.pid, proc.start_time)
        if status is None:
            return None
        if status == psutil.STATUS_STOPPED:
            return f"is a stopped process (SIGSTOP) and rank {ended} has ended, so it can never finish"
        cpu_s = sum(_cpu_seconds(pid) for pid in _subtree(proc.pid, tree))
        if proc.busy_cpu_s < 0 or cpu_s - proc.busy_cpu_s > IDLE_CPU_SHARE * (now - proc.busy_at):
            proc.busy_cpu_s, proc.busy_at = cpu_s, now
            return None
        if now - max(proc.busy_at, since) >= self.timeout_s:
            return (
                f"was idle for parallel.timeout_s={self.timeout_s:g} s after rank {ended} had ended "
                f"(hung, e.g. at teardown)"
            )
        return None

    def _alive_ranks(self, tree: dict[int, list[tuple[int, str]]]) -> dict[int, tuple[int, str]]:
        """rank -> (pid, start time) of the live rank processes: children of the agents with RANK set."""
        alive = {}
        for agent in self.agents:
            for pid, start_time in tree.get(agent, []):
                rank = _rank_of(pid)
                if rank is not None and status_of(pid, start_time) is not None:
                    alive[rank] = (pid, start_time)
        return alive


def process_tree() -> dict[int, list[tuple[int, str]]]:
    """parent pid -> [(pid, start stamp)] of every process."""
    children: dict[int, list[tuple[int, str]]] = {}
    for process in psutil.process_iter(["ppid", "create_time"]):
        info = process.info
        if info["ppid"] is not None and info["create_time"] is not None:
            children.setdefault(info["ppid"], []).append((process.pid, start_stamp(info["create_time"])))
    return children


def descendants(pid: int, tree: dict[int, list[tuple[int, str]]] | None = None) -> list[tuple[int, str]]:
    """``(pid, start time)`` of every process below ``pid``."""
    tree = process_tree() if tree is None else tree
    found, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _subtree(pid: int, tree) -> list[int]:
    return [pid, *(child for child, _ in descendants(pid, tree))]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def _rank_of(pid: int) -> int | None:
    """The RANK in ``pid``'s environment (torchrun sets it for each worker), or None."""
    try:
        value = psutil.Process(pid).environ().get("RANK", "")
    except psutil.Error:
        return None
    return int(value) if value.isdigit() else None
