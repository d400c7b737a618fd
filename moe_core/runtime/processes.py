"""What the launcher (experiments/launch.py) and the ranks (moe_core.runtime.distributed) share about
processes: the exit codes a rank ends with, and what the OS says of a process (psutil). It imports
no torch, so the launcher starts in a fraction of a second.
"""

from __future__ import annotations

import psutil

FAILED_RANK_EXIT_CODE = 3  # a rank that named the ranks that stopped, and exited
BAD_LAUNCH_EXIT_CODE = 2  # as for a bad config: nothing was started
ENDED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # a process that has exited, not yet reaped or gone


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
