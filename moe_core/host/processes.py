"""What the launcher (experiments/launch.py) and the ranks (moe_core.runtime.distributed) share about
processes: the exit codes a rank ends with, how its process ends, and what the OS says of a process
(psutil). It imports no torch, so the launcher and the entry points' ``--help`` start in a fraction of
a second.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import psutil

FAILED_RANK_EXIT_CODE = 3  # a rank that named the ranks that stopped, and exited
BAD_LAUNCH_EXIT_CODE = 2  # as for a bad config: nothing was started
ENDED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # a process that has exited, not yet reaped or gone
# The host name of every rank of this process's group, by rank: filled at start-up by
# moe_core.runtime.distributed.init_distributed, so that a record (moe_core.records.results.environment)
# names every node a run spanned, not only rank 0's. Empty outside a process group.
RANK_HOSTS: list[str] = []


def start_stamp(create_time: float) -> str:
    """A process's start time (psutil's ``create_time``) as the text every side compares: it tells a
    reused pid apart."""
    return f"{create_time:.3f}"


def started_at(pid: int) -> str | None:
    """:func:`start_stamp` of ``pid``; None when there is no such process."""
    try:
        return start_stamp(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def status_of(pid: int, start: str) -> str | None:
    """psutil's status of the process ``pid`` that started at ``start`` (:func:`started_at`), or None
    when it has ended, or the pid now names another process."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = process.status()
            same = start_stamp(process.create_time()) == start
    except psutil.Error:
        return None
    return status if same and status not in ENDED else None


def exit_process(code: int | None) -> NoReturn:
    """End an entry point's process with ``code`` (None: 0, as ``sys.exit``) and skip the
    interpreter's finalisation: the entry points' runner (experiments/__main__.py) passes it what the
    entry point's ``run`` returned.

    By then everything a run keeps is done: its records written (atomically), their W&B runs
    finished, its process group left (moe_core.runtime.distributed.shutdown). Finalisation only
    frees what is left, in an order nobody controls (Python's objects, then torch's and gloo's C++
    statics), and there a rank now and then aborts ("terminate called without an active
    exception", SIGABRT) after its record is written, failing a finished run: seen in CI, on the
    two-agent SLURM path and in the default workflow (a GShard overlap point, 2026-12-05), each
    time with the ranks leaving together and collecting their garbage before teardown (shutdown)
    already in place. So the atexit handlers run (W&B's service, logging), the standard streams
    are flushed, and the process ends. A failure that raises still ends the ordinary way, with its
    traceback.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0 if code is None else code)
