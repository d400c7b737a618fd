"""What the launcher (experiments/launch.py) and the ranks (moe_core.runtime.distributed) share about
processes: the exit codes a rank ends with, and a process's state read from /proc. It imports no
torch, so the launcher starts in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

FAILED_RANK_EXIT_CODE = 3  # a rank that named the ranks that stopped, and exited
BAD_LAUNCH_EXIT_CODE = 2  # as for a bad config: nothing was started


def proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name: [0] the state, [1] the parent, [19]
    the start time; None when there is no such process (or no /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
