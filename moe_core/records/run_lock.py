"""One workflow run per results directory at a time.

Snakemake locks its working directory (``.snakemake/locks``), not the results directory: two
checkouts, or two working directories, running the workflow on one ``results_dir`` would measure the
same points at once, each contending with the other for the cores, and the last to write a record
would win. The workflow takes this lock when it starts its jobs (the ``onstart`` handler in
experiments/rules/common.smk) and holds it until its process ends; a second run on the same
``results_dir`` then stops before its first job, naming the run that holds it.

The lock is ``flock`` on ``<results_dir>/.run.lock``, whose text names the holder (pid, host,
working directory, start time). The kernel releases it when the holder ends, however it ends
(SIGKILL, a crash; on NFS, when the client's lease lapses), so the lock of a run that is gone is
taken over by the next without anything to clean up. The jobs of the run inherit nothing of it
(Python opens files non-inheritable), so a job killed or left behind never holds it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from moe_core.records.results import ResultsDirError, check_writable

LOCK_NAME = ".run.lock"
_held: dict[Path, TextIO] = {}  # the locks this process holds, open until it ends


class ResultsDirInUse(ResultsDirError):
    """Another workflow run holds the results directory's lock; the message names it."""


def lock_results_dir(results_dir: str | Path) -> None:
    """Take ``results_dir``'s run lock for the rest of this process (again: nothing to do), or raise
    ResultsDirInUse naming the run that holds it and what to do. Where the file system has no
    ``flock``, warn and go on unlocked: refusing every run there would stop legitimate ones too."""
    path = (check_writable(results_dir) / LOCK_NAME).resolve()
    if path in _held:
        return
    handle = open(path, "a+")  # noqa: SIM115  (kept open: the lock lasts as long as the file is open)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another workflow run"
        handle.close()
        raise ResultsDirInUse(
            f"results_dir '{results_dir}' is in use by {holder}: wait for that run to end or stop it, "
            f"or set results_dir=<another directory>"
        ) from None
    except OSError as err:
        handle.close()
        print(f"warning: cannot lock results_dir '{results_dir}' ({err}): runs on it are not locked", file=sys.stderr)
        return
    handle.seek(0)
    handle.truncate()
    handle.write(_holder())
    handle.flush()
    _held[path] = handle


def _holder() -> str:
    """This process, as a run that finds the lock taken reads it."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return f"the workflow run of pid {os.getpid()} on {socket.gethostname()} (in {os.getcwd()}, since {started})"
